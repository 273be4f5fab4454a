// The check of a sharded optimizer, CS336's test: the same model trained with plain AdamW and with the
// sharded design must be equal bit for bit after every step. Stage 06 runs it on ZeRO-1; extensions 06a,
// 06c and 06b on their designs (a design gives its two calls as ShardedSteps).
#pragma once

#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <functional>
#include <string>
#include <vector>

namespace dp {

/// A sharded optimizer as the check drives it.
struct ShardedSteps {
  std::function<void()> zero_grad;  ///< before backward
  std::function<void()> step;       ///< after backward: the design's communication and its step
  std::string description;          ///< one line, printed
  /// True for a design that reduce-scatters the gradients (ZeRO-1): the N equal gradients are summed in rank
  /// order and divided by N (the reference then takes the same sum); false for designs that all-reduce
  /// nothing here (extension 06b's).
  bool sums_over_ranks = false;
};
/// Builds the design under test over `params` (a model's parameters) with AdamW and `opts`.
using MakeShardedSteps = std::function<ShardedSteps(ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                                                    const torch::optim::AdamWOptions& opts)>;

/// CS336's test on its `toy` and `tied` models: every rank seeds 42, so models and data agree without a
/// broadcast; every rank computes full gradients (no DDP). After each of 10 steps the sharded model must equal
/// plain AdamW's bit for bit, and every rank's copy must be the same. Prints "PASS|FAIL <what> == AdamW on
/// <model> ..." per model (rank 0) and returns whether every rank passed both. Collective.
bool check_against_adamw(ProcessGroup& pg, const std::string& what, const MakeShardedSteps& make);

}  // namespace dp
