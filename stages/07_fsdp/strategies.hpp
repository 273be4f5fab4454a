// Stage 07's FSDP as a dp::Strategy (common/strategy.hpp): what the common check, the benchmark harness and
// the training-strategy contract suite run.
#pragma once

#include "common/strategy.hpp"
#include "stages/07_fsdp/fsdp.hpp"

namespace dp {

/// FSDP (Fsdp with `opts`) and one optimizer, built by the given MakeOptimizer, over its shards and
/// replicated tensors. The model must have units (dp::UnitModel; std::invalid_argument otherwise).
/// calls_per_step() and sent_bytes_per_step() are counted during the last step.
MakeStrategy fsdp_strategy(FsdpOptions opts = {});

}  // namespace dp
