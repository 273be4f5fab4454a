// Stage 07's checks, run by the program before it times anything and by ctest: FSDP must train like
// one process on the whole batch (CS336 2026's test_fsdp.py, ported), and its gradients must have the
// shapes, dtype and cross-rank agreement that test asks for.
#pragma once

#include "common/dist.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <string>
#include <vector>

namespace CLI {
class App;  // CLI11's (<CLI/CLI.hpp>, included where the flags are added)
}

namespace dp {

/// CS336 2026's test_fsdp_gradient_sync: per-rank data, loss = sum of the logits. After
/// finish_gradient_synchronization() every tensor the optimizer steps has an fp32 gradient of its own
/// shape, and every replicated gradient is bit-identical on all ranks. Throws dp::CheckFailed.
void check_fsdp_gradients(ProcessGroup& pg, FsdpOptions opts);

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

/// The modes the checks run in: fp32, then bf16, each in every resharding mode of `reshard_modes`.
std::vector<FsdpOptions> fsdp_check_modes(const std::vector<bool>& reshard_modes);

/// CS336 2026's test_fsdp_correctness (common's check_strategy() on fsdp_strategy() with
/// StrategyCheck::cs336_fsdp(): the bound is below CS336's fixed 1e-6 for fp32 and 1e-4 for bf16 on this
/// model), check_fsdp_gradients(), then check_strategy() with its own settings (SGD with momentum; 1 and 2
/// micro-batches per step), in fp32 and bf16 and in each resharding mode of `reshard_modes` (true: reshard
/// after forward), one verdict line each (dp::report_margin()). True when every check passed on every rank
/// (the verdict is gathered, so all ranks return alike); check_fsdp_gradients() and check_strategy()
/// throw dp::CheckFailed.
bool run_fsdp_checks(ProcessGroup& pg, const std::vector<bool>& reshard_modes, uint64_t seed = 0);

}  // namespace dp
