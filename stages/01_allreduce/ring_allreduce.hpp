// The ring all-reduce, written with point-to-point sends and receives only: what Gloo's and NCCL's
// all_reduce do inside (for large tensors), so that the bus-bandwidth formula of stage 01 is something
// you have built, not only measured.
#pragma once

#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

namespace dp {

/// In-place sum of `t` (contiguous) over the ranks of `pg`, by the ring: the tensor is cut into W chunks
/// (sizes differ by at most one element); in W-1 reduce-scatter steps every rank sends one chunk to rank
/// r+1 and adds the chunk it receives from rank r-1, after which rank r holds the whole sum of chunk
/// (r+1) mod W; in W-1 all-gather steps the summed chunks travel on around the ring. Each rank sends
/// 2(W-1)/W of the tensor's bytes, the formula behind bus bandwidth. A collective: every rank calls it.
void ring_all_reduce(ProcessGroup& pg, torch::Tensor& t);

/// Why a ring's `result` is not the sum of every rank's `input` (both this rank's, same shape), as a named
/// hint: [ring-no-all-gather] when chunk (r+1) mod W holds its sum and others do not, [ring-copied-not-added] when
/// every chunk holds one rank's values instead of a sum, [ring-nothing-received] when the result is the
/// input; "" when it is the sum or none of these. A collective (it gathers the inputs): every rank calls it.
std::string ring_mismatch_hint(ProcessGroup& pg, const torch::Tensor& input, const torch::Tensor& result);

}  // namespace dp
