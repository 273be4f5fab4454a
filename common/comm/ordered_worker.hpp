// A thread of its own that runs jobs one at a time, in the order they were submitted: what a communication hook
// needs when one bucket's reduction is several collectives in a row (each waiting for the one before) and the
// thread that submits it, autograd's, must go on with backward meanwhile. Every rank submits the same jobs in the
// same order, so the workers' collectives match across ranks.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

namespace dp {

/// Runs submitted jobs on one worker thread, first in first out.
class OrderedWorker {
 public:
  OrderedWorker();
  /// Fails the jobs still queued (their futures throw std::runtime_error), lets the running one finish (a
  /// collective cannot be abandoned halfway), and joins the thread.
  ~OrderedWorker();
  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;

  /// Queues `job` and returns at once; the future becomes ready when it ran, or holds what it threw. After one
  /// job threw, every job queued or submitted later fails with that same exception without running: the
  /// ranks' sequences of collectives no longer match, so no further one may start. `what` names the job in
  /// the message of a job failed by the destructor.
  std::shared_future<void> submit(std::function<void()> job, const std::string& what);

 private:
  struct Job {
    std::function<void()> run;
    std::string what;
    std::promise<void> done;
  };
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_ = false;
  std::exception_ptr failed_;  // the first job's failure, touched by the worker alone
  std::thread thread_;         // last: it starts once every member it uses exists
};

}  // namespace dp
