// The capstone's self-check, run before training: the chosen synchronization trains a small byte-level
// Transformer exactly like one process trained on the whole global batch.
#pragma once

#include "common/dist/dist.hpp"
#include "stages/08_train_lm/corpus.hpp"
#include "stages/08_train_lm/train_loop.hpp"

namespace dp {

/// How far the synchronized model ended from the single-process one.
struct LmCheck {
  double max_abs_diff = 0;  ///< over every parameter, after the steps
  double worst_ratio = 0;   ///< the largest |diff| / bound over every entry (AdamWeightBound): <= 1 passes
  std::string derivation;   ///< the gradient difference the entry-wise bounds start from, in words
  bool ok() const { return worst_ratio <= 1; }
};

/// Trains a 2-layer model (d_model 64, byte vocabulary) for 2 steps with `o`'s synchronization, batch,
/// micro-batches, data and AdamW, and the same model in this process alone on each step's whole global
/// batch; compares the parameters. A collective: every rank gets the same verdict. The bound is entry by
/// entry (common/measure/tolerance.hpp's AdamWeightBound): a gradient entry may differ by roundings x u(fp32) x
/// max|g|, the roundings being the batch's tokens summed in another grouping, the W rank partials and
/// two per op between a weight and the loss; AdamW's m / (sqrt(v) + eps) turns that into a weight
/// difference tiny where the gradient is large and up to lr where it is near zero.
LmCheck check_against_one_process(ProcessGroup& pg, const RunOptions& o, const TextCorpus& corpus);

}  // namespace dp
