#include "extensions/05e_low_byte/low_byte_hook.hpp"

#include "common/base/errors.hpp"
#include "extensions/05a_comm_hooks/low_precision_hooks.hpp"
#include "extensions/05e_low_byte/powersgd.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>

namespace dp {

std::vector<std::string> low_byte_hook_names() {
  return {"fp32", "fp16-allreduce", "bf16", "fp16", "int8", "bf16-lowsum", "fp16-lowsum", "powersgd"};
}

namespace {

// A ring all-reduce of `wire_bytes` sends 2 (W - 1) / W of them from each rank.
int64_t ring_bytes(int64_t wire_bytes, int world) { return 2 * int64_t{world - 1} * wire_bytes / world; }

// `hook`, adding to *sent what a ring all-reduce of each call's BucketWork::wire_bytes sends.
CommHook counted_ring(CommHook hook, std::shared_ptr<std::atomic<int64_t>> sent) {
  return [hook, sent](ProcessGroup& pg, torch::Tensor& bucket, const std::string& label) {
    auto w = hook(pg, bucket, label);
    *sent += ring_bytes(w.wire_bytes, pg.world_size());
    return w;
  };
}

}  // namespace

void check_low_byte_hook_name(const std::string& name) {
  const auto names = low_byte_hook_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw UsageError(fmt::format("unknown communication hook '{}': use {}", name, fmt::join(names, ", ")));
}

std::optional<LowByteOptions> rounding_hook_options(const std::string& name, int64_t block) {
  check_low_byte_hook_name(name);
  if (name == "fp32" || name == "fp16-allreduce" || name == "powersgd") return std::nullopt;
  const bool in_wire = name == "bf16-lowsum" || name == "fp16-lowsum";
  return LowByteOptions{parse_wire_format(name.substr(0, 4), block), in_wire ? SumIn::wire : SumIn::fp32};
}

NamedHook make_low_byte_hook(const std::string& name, ProcessGroup& pg, const BucketedDdp& ddp,
                             const LowByteHookOptions& opts) {
  check_low_byte_hook_name(name);
  auto sent = std::make_shared<std::atomic<int64_t>>(0);
  auto read = [sent] { return sent->load(); };
  if (name == "fp32") return {counted_ring(allreduce_hook(), sent), read};
  if (name == "fp16-allreduce") return {counted_ring(make_comm_hook("fp16", pg), sent), read};  // extension 05a's
  if (name == "powersgd") {
    PowerSgdOptions p;
    p.rank = opts.powersgd_rank;
    p.seed = opts.seed;
    auto state = std::make_shared<PowerSgd>(bucket_shapes(ddp), p);
    auto hook = powersgd_hook(state);
    auto calls = std::make_shared<int64_t>(0);
    const auto buckets = static_cast<int64_t>(ddp.bucket_count());
    const int64_t start = opts.powersgd_start;
    // Two ring all-reduces per bucket (P, then Q), of wire_elements(b) fp32 values together; before step
    // `start`, stage 05's fp32 all-reduce (PowerSGD's own call count, and so its buckets, start with its first call).
    CommHook counted = [hook, plain = allreduce_hook(), state, sent, calls, buckets, start](
                           ProcessGroup& g, torch::Tensor& bucket, const std::string& label) {
      const int64_t call = (*calls)++;
      if (call / buckets < start) {
        auto w = plain(g, bucket, label);
        *sent += ring_bytes(w.wire_bytes, g.world_size());
        return w;
      }
      *sent += ring_bytes(4 * state->wire_elements(static_cast<size_t>(call % buckets)), g.world_size());
      return hook(g, bucket, label);
    };
    return {counted, read};
  }
  auto state = std::make_shared<LowByteHook>(pg, *rounding_hook_options(name, opts.block));
  return {low_byte_hook(state), [state] { return state->sent_bytes(); }};
}

}  // namespace dp
