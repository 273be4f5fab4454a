// Stage 07's checks, run by the program before it times anything and by ctest: FSDP must train like
// one process on the whole batch (CS336 2026's test_fsdp.py, ported), and its gradients must have the
// shapes, dtype and cross-rank agreement that test asks for.
#pragma once

#include "common/dist.hpp"
#include "common/tolerance.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <string>
#include <vector>

namespace CLI {
class App;  // CLI11's (<CLI/CLI.hpp>, included where the flags are added)
}

namespace dp {

/// Outcome of a comparison against single-process training.
struct FsdpCheck {
  double max_abs_diff = 0;  ///< largest |FSDP - reference| over every parameter after the last step
  double tolerance = 0;     ///< the bound it must stay within, derived from u (common/tolerance.hpp)
  std::string derivation;   ///< how `tolerance` was derived, in words and numbers
  bool ok() const { return max_abs_diff <= tolerance; }
  Margin margin() const { return {max_abs_diff, tolerance}; }
};

/// CS336 2026's test_fsdp_correctness on ToyFSDPModel: model seed 42, 10 rows of 8 tokens per rank
/// (data seed 123 + step, the same on every rank, each rank its slice), cross-entropy of the last
/// token's logits (in fp32), SGD lr 0.01, 3 steps. The reference trains one model on all rows (with
/// bf16: its Linear/Embedding weights cast to bf16 for forward and backward, gradients back to fp32).
/// After every step gather_full_parameters() is compared with it; returns the largest difference.
/// Tolerance: derived from the compute dtype's unit roundoff u, the terms summed in another order
/// (rows x W, then W rank partials), the ops between a weight and the loss, the largest gradient entry
/// and the steps (lr 0.01 x 3 x roundings x u x max|g|; see rounding_count in fsdp_check.cpp). CS336
/// fixes 1e-6 (fp32) and 1e-4 (bf16): the derived bound is below both on this model.
/// `seed` 0 is CS336's (model 42, data 123); others shift both, for the margin test.
FsdpCheck check_toy_fsdp(ProcessGroup& pg, FsdpOptions opts, uint64_t seed = 0);

/// CS336 2026's test_fsdp_gradient_sync: per-rank data, loss = sum of the logits. After
/// finish_gradient_synchronization() every tensor the optimizer steps has an fp32 gradient of its own
/// shape, and every replicated gradient is bit-identical on all ranks. Throws dp::CheckFailed.
void check_fsdp_gradients(ProcessGroup& pg, FsdpOptions opts);

/// A small TransformerLM (vocab 64, d 32, d_ff 64, 2 layers, 2 heads, 16 tokens) trained with SGD
/// (lr 0.05, momentum 0.9) for 3 steps on 2 sequences per rank, against one process on all of them.
/// Tolerance derived as for the toy model (rows x W x T terms, 24 ops deep, momentum 0.9 carrying each
/// step's difference into the next: lr x (1 + 0.9 + 0.81) at the third step). With bf16 each step is
/// checked from common weights, the reference continuing from FSDP's, because a weight one rounding
/// apart can cast to another bf16 value, a jump no first-order bound covers. With accumulate = 2 each
/// rank runs its 2 sequences as 2 micro-batches of 1 (loss / 2, finish_gradient_synchronization()
/// after each): the same bound, since only the grouping of the sums changes.
FsdpCheck check_transformer_fsdp(ProcessGroup& pg, FsdpOptions opts, int accumulate = 1, uint64_t seed = 0);

/// "float32, reshard after forward", "bfloat16, keep until backward", ...: how the checks' lines and the
/// benchmark's rows name an FsdpOptions.
std::string fsdp_mode_name(const FsdpOptions& f);

/// The flags both of stage 07's programs take (the stage's and extension 07a's).
struct FsdpFlags {
  std::string reshard = "both";     ///< --reshard-after-forward: true, false or both
  std::string dtype = "float32";    ///< --compute-dtype: float32 or bfloat16 (bf16)
  /// The resharding modes asked for, true (reshard after forward) first.
  std::vector<bool> modes() const;
  torch::ScalarType compute_dtype() const { return parse_compute_dtype(dtype); }
};

/// Adds --reshard-after-forward and --compute-dtype to `app`; a value outside the choices is refused by
/// the parser (exit 2, naming it and the choices).
void add_fsdp_flags(CLI::App& app, FsdpFlags& flags);

/// Every check above, in fp32 and bf16 and in each resharding mode of `reshard_modes` (true: reshard
/// after forward), one verdict line each from rank 0 with the difference, its bound, their ratio (the
/// worst over ranks: what scripts/margins.py collects) and the bound's derivation. True when every check
/// passed on every rank (the verdict is gathered, so all ranks return alike); check_fsdp_gradients()
/// throws dp::CheckFailed.
bool run_fsdp_checks(ProcessGroup& pg, const std::vector<bool>& reshard_modes, uint64_t seed = 0);

}  // namespace dp
