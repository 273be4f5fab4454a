// One worker thread, jobs in submission order, the first failure failing every later job.
#include "common/comm/ordered_worker.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace dp {

OrderedWorker::OrderedWorker() : thread_([this] { loop(); }) {}

OrderedWorker::~OrderedWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (Job& job : queue_)
      job.done.set_exception(std::make_exception_ptr(
          std::runtime_error(fmt::format("{} was still queued when its worker was destroyed", job.what))));
    queue_.clear();
  }
  cv_.notify_one();
  thread_.join();
}

std::shared_future<void> OrderedWorker::submit(std::function<void()> job, const std::string& what) {
  Job j{std::move(job), what, {}};
  std::shared_future<void> done = j.done.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(j));
  }
  cv_.notify_one();
  return done;
}

void OrderedWorker::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;  // the destructor failed what was queued
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      if (failed_) std::rethrow_exception(failed_);
      job.run();
      job.done.set_value();
    } catch (...) {
      failed_ = std::current_exception();
      job.done.set_exception(failed_);
    }
  }
}

}  // namespace dp
