// The capstone's self-check, run before training: the chosen synchronization trains a small byte-level
// Transformer exactly like one process trained on the whole global batch.
#pragma once

#include "common/dist.hpp"
#include "stages/08_train_lm/corpus.hpp"
#include "stages/08_train_lm/train_loop.hpp"

namespace dp {

/// How far the synchronized model ended from the single-process one.
struct LmCheck {
  double max_abs_diff = 0;   ///< over every parameter, after the steps
  double tolerance = 0;
  bool ok() const { return max_abs_diff <= tolerance; }
};

/// Trains a 2-layer model (d_model 64, byte vocabulary) for 2 steps with `o`'s synchronization, batch,
/// micro-batches, data and AdamW, and the same model in this process alone on each step's whole global
/// batch; compares the parameters. A collective: every rank gets the same verdict. The tolerance, 2e-6,
/// allows for sums of the same terms in another order (a mean over ranks vs. one mean over the batch),
/// which AdamW's update m / (sqrt(v) + eps) can amplify for near-zero gradients.
LmCheck check_against_one_process(ProcessGroup& pg, const RunOptions& o, const TextCorpus& corpus);

}  // namespace dp
