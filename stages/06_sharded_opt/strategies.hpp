// Stage 06's ZeRO-1 as a dp::Strategy (common/contract/strategy.hpp): what the common check, the benchmark harness
// and the training-strategy contract suite run. It builds its optimizer with the MakeOptimizer it is given,
// over the flat chunk this rank steps, and makes every rank start from rank 0's weights. And ZeRO-1 as the
// two calls the check against AdamW drives (common/harness/optimizer_check.hpp).
#pragma once

#include "common/contract/strategy.hpp"
#include "common/harness/optimizer_check.hpp"  // ShardedSteps
#include "stages/06_sharded_opt/zero1_optimizer.hpp"

namespace dp {

/// True ZeRO-1 (Zero1Optimizer): reduce-scatter of one flat gradient buffer (as `how` says), step of this rank's
/// chunk, all-gather of the parameters (two passes, as DDP).
MakeStrategy zero1_strategy(ReduceScatterHow how = {});

/// Zero1Optimizer over `params` with AdamW and `opts`, as the check against AdamW drives it.
ShardedSteps zero1_steps(ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                         const torch::optim::AdamWOptions& opts);

}  // namespace dp
