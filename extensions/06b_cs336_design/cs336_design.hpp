// Extension 06b, on stage 06: CS336's design of ZeRO-1 (ShardedOptimizer) as the check, the benchmark and the
// training-strategy contract drive it, and the --design option that picks it or stage 06's ZeRO-1.
#pragma once

#include "common/contract/strategy.hpp"
#include "common/harness/optimizer_check.hpp"

#include <string>
#include <vector>

namespace CLI {
class App;  // CLI11's (<CLI/CLI.hpp>, included where the option is added)
}

namespace dp {

/// CS336's design as a dp::Strategy: stage 05's bucketed DDP averages the gradients (buckets of
/// `bucket_cap_mb`), then a ShardedOptimizer steps the tensors this rank owns and broadcasts them (three
/// passes over the wire).
MakeStrategy cs336_strategy(double bucket_cap_mb = 25.0);

/// A ShardedOptimizer over `params` with AdamW and `opts`, as stage 06's check drives it.
ShardedSteps cs336_steps(ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                         const torch::optim::AdamWOptions& opts);

/// Adds --design (cs336, zero1 or all) to `app`; another value is refused by the parser with the choices (exit 2).
void add_design_option(CLI::App& app, std::string& design);
/// The designs `design` selects, in table order: "all" is {"cs336", "zero1"}.
std::vector<std::string> selected_designs(const std::string& design);
/// check_against_adamw() for every design `design` selects; true when all passed on every rank.
bool check_designs(ProcessGroup& pg, const std::string& design);

}  // namespace dp
