#include "stages/07_fsdp/fsdp_check.hpp"

#include "common/cli.hpp"  // ComputeDtypeText
#include "common/ddp_check.hpp"
#include "common/format.hpp"
#include "common/log.hpp"
#include "common/runtime.hpp"
#include "common/tolerance.hpp"
#include "stages/07_fsdp/strategies.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace dp {

void add_fsdp_flags(CLI::App& app, std::string& reshard, std::string& dtype) {
  app.add_option("--reshard-after-forward", reshard,
                 "true: free gathered weights after forward (ZeRO-3); false: keep them until backward; both")
      ->check(CLI::IsMember({"true", "false", "both"}));
  app.add_option("--compute-dtype", dtype, "With the benchmark: float32 or bfloat16 (bf16) for FSDP's gathered weights")
      ->check(ComputeDtypeText);
}

std::string fsdp_mode_name(const FsdpOptions& f) {
  return fmt::format("{}, {}", dtype_name(f.compute_dtype), f.reshard_after_forward ? "reshard after forward"
                                                                                         : "keep until backward");
}

bool run_fsdp_checks(ProcessGroup& pg, const std::vector<bool>& reshard_modes, uint64_t seed) {
  // [checks]
  bool all_ok = true;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (bool reshard : reshard_modes) {
      const FsdpOptions f{reshard, dtype};
      // CS336 2026's test_fsdp_correctness is the common check with its settings (plain SGD, 10 rows per rank).
      bool ok = report_margin(check_strategy(pg, fsdp_strategy(f), StrategyCheck::cs336_fsdp(seed)),
                              fmt::format("FSDP == one process on ToyFSDPModel ({}; 3 SGD steps, {})",
                                          fsdp_mode_name(f), count_of(pg.world_size(), "rank")));
      check_gradient_sync(pg, fsdp_strategy(f));  // CS336 2026's test_fsdp_gradient_sync; throws CheckFailed
      print0("PASS FSDP gradients ({}): fp32, shard-shaped, replicated ones equal on every rank", fsdp_mode_name(f));
      // The check every Strategy passes (common/ddp_check.hpp), with a reference computing in f's dtype:
      // SGD with momentum (state to shard), every rank starting from its own weights, micro-batches.
      for (int k : {1, 2}) {
        StrategyCheck c;
        c.seed = seed, c.accumulate = k;
        ok = report_margin(check_strategy(pg, fsdp_strategy(f), c),
                           fmt::format("FSDP as a Strategy == one process ({}; 3 SGD steps with momentum, {} "
                                       "micro-batch{} per step)", fsdp_mode_name(f), k, k > 1 ? "es" : "")) && ok;
      }
      all_ok = all_ok && ok;
    }
  // [checks]
  return all_ok;
}

}  // namespace dp
