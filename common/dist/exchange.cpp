// Gloo's all-to-all as point-to-point exchanges, one on the wire at a time (common/dist/exchange.hpp says why).
#include "common/dist/exchange.hpp"

#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>

#include <stdexcept>

namespace dp::detail {

// The shared state of one exchange: the worker thread fills it, the caller's handle waits on it.
struct ExchangeQueue::Item {
  at::Tensor out, in;
  at::Tensor device_out;  // a CUDA tensor's exchange: `out` and `in` are host copies, this the caller's
  int tag = 0;
  std::vector<compat::WorkPtr> recvs;  // posted by post(), so that a peer ahead of us can send at once
  std::function<void()> on_done;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      error = std::move(e);
    }
    cv.notify_all();
    if (on_done) on_done();
  }
};

namespace {

// The caller's handle: complete when the worker thread has finished the exchange.
class QueuedExchangeWork : public c10d::Work {
 public:
  explicit QueuedExchangeWork(std::shared_ptr<ExchangeQueue::Item> item) : item_(std::move(item)) {}
  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(item_->mutex);
    return item_->done;
  }
  // No deadline of its own: every part waits at most Gloo's timeout, and a failure fails the rest.
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    std::unique_lock<std::mutex> lock(item_->mutex);
    item_->cv.wait(lock, [&] { return item_->done; });
    if (item_->error) std::rethrow_exception(item_->error);
    return true;
  }

 private:
  std::shared_ptr<ExchangeQueue::Item> item_;
};

}  // namespace

ExchangeQueue::ExchangeQueue(compat::CommPtr comm, int rank, int world_size)
    : comm_(std::move(comm)), rank_(rank), world_(world_size) {}

ExchangeQueue::~ExchangeQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

compat::WorkPtr ExchangeQueue::post(at::Tensor out, at::Tensor in, std::function<void()> on_done) {
  const int64_t c = in.size(0) / world_;
  out.narrow(0, rank_ * c, c).copy_(in.narrow(0, rank_ * c, c));  // my own piece stays here
  auto item = std::make_shared<Item>();
  if (in.is_cuda()) {
    // Gloo's send and recv move host memory only: a CUDA tensor goes out from a host copy (taken now, in
    // the caller's stream order) and comes in to a host buffer that is copied to the device once every
    // piece arrived (run()), before the caller's wait() returns.
    item->device_out = std::move(out);
    item->in = in.cpu();
    item->out = at::empty_like(item->in);
  } else {
    item->out = std::move(out);
    item->in = std::move(in);
  }
  item->on_done = std::move(on_done);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    item->tag = 1 + tags_++ % (1 << 20);
    // Receives are posted now: they take no bandwidth, and a peer that is done with the exchange before
    // this one finds them posted and sends at once.
    for (int i = 1; i < world_; ++i) {  // from rank - i
      const int peer = (rank_ - i + world_) % world_;
      std::vector<at::Tensor> v{item->out.narrow(0, peer * c, c)};
      item->recvs.push_back(comm_->recv(v, peer, item->tag));
    }
    queue_.push_back(item);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  cv_.notify_all();
  return c10::make_intrusive<QueuedExchangeWork>(item);
}

void ExchangeQueue::run() {
  for (;;) {
    std::shared_ptr<Item> item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      item = queue_.front();
      queue_.pop_front();
      if (stopping_ && !failed_)
        failed_ = std::make_exception_ptr(std::runtime_error("the process group was shut down first"));
    }
    if (failed_) {  // read and written by this thread only, once the queue is stopping or failed
      item->finish(failed_);
      continue;
    }
    // [exchange]
    // Every send posted (the receives already are), all in flight at once; the next exchange waits for
    // them all.
    const int64_t c = item->in.size(0) / world_;
    std::exception_ptr error;
    try {
      std::vector<compat::WorkPtr> parts = item->recvs;
      for (int i = 1; i < world_; ++i) {  // to rank + i
        const int peer = (rank_ + i) % world_;
        std::vector<at::Tensor> v{item->in.narrow(0, peer * c, c)};
        parts.push_back(comm_->send(v, peer, item->tag));
      }
      for (auto& p : parts) p->wait();   // Gloo's own timeout applies to each
      if (item->device_out.defined()) {  // a CUDA tensor's pieces: host buffer -> device (synchronous copy)
        c10::DeviceGuard on(item->device_out.device());
        for (int i = 1; i < world_; ++i) {
          const int peer = (rank_ - i + world_) % world_;
          item->device_out.narrow(0, peer * c, c).copy_(item->out.narrow(0, peer * c, c));
        }
      }
    } catch (...) {
      error = std::current_exception();
      failed_ = error;
    }
    item->finish(error);  // wakes the caller's wait() and records the completion in the timeline
    // [exchange]
  }
}

}  // namespace dp::detail
