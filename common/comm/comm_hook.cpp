#include "common/comm/comm_hook.hpp"

namespace dp {

void BucketWork::wait() {
  work.wait();
  if (then) {
    auto f = std::move(then);
    then = nullptr;  // once: a second wait() finds nothing left to do
    f();
  }
}

CommHook allreduce_hook() {
  // [default_hook]
  return [](ProcessGroup& pg, torch::Tensor& bucket, const std::string& label) {
    BucketWork w;
    w.work = pg.all_reduce_async(bucket, label);  // in place: the bucket becomes the sum over ranks
    w.wire_bytes = bucket.numel() * static_cast<int64_t>(bucket.element_size());
    const int world = pg.world_size();
    w.then = [bucket, world]() mutable { bucket.div_(world); };  // one division per bucket
    return w;
  };
  // [default_hook]
}

}  // namespace dp
