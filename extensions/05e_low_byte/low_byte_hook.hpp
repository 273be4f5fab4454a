// Extension 05e, on stage 05: buckets that cost fewer bytes. Stage 05's seam is register_comm_hook(): a hook
// decides how one bucket is reduced. Extension 05a's fp16 hook halves the bytes but lets the backend add the
// ranks' gradients in fp16, so its error grows with the number of ranks. Here the bytes travel as bf16, fp16 or
// block-scaled int8 and every addition is done in fp32 (common/comm/low_byte.hpp: an all-to-all of encoded
// pieces, a local fp32 average, an all-gather of the encoded averages); PowerSGD (powersgd.hpp) sends a low-rank
// approximation instead. make_low_byte_hook() builds any of them by name for the program and its tests.
#pragma once

#include "common/comm/comm_hook.hpp"
#include "common/comm/low_byte.hpp"
#include "common/comm/ordered_worker.hpp"
#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dp {

class BucketedDdp;

/// Stage 05's bucket reduced by a LowByteAllReduce on a worker thread of its own: two collectives in a row (the
/// all-to-all, then the all-gather, with the fp32 average between them) while autograd's thread goes on.
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

/// What the program's --hooks and the tests name: "fp32" (stage 05's all-reduce), "fp16-allreduce" (extension 05a:
/// fp16 on the wire, summed in fp16 by the backend), "bf16", "fp16", "int8" (that wire, fp32 sums),
/// "bf16-lowsum", "fp16-lowsum" (that wire summed in 16 bits on the all-to-all path: the mistake, measured),
/// "powersgd" (rank from the options).
std::vector<std::string> low_byte_hook_names();

/// Throws dp::UsageError naming `name` and the choices unless it is one of low_byte_hook_names().
void check_low_byte_hook_name(const std::string& name);

/// The wire and the sums of a rounding hook ("bf16", "fp16", "int8" with `block` values per scale, "bf16-lowsum",
/// "fp16-lowsum"); std::nullopt for the others ("fp32", "fp16-allreduce", "powersgd"). `name` is checked first.
std::optional<LowByteOptions> rounding_hook_options(const std::string& name, int64_t block);

/// How make_low_byte_hook() builds a hook.
struct LowByteHookOptions {
  int64_t block = 256;    ///< int8: values per scale
  int powersgd_rank = 4;  ///< PowerSGD's r
  uint64_t seed = 0;      ///< PowerSGD's first Q
};

/// A hook by name, and the bytes it sent since it was made (read between steps). `ddp` gives PowerSGD its
/// buckets' shapes (register the hook on that same object).
struct NamedHook {
  CommHook hook;
  std::function<int64_t()> sent_bytes;
};

/// Builds the hook `name` (low_byte_hook_names()) for `ddp` on `pg`. Throws dp::UsageError naming the value and
/// the choices for an unknown name, and what PowerSgd and parse_wire_format() refuse.
NamedHook make_low_byte_hook(const std::string& name, ProcessGroup& pg, const BucketedDdp& ddp,
                             const LowByteHookOptions& opts);

}  // namespace dp
