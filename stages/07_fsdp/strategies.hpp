// Stage 07's FSDP as a dp::Strategy (common/contract/strategy.hpp): what the common check, the benchmark harness and
// the training-strategy contract suite run; and the checks it passes, run by the program before it times
// anything and by ctest: CS336 2026's test_fsdp.py, ported, and the check every Strategy passes.
#pragma once

#include "common/contract/strategy.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;  // CLI11's (<CLI/CLI.hpp>, included where the flags are added)
}

namespace dp {

/// Builds the Fsdp a strategy drives: a subclass that moves its units otherwise (extension 07c's, in fewer bytes).
using MakeFsdp = std::function<std::unique_ptr<Fsdp>(ProcessGroup&, std::shared_ptr<torch::nn::Module>,
                                                     const ModuleUnits&, FsdpOptions)>;

/// FSDP (Fsdp with `opts`, or what `make` builds) and one optimizer, built by the given MakeOptimizer, over its
/// shards and replicated tensors. The model must have units (dp::UnitModel; std::invalid_argument otherwise).
/// calls_per_step() and sent_bytes_per_step() are counted during the last step.
MakeStrategy fsdp_strategy(FsdpOptions opts = {}, MakeFsdp make = {});

/// Adds the flags both of stage 07's programs take (the stage's and extension 07a's): --reshard-after-forward
/// (true, false or both: true_false_both()) and --compute-dtype (parse_compute_dtype()); the parser refuses
/// other values (exit 2, naming the value and the choices).
void add_fsdp_flags(CLI::App& app, std::string& reshard, std::string& dtype);

/// In fp32 and bf16, each in every resharding mode of `reshard_modes` (true: reshard after forward):
/// CS336 2026's test_fsdp_correctness (check_strategy() with StrategyCheck::cs336_fsdp()),
/// CS336 2026's test_fsdp_gradient_sync (check_gradient_sync()), then check_strategy() with its own settings
/// (SGD with momentum; 1 and 2 micro-batches per step), one verdict line each (dp::report_margin()). True
/// when every check passed on every rank (all ranks return alike); the checks throw dp::CheckFailed.
bool run_fsdp_checks(ProcessGroup& pg, const std::vector<bool>& reshard_modes, uint64_t seed = 0);

}  // namespace dp
