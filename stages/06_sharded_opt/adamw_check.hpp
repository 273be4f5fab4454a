// Stage 06's check, CS336's test of a sharded optimizer: the same model trained with plain AdamW and with the
// sharded design must be equal bit for bit after every step.
#pragma once

#include "common/dist.hpp"

#include "common/libtorch.hpp"

#include <functional>
#include <string>
#include <vector>

namespace dp {

/// A sharded optimizer as the check drives it.
struct ShardedSteps {
  std::function<void()> zero_grad;  ///< before backward
  std::function<void()> step;       ///< after backward: the design's communication and its step
  std::string description;          ///< one line, printed
  /// True for ZeRO-1's reduce-scatter: the N equal gradients are summed in rank order and divided by N (the
  /// reference then takes the same sum); false for designs that all-reduce nothing here (extension 06d's).
  bool sums_over_ranks = false;
};
/// Builds the design under test over `params` (a model's parameters) with AdamW and `opts`.
using MakeShardedSteps = std::function<ShardedSteps(ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                                                    const torch::optim::AdamWOptions& opts)>;

/// Stage 06's Zero1Optimizer over `params` with AdamW and `opts`, as the check drives it.
ShardedSteps zero1_steps(ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                         const torch::optim::AdamWOptions& opts);

/// CS336's test on its `toy` and `tied` models: every rank seeds 42, so models and data agree without a
/// broadcast; every rank computes full gradients (no DDP). After each of 10 steps the sharded model must equal
/// plain AdamW's bit for bit, and every rank's copy must be the same. Prints "PASS|FAIL <what> == AdamW on
/// <model> ..." per model (rank 0) and returns whether every rank passed both. Collective.
bool check_against_adamw(ProcessGroup& pg, const std::string& what, const MakeShardedSteps& make);

}  // namespace dp
