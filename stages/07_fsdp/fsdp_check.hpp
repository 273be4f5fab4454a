// Stage 07's checks, run by the program before it times anything and by ctest: FSDP must train like
// one process on the whole batch (CS336 2026's test_fsdp.py, ported), and its gradients must have the
// shapes, dtype and cross-rank agreement that test asks for.
#pragma once

#include "common/dist.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <string>

namespace dp {

/// Outcome of a comparison against single-process training.
struct FsdpCheck {
  double max_abs_diff = 0;  ///< largest |FSDP - reference| over every parameter after the last step
  double tolerance = 0;     ///< the bound it must stay within (0: bit-identical)
  bool ok() const { return max_abs_diff <= tolerance; }
};

/// CS336 2026's test_fsdp_correctness on ToyFSDPModel: model seed 42, 10 rows of 8 tokens per rank
/// (data seed 123 + step, the same on every rank, each rank its slice), cross-entropy of the last
/// token's logits (in fp32), SGD lr 0.01, 3 steps. The reference trains one model on all rows (with
/// bf16: its Linear/Embedding weights cast to bf16 for forward and backward, gradients back to fp32).
/// After every step gather_full_parameters() is compared with it; returns the largest difference.
/// Tolerance: fp32 1e-6 (the mean of two half-batch means rounds differently from the mean of all rows),
/// bf16 1e-4 (CS336's bound for its half-precision case; measured 1.3e-5 at 2 ranks).
FsdpCheck check_toy_fsdp(ProcessGroup& pg, FsdpOptions opts);

/// CS336 2026's test_fsdp_gradient_sync: per-rank data, loss = sum of the logits. After
/// finish_gradient_synchronization() every tensor the optimizer steps has an fp32 gradient of its own
/// shape, and every replicated gradient is bit-identical on all ranks. Throws dp::CheckFailed.
void check_fsdp_gradients(ProcessGroup& pg, FsdpOptions opts);

/// A small TransformerLM (vocab 64, d 32, d_ff 64, 2 layers, 2 heads, 16 tokens) trained with SGD
/// (lr 0.05, momentum 0.9) for 3 steps on 2 sequences per rank, against one process on all of them.
/// Tolerance 1e-5 (fp32) or 1e-4 (bf16: each step checked from common weights, the reference continuing
/// from FSDP's, because momentum carries bf16 rounding flips from step to step). With accumulate = 2
/// each rank runs its 2 sequences as 2 micro-batches of 1 (loss / 2, finish_gradient_synchronization()
/// after each): the same tolerances, since only the order of the sums changes.
FsdpCheck check_transformer_fsdp(ProcessGroup& pg, FsdpOptions opts, int accumulate = 1);

}  // namespace dp
