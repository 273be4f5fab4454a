// A bucket's all-reduce in fewer bytes, as a communication hook: a LowByteAllReduce (low_byte.hpp: a low-precision
// wire, every sum in fp32) run on a worker thread of its own, so that autograd's thread goes on while the two
// collectives of a bucket travel. Extension 05e names it among its hooks; extension 08a trains the capstone with it.
#pragma once

#include "common/comm/comm_hook.hpp"
#include "common/comm/low_byte.hpp"
#include "common/comm/ordered_worker.hpp"
#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dp {

/// A bucket reduced by a LowByteAllReduce on a worker thread of its own: two collectives in a row (the all-to-all,
/// then the all-gather, with the fp32 average between them) while autograd's thread goes on.
class LowByteHook {
 public:
  /// `pg` must outlive this object.
  LowByteHook(ProcessGroup& pg, LowByteOptions opts) : reduce_(pg, std::move(opts)) {}
  /// Queues `bucket` (fp32, contiguous, untouched until wait()) and returns at once; wait() blocks until it
  /// holds the average over the ranks and rethrows what the worker caught.
  BucketWork launch(torch::Tensor& bucket, const std::string& label);
  /// Bytes sent since construction (LowByteLayout::sent_bytes per bucket): read it between steps.
  int64_t sent_bytes() const { return reduce_.sent_bytes(); }
  const LowByteOptions& options() const { return reduce_.options(); }

 private:
  LowByteAllReduce reduce_;  // used by the worker alone
  OrderedWorker worker_;     // last: destroyed first, its running bucket finished, before what it uses goes
};

/// The hook over `state` (shared: copies of the hook use the same worker).
CommHook low_byte_hook(std::shared_ptr<LowByteHook> state);

/// The check a program runs before it trains with `opts`: on buffers of each of `sizes` values, drawn alike on every
/// rank (rank k's N(0, 1) x (k + 1), from `seed`), the collective equals low_byte_average() bit for bit and, with fp32
/// sums, lies within low_byte_bound() of the exact average. Throws dp::CheckFailed naming `what` otherwise.
void check_low_byte_all_reduce(ProcessGroup& pg, const LowByteOptions& opts, const std::vector<int64_t>& sizes,
                               const std::string& what, uint64_t seed = 0);

}  // namespace dp
