// Internal to common/ (dist.cpp uses it; no stage does): Gloo's all-to-all as point-to-point exchanges
// that go on the wire one at a time, in the order they were issued.
//
// Why one at a time: FSDP issues the gather of the unit it needs now and, right after, the prefetch of
// the next one; the first should be done first. Posted together, the second exchange's messages to one
// peer can go out before the first one's messages to another, on the same link. Every rank issues its
// collectives in the same order, so every rank's queue pairs up with its peers'.
// Why a thread: Gloo's send and receive handles report completion only once somebody waits on them. The
// thread waits at once, so a handle (and the timeline) says "done" when the data is there.
#pragma once

#include "common/base/c10d_compat.hpp"

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace dp::detail {

/// Receives are posted when an exchange is queued; a worker thread posts its sends, waits for all of
/// its messages, then posts the next exchange's sends. An exchange that fails fails every one queued behind it with the
/// same error (they would each wait out the timeout otherwise).
class ExchangeQueue {
 public:
  ExchangeQueue(compat::CommPtr comm, int rank, int world_size);
  /// Lets the exchange on the wire finish (or time out), fails the queued ones, joins the thread.
  ~ExchangeQueue();
  ExchangeQueue(const ExchangeQueue&) = delete;
  ExchangeQueue& operator=(const ExchangeQueue&) = delete;

  /// Queues the exchange of `in`'s world_size equal row-chunks: chunk p goes to rank p, and rank p's
  /// chunk r arrives in `out`'s chunk p (this rank's own chunk is copied now). `on_done` runs on the
  /// worker thread when the exchange has finished, failed or not. Returns a handle whose wait() rethrows
  /// the exchange's error.
  compat::WorkPtr post(at::Tensor out, at::Tensor in, std::function<void()> on_done);

  struct Item;  ///< one exchange: its tensors and the state its handle waits on (exchange.cpp)

 private:
  void run();

  compat::CommPtr comm_;
  const int rank_, world_;
  int tags_ = 0;  // every exchange has tags of its own, so two between the same ranks cannot mix
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Item>> queue_;
  bool stopping_ = false;
  std::exception_ptr failed_;  // the first error: later exchanges fail with it at once
  std::thread thread_;         // started by the first post()
};

}  // namespace dp::detail
