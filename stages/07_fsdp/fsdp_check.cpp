#include "stages/07_fsdp/fsdp_check.hpp"

#include "common/cli.hpp"  // ComputeDtypeText
#include "common/ddp_check.hpp"
#include "common/format.hpp"
#include "common/log.hpp"
#include "common/models.hpp"
#include "common/params.hpp"
#include "common/runtime.hpp"
#include "common/tolerance.hpp"
#include "stages/07_fsdp/strategies.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <mutex>

namespace dp {

void check_fsdp_gradients(ProcessGroup& pg, FsdpOptions opts) {
  ToyFSDPModel model{nullptr};
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    torch::manual_seed(42);
    model = ToyFSDPModel();
  }
  model->to(pg.device());
  Fsdp fsdp(pg, model.ptr(), model->units(), opts);
  // Every rank its own data, from a generator of its own: ranks running as threads of one test process
  // do not race on the global RNG.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7 + pg.rank());
  auto tokens = torch::randint(0, 100, {4, 8}, gen).to(pg.device());
  model->forward_units(tokens, fsdp.runner()).to(torch::kFloat32).sum().backward();
  fsdp.finish_gradient_synchronization();
  auto params = fsdp.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& g = params[i].grad();
    if (!g.defined() || g.sizes() != params[i].sizes() || g.scalar_type() != torch::kFloat32)
      throw CheckFailed(fmt::format("optimizer tensor {} {}: gradient {} {}", i, shape_text(params[i].sizes()),
                                    g.defined() ? shape_text(g.sizes()) : "missing",
                                    g.defined() ? c10::toString(g.scalar_type()) : ""));
    if (i < fsdp.unit_count()) continue;  // shards differ across ranks by design
    for (const auto& other : pg.all_gather(g))
      if (!torch::equal(other, g)) throw CheckFailed(fmt::format("replicated gradient {} differs across ranks", i));
  }
}

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
      check_fsdp_gradients(pg, f);  // throws CheckFailed
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
