// The ring collectives, written with point-to-point sends and receives only: what Gloo's and NCCL's
// reduce-scatter, all-gather and all-reduce do inside (for large tensors), so that the bus-bandwidth formula
// of stage 01 is something you have built, not only measured. And CS336's "alternate" ring all-reduce, which
// passes the whole original tensors around instead, to compare with.
#pragma once

#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <string>

namespace dp {

/// The ring reduce-scatter, in place: `t` (contiguous) is cut into W chunks (sizes differ by at most one
/// element); in W-1 steps every rank sends one chunk to rank r+1 and adds the chunk it receives from rank
/// r-1. After it, chunk r of rank r holds the sum of every rank's chunk r (the other chunks hold partial
/// sums). Each rank sends (W-1)/W of the tensor's bytes. A collective: every rank calls it.
void ring_reduce_scatter(ProcessGroup& pg, torch::Tensor& t);

/// The ring all-gather, in place: chunk r of rank r (cut as ring_reduce_scatter() cuts) travels around
/// the ring in W-1 steps; after it every rank's chunk c is rank c's chunk c. Each rank sends (W-1)/W of the
/// tensor's bytes. A collective.
void ring_all_gather(ProcessGroup& pg, torch::Tensor& t);

/// In-place sum of `t` (contiguous) over the ranks: ring_reduce_scatter() then ring_all_gather(). Each
/// rank sends 2(W-1)/W of the tensor's bytes, the formula behind bus bandwidth. A collective.
void ring_all_reduce(ProcessGroup& pg, torch::Tensor& t);

/// In-place sum of `t` by passing every rank's whole original tensor around the ring: in W-1 steps each
/// rank sends the tensor it received last (its own first) to rank r+1 and adds the one it receives. The
/// same sum in W-1 steps instead of 2(W-1), but each rank sends W-1 whole tensors, not 2(W-1)/W of one.
/// A collective.
void alternate_ring_all_reduce(ProcessGroup& pg, torch::Tensor& t);

/// The collectives of this file, for ring_seconds() and the benchmark.
enum class Ring { kReduceScatter, kAllGather, kAllReduce, kAlternate };
/// "reduce_scatter", "all_gather", "all_reduce", "alternate".
std::string ring_name(Ring c);

/// The time one call of `c` takes on `world` ranks for a tensor of `bytes`, when each rank's link sends
/// `rate` bytes/s (and receives as much at once) and every step of the ring costs `step_latency` seconds
/// on top of its bytes: steps x (step_latency + bytes one rank sends in a step / rate).
double ring_seconds(Ring c, int world, double bytes, double rate, double step_latency);

/// Why a ring all-reduce's `result` is not the sum of every rank's `input` (both this rank's, same shape),
/// as a named hint: [ring-no-all-gather] when chunk r holds its sum and others do not,
/// [ring-copied-not-added] when every chunk holds one rank's values instead of a sum,
/// [ring-nothing-received] when the result is the input; "" when it is the sum or none of these. A
/// collective (it gathers the inputs): every rank calls it.
std::string ring_mismatch_hint(ProcessGroup& pg, const torch::Tensor& input, const torch::Tensor& result);

}  // namespace dp
