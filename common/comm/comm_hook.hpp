// How one gradient bucket is reduced, as a replaceable function: the shape of PyTorch's
// DistributedDataParallel.register_comm_hook, whose default hooks live apart from the reducer
// (torch.distributed.algorithms.ddp_comm_hooks). The default all-reduces the bucket and divides by the
// world size; a hook may send fewer bytes instead (fp16, bf16) or do more per bucket.
#pragma once

#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dp {

/// What a communication hook launched for one bucket: the collective in flight and what to do once it
/// completed. The bucketed reducer calls wait() when it finishes the step; afterwards the bucket must
/// hold the average over ranks of every rank's bucket, in the bucket's own dtype (fp32).
struct BucketWork {
  Work work;                   ///< the collective in flight (invalid: nothing was launched)
  std::function<void()> then;  ///< runs after work completed, on the waiting thread (divide, cast back)
  int64_t wire_bytes = 0;      ///< bytes of the tensor handed to the collective (per rank, per call)
  /// Waits for the collective, then runs `then` (once). Throws what Work::wait() throws.
  void wait();
};

/// A communication hook: starts the reduction of one bucket and returns at once. `bucket` is the flat
/// gradient buffer of this rank ([n] elements, fp32 in this project), `label` names the collective in
/// traces. Called on autograd's thread during backward, in bucket-index order, on every rank with
/// buckets of the same sizes: every rank must issue the same collectives. It may capture state (what
/// PyTorch passes as `state`).
using CommHook = std::function<BucketWork(ProcessGroup& pg, torch::Tensor& bucket, const std::string& label)>;

/// The default: all-reduce the bucket in place (sum) and divide by the world size once it arrived.
CommHook allreduce_hook();

}  // namespace dp
