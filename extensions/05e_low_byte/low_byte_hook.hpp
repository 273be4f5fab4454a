// Extension 05e, on stage 05: buckets that cost fewer bytes. Stage 05's seam is register_comm_hook(): a hook
// decides how one bucket is reduced. Extension 05a's fp16 hook halves the bytes but lets the backend add the
// ranks' gradients in fp16, so its error grows with the number of ranks. Here the bytes travel as bf16, fp16 or
// block-scaled int8 and every addition is done in fp32 (common/comm/low_byte_hook.hpp over low_byte.hpp: an all-to-all
// of encoded pieces, a local fp32 average, an all-gather of the encoded averages); PowerSGD (powersgd.hpp) sends a
// low-rank approximation instead. make_low_byte_hook() builds any of them by name for the program and its tests.
#pragma once

#include "common/comm/comm_hook.hpp"
#include "common/comm/low_byte.hpp"
#include "common/comm/low_byte_hook.hpp"  // LowByteHook: the rounding hooks
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
  /// PowerSGD: steps of plain fp32 all-reduce before it starts (PyTorch's start_powerSGD_iter): the first
  /// gradients change fast, and a low-rank summary of them with a random first Q loses most of them.
  int powersgd_start = 0;
  uint64_t seed = 0;  ///< PowerSGD's first Q
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
