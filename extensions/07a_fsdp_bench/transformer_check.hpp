// Extension 07a's own check, run before it times the Transformer: FSDP trains a small TransformerLM like
// one process (momentum, bf16, accumulated micro-batches), the model this extension measures.
#pragma once

#include "common/dist/dist.hpp"
#include "common/measure/tolerance.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <cstdint>
#include <vector>

namespace dp {

/// A small TransformerLM (vocab 64, d 32, d_ff 64, 2 layers, 2 heads, 16 tokens) trained with SGD
/// (lr 0.05, momentum 0.9) for 3 steps on 2 sequences per rank, against one process on all of them.
/// Tolerance derived as for stage 07's toy model (rows x W x T terms, 24 ops deep, momentum 0.9 carrying
/// each step's difference into the next: lr x (1 + 0.9 + 0.81) at the third step). With bf16 each step
/// is checked from common weights, the reference continuing from FSDP's, because a weight one rounding
/// apart can cast to another bf16 value, a jump no first-order bound covers. With accumulate = 2 each
/// rank runs its 2 sequences as 2 micro-batches of 1 (loss / 2, finish_gradient_synchronization()
/// after each): the same bound, since only the grouping of the sums changes. Returns the worst margin
/// over ranks (a collective).
Margin check_transformer_fsdp(ProcessGroup& pg, FsdpOptions opts, int accumulate = 1, uint64_t seed = 0);

/// check_transformer_fsdp() with 1 and 2 micro-batches, in fp32 and bf16 and in each resharding mode of
/// `reshard_modes`, one verdict line each (dp::report_margin()). True when all passed on every rank.
bool run_transformer_checks(ProcessGroup& pg, const std::vector<bool>& reshard_modes, uint64_t seed = 0);

}  // namespace dp
