// Extension 05a, on stage 05: communication hooks that send fewer bytes. Stage 05's seam is
// BucketedDdp::register_comm_hook(): a hook decides how one bucket is reduced. Here a bucket is sent as
// float16 (or bfloat16): half the bytes on the wire, at the cost of rounding every gradient to 11 (8)
// significant bits. PyTorch's fp16_compress_hook and bf16_compress_hook.
#pragma once

#include "common/comm/comm_hook.hpp"
#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <string>
#include <vector>

namespace dp {

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
