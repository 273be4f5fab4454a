// Stage 06's designs as dp::Strategy (common/strategy.hpp): what the common check, the benchmark harness
// and the training-strategy contract suite run. Each builds its optimizer with the MakeOptimizer it is
// given, over the parameters (or flat chunks) this rank steps, and makes every rank start from rank 0's
// weights.
#pragma once

#include "common/strategy.hpp"

namespace dp {

/// CS336's design: stage 05's bucketed DDP averages the gradients (buckets of `bucket_cap_mb`), then a
/// ShardedOptimizer steps the tensors this rank owns and broadcasts them (three passes over the wire).
MakeStrategy cs336_strategy(double bucket_cap_mb = 25.0);

/// True ZeRO-1 (Zero1Optimizer): reduce-scatter of one flat gradient buffer, step of this rank's chunk,
/// all-gather of the parameters (two passes, as DDP).
MakeStrategy zero1_strategy();

/// ZeRO-1 in buckets (BucketedZero1): reduce-scatters launched from backward. With `overlap_gathers`
/// the all-gathers wait for the next forward (the model must have units: dp::UnitModel).
MakeStrategy bucketed_zero1_strategy(double bucket_cap_mb = 25.0, bool overlap_gathers = false);

}  // namespace dp
