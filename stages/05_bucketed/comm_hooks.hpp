// Stage 05: communication hooks, the shape of PyTorch's DistributedDataParallel.register_comm_hook. A hook
// replaces "all-reduce the bucket, divide by the world size": the default hook does exactly that; the
// fp16 hook sends the bucket as float16, half the bytes on the wire, at the cost of rounding every
// gradient to 11 significant bits.
#pragma once

#include "common/dist.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dp {

/// What a communication hook launched for one bucket: the collective in flight and what to do once it
/// completed. BucketedDdp calls wait() in finish_gradient_synchronization(); afterwards the bucket must
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
/// Bit-identical to stage 05 without hooks.
CommHook allreduce_hook();

/// Compression to a 16-bit float type `dtype` (torch::kHalf or torch::kBFloat16): cast the bucket to
/// `dtype` (a new [n] tensor, half the bytes), all-reduce it (the backend sums in `dtype`), cast the sum
/// back into the fp32 bucket and divide there. The division is in fp32 after the cast, not in 16 bits
/// before it: one rounding fewer, and exact for any world size a power of two. (PyTorch's
/// fp16_compress_hook divides first, in fp16, to keep the sum below fp16's largest value 65504; a
/// gradient sum that large overflows to inf here. Gradients of that size mean training is lost anyway.)
/// Does not check that the backend can sum `dtype`: make_comm_hook() does.
CommHook low_precision_hook(torch::ScalarType dtype);

/// Names make_comm_hook() accepts: "allreduce", "fp16", "bf16".
std::vector<std::string> comm_hook_names();

/// True when `pg`'s backend sums tensors of `dtype`: all-reduces a one-element tensor of ones and checks
/// the sum is the world size. Found out by running it, because the answer depends on the backend and the
/// LibTorch release (Gloo sums fp16 in 1.13 and 2.x, bf16 only in 2.x; NCCL sums both). Collective.
bool backend_sums(ProcessGroup& pg, torch::ScalarType dtype);

/// The hook called `name` (see comm_hook_names()). Throws dp::UsageError naming the value and the
/// choices for an unknown name, or naming the backend when it cannot sum the hook's dtype (bf16 on
/// Gloo in LibTorch 1.13). Collective for "fp16" and "bf16" (it probes the backend): call it on every rank.
CommHook make_comm_hook(const std::string& name, ProcessGroup& pg);

}  // namespace dp
