#include "extensions/07c_low_byte/low_byte_fsdp.hpp"

#include "common/base/errors.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace dp {

std::string LowByteFsdpOptions::name() const {
  return fmt::format("{} {}, gradients {}", zero1 ? "ZeRO-1, weights" : "weights", gather.name(), scatter.name());
}

LowByteFsdp::LowByteFsdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const ModuleUnits& units,
                         FsdpOptions opts, LowByteFsdpOptions low)
    : Fsdp(pg, std::move(model), units, opts), pg_(pg), low_(std::move(low)) {}

// [seams]
Work LowByteFsdp::gather_unit(size_t u, const torch::Tensor& shard, torch::Tensor& full) {
  if (low_.gather.format == WireFormat::fp32) return Fsdp::gather_unit(u, shard, full);  // the stage's own
  count_sent(double(pg_.world_size() - 1) * chunk_wire_bytes(low_.gather, shard.numel()));
  return low_byte_all_gather_async(pg_, shard, full, low_.gather, fmt::format("gather unit {}", u));
}

ReduceScatterWork LowByteFsdp::reduce_scatter_unit(size_t u, torch::Tensor& flat, torch::Tensor& out) {
  if (low_.scatter.wire.format == WireFormat::fp32) return Fsdp::reduce_scatter_unit(u, flat, out);
  count_sent(double(pg_.world_size() - 1) * chunk_wire_bytes(low_.scatter.wire, out.numel()));
  return low_byte_reduce_scatter_async(pg_, flat, out, low_.scatter, fmt::format("reduce-scatter unit {}", u));
}
// [seams]

std::vector<std::string> low_byte_gather_names() { return {"fp32", "bf16", "fp16", "int8", "zero1"}; }

std::vector<std::string> low_byte_scatter_names() {
  return {"fp32", "bf16", "fp16", "int8", "bf16-lowsum", "fp16-lowsum"};
}

LowByteFsdpOptions parse_low_byte_variant(const std::string& name, int64_t block) {
  const auto slash = name.find('/');
  const auto gathers = low_byte_gather_names(), scatters = low_byte_scatter_names();
  const std::string g = name.substr(0, slash), s = slash == std::string::npos ? "" : name.substr(slash + 1);
  if (slash == std::string::npos || std::find(gathers.begin(), gathers.end(), g) == gathers.end() ||
      std::find(scatters.begin(), scatters.end(), s) == scatters.end())
    throw UsageError(fmt::format(
        "variant '{}': name it WEIGHTS/GRADIENTS, the weights' wire one of {} and the gradients' one of {} (as in "
        "fp32/fp32, int8/int8)",
        name, fmt::join(gathers, ", "), fmt::join(scatters, ", ")));
  LowByteFsdpOptions o;
  o.zero1 = g == "zero1";
  o.gather = parse_wire_format(o.zero1 ? "fp32" : g, block);
  const bool low_sum = s.size() > 7 && s.substr(s.size() - 7) == "-lowsum";
  o.scatter.wire = parse_wire_format(low_sum ? s.substr(0, s.size() - 7) : s, block);
  o.scatter.sum = low_sum ? SumIn::wire : SumIn::fp32;
  return o;
}

MakeStrategy low_byte_fsdp_strategy(FsdpOptions opts, LowByteFsdpOptions low) {
  if (low.zero1)
    return zero1_strategy(low.scatter.wire.format == WireFormat::fp32 ? ReduceScatterHow{}
                                                                      : low_byte_reduce_scatter_how(low.scatter));
  return fsdp_strategy(opts,
                       [low](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const ModuleUnits& units,
                             FsdpOptions o) -> std::unique_ptr<Fsdp> {
                         return std::make_unique<LowByteFsdp>(pg, std::move(model), units, o, low);
                       });
}

}  // namespace dp
