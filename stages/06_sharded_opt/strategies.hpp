// Stage 06's designs as dp::Strategy (common/strategy.hpp): what the common check, the benchmark harness
// and the training-strategy contract suite run. Each builds its optimizer with the MakeOptimizer it is
// given, over the parameters (or flat chunks) this rank steps, and makes every rank start from rank 0's
// weights.
#pragma once

#include "common/strategy.hpp"
#include "stages/06_sharded_opt/sharded_optimizer.hpp"  // MakeLocalOptimizer

namespace dp {

/// CS336's design: stage 05's bucketed DDP averages the gradients (buckets of `bucket_cap_mb`), then a
/// ShardedOptimizer steps the tensors this rank owns and broadcasts them (three passes over the wire).
MakeStrategy cs336_strategy(double bucket_cap_mb = 25.0);

/// True ZeRO-1 (Zero1Optimizer): reduce-scatter of one flat gradient buffer, step of this rank's chunk,
/// all-gather of the parameters (two passes, as DDP).
MakeStrategy zero1_strategy();

/// The designs' local optimizers are built from parameter groups (owned tensors, or one flat chunk); a
/// Strategy is given a factory over a tensor list. This adapts one to the other: the factory's optimizer,
/// emptied, takes the groups, its defaults being the options of every group that brings none.
MakeLocalOptimizer local_factory(const MakeOptimizer& make);

}  // namespace dp
