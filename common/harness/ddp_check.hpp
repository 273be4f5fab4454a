// The correctness checks every DDP stage runs on itself before it times anything, and that ctest
// runs too: data-parallel training must equal single-process training on the whole batch. The
// contract they check (GradSync, broadcast_parameters) is in common/contract/grad_sync.hpp.
#pragma once

#include "common/contract/grad_sync.hpp"
#include "common/contract/strategy.hpp"
#include "common/dist/dist.hpp"
#include "common/measure/tolerance.hpp"

#include "common/base/libtorch.hpp"

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dp {

/// Largest |a - b| over the unique parameters of two models with the same structure (dp::CheckFailed naming
/// the first pair whose names or shapes differ, or the counts when they differ).
double max_param_diff(torch::nn::Module& a, torch::nn::Module& b);

/// Largest |full - reference| over the trainable parameters, `full` named and ordered as
/// Strategy::full_parameters() gives them (dp::CheckFailed naming the first pair whose names or shapes differ,
/// or the counts when they differ).
double max_full_diff(const std::vector<std::pair<std::string, torch::Tensor>>& full, torch::nn::Module& ref);

/// The margin of the rank whose ratio is worst, on every rank (a collective: one verdict for all). The
/// derivation stays this rank's: the ranks derive their bounds alike.
Margin worst_over_ranks(ProcessGroup& pg, const Margin& mine);

/// Prints a check's verdict line from rank 0, in the one form scripts/checks/margins.py reads:
/// "PASS <what>: max |diff| D <= B (ratio R)", with "; bound = <derivation>" before the ")" when `m` has
/// one, and FAIL for PASS when D > B. Returns m.ok(). Give it a margin that is already the worst over ranks
/// (worst_over_ranks(), or what the checks here return), so that every rank returns alike.
bool report_margin(const Margin& m, const std::string& what);

/// True when every rank holds bit-identical parameters (gathers them all).
bool parameters_identical_across_ranks(ProcessGroup& pg, torch::nn::Module& module);

/// Throws dp::UsageError unless `world_size` divides the CS336 scenario's 20 rows. Stages call it with the
/// launch environment's world size, so that bad input exits 2 before any rank connects to another.
void check_cs336_world_size(int world_size);

/// The CS336 scenario for `model_name` ("toy" or "tied"): ranks seeded differently, so after
/// construction every rank other than 0 must hold rank 0's values instead of its own (frozen parameters
/// too; a parameter initialised to a constant, the same under every seed, cannot show it and is not
/// asked to). Then 20x10 inputs and 20x5 targets, 10 rows per rank at W = 2 (20/W in general), MSE,
/// SGD lr 0.1 (`make` is given the SGD and builds it over the parameters it chooses), `steps` steps with a
/// fresh shuffle each step. After every step the DDP model must equal single-process training on all rows
/// within the rounding bound lr x steps x (rows + W + 2 (layers + 1)) x u(fp32) x max|g| (see
/// ddp_check.cpp: sums in another grouping; tighter than CS336's rtol 1e-5 on these models), frozen
/// parameters must stay bit for bit, and all ranks must agree. Throws dp::CheckFailed naming the step
/// and parameter; returns the largest difference of any step with the bound after the last step (the
/// worst ratio over ranks).
/// `seed` 0 keeps CS336's weights, data and shuffles; others shift them all (for the margin test).
Margin check_cs336_scenario(ProcessGroup& pg, const std::string& model_name, const MakeStrategy& make, int steps = 5,
                            bool verbose = false, uint64_t seed = 0);
/// The same for a DDP stage: its GradSync, then one SGD over all parameters (dp::ddp_strategy()).
Margin check_cs336_scenario(ProcessGroup& pg, const std::string& model_name, const MakeGradSync& make, int steps = 5,
                            bool verbose = false, uint64_t seed = 0);

/// The dtype each module's own parameters compute in, forward and backward (Strategy::compute_dtype()):
/// a rule by the module's kind, asked of the reference's modules too.
using ComputeDtypeOf = std::function<torch::ScalarType(const torch::nn::Module&)>;

/// One backward of the single-process reference `ref`, computed as a mixed-precision scheme computes it:
/// `copy` (ref's architecture, any weights) takes ref's weights, each module's own ones cast to
/// dtype_of(module), runs loss_of(copy).backward(), and ref's gradients become copy's cast back to fp32
/// (replacing what ref held; no weight of ref changes). When every module computes in fp32 this is
/// loss_of(ref).backward(), accumulating as usual.
void reference_backward(torch::nn::Module& ref, torch::nn::Module& copy, const ComputeDtypeOf& dtype_of,
                        const std::function<torch::Tensor(torch::nn::Module&)>& loss_of);

/// The least precise dtype (largest unit roundoff) that `dtype_of` gives any module of `model`: the one a
/// rounding bound counts.
torch::ScalarType lowest_compute_dtype(const torch::nn::Module& model, const ComputeDtypeOf& dtype_of);

/// How check_strategy() trains. The defaults are this course's check (SGD with momentum: optimizer state
/// to shard); cs336_fsdp() is CS336 2026's test_fsdp_correctness.
struct StrategyCheck {
  int steps = 3;
  uint64_t seed = 0;           ///< 0: the seeds below; others shift them (for the margin test)
  int accumulate = 1;          ///< K micro-batches per step (Strategy::set_requires_gradient_sync()): a divisor of rows
  int64_t rows = 4;            ///< per rank, each of 8 tokens
  double momentum = 0.9;       ///< of SGD with lr 0.01
  uint64_t model_seed = 1000;  ///< rank 0's weights (+ 100 x seed); rank r seeds model_seed + 100 x seed + r
  uint64_t data_seed = 7001;   ///< step k (0, 1, ...) draws its data from data_seed + 1000 x seed + k
  /// > 0: the strategy clips (Strategy::set_max_grad_norm()) and the reference calls clip_grad_norm_ with it;
  /// each step's norm (Strategy::last_grad_norm()) must then equal the reference's within its bound, and a
  /// mismatch is named by clip_norm_hint(). Set it below the norms (about 1 here) so that every step clips.
  double max_grad_norm = 0;
  /// CS336 2026's test_fsdp_correctness: 10 rows per rank, plain SGD, weights from seed 42, data from
  /// seeds 123, 124, 125.
  static StrategyCheck cs336_fsdp(uint64_t seed = 0);
};

/// The training-strategy check, for any Strategy (DDP, a sharded optimizer, FSDP): CS336 2026's
/// ToyFSDPModel (a model with units, so that every scheme can run it), every rank seeded differently,
/// so after construction full_parameters() must be rank 0's on every rank. Then `c.steps` steps, each on
/// fresh data (c.rows rows of 8 tokens per rank, the same draw on every rank; each rank trains on its
/// rows), last-token cross-entropy, SGD lr 0.01 with c.momentum (`make` is given it: momentum is optimizer
/// state to shard). After every step full_parameters() must equal single-process training on all rows
/// within the rounding bound lr x (1 + momentum + ...) x ((rows W + W + K) x u(fp32) + 14 x u) x max|g|
/// plus an ulp of max|w| per step (gradient_rounding_error(); see ddp_check.cpp), and be the same on every
/// rank. Throws dp::CheckFailed naming the step and parameter (every rank throws together); returns the
/// worst margin over ranks. With c.accumulate K > 1, each rank's rows go backward as K micro-batches of one
/// step. A scheme that computes below fp32 (Strategy::compute_dtype(), e.g. FSDP's bf16) is compared with a
/// reference that computes alike (reference_backward()), and its 14 roundings count in that dtype's u,
/// plus 2 for the gradient's own rounding.
Margin check_strategy(ProcessGroup& pg, const MakeStrategy& make, const StrategyCheck& c = {});

/// CS336 2026's test_fsdp_gradient_sync, for any Strategy that finishes synchronizing in after_backward()
/// (DDP, FSDP; not a ZeRO-1 design, whose reduce-scatter is part of step()): ToyFSDPModel from seed 42,
/// each rank its own 4 x 8 tokens, loss = the sum of the logits, one backward. Then every tensor the
/// strategy's optimizers step has an fp32 gradient of its own shape, and every one that is a model
/// parameter (not a shard of one: FSDP's replicated norms, all of DDP's) has a bit-identical gradient on
/// every rank. Throws dp::CheckFailed naming the tensor.
void check_gradient_sync(ProcessGroup& pg, const MakeStrategy& make);

/// The toy-MLP experiment: batch 100 split across ranks, SGD lr 0.01, MSE, 10 epochs (one step
/// each). DDP weights must equal single-process full-batch weights within the same rounding bound (and
/// under 1e-5, the experiment's own criterion), printed per tensor when `verbose`. Throws
/// dp::CheckFailed; returns the worst difference with its bound.
Margin check_toy_mlp_experiment(ProcessGroup& pg, const MakeGradSync& make, bool verbose = false, uint64_t seed = 0);

}  // namespace dp
