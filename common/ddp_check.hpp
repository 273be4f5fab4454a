// The correctness checks every DDP stage runs on itself before it times anything, and that ctest
// runs too: data-parallel training must equal single-process training on the whole batch.
#pragma once

#include "common/dist.hpp"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace dp {

/// What a DDP variant does around a training step, seen from the training loop. Stage 02 and 03 do
/// all their communication in after_backward(); stages 04 and 05 start it during backward and only
/// wait in after_backward().
class GradSync {
 public:
  virtual ~GradSync() = default;
  /// Called at the very start of every step, before zero_grad (stage 05 resets its buckets here).
  virtual void on_train_batch_start() {}
  /// Called after loss.backward() and before optimizer.step(): afterwards every trainable
  /// parameter's .grad() holds the average over ranks.
  virtual void after_backward() = 0;
  /// Collectives this variant issues per training step (for benchmark tables).
  virtual int64_t calls_per_step() const = 0;
};

/// Builds a stage's GradSync for `model`. It must make every rank start from rank 0's parameters.
using MakeGradSync = std::function<std::unique_ptr<GradSync>(ProcessGroup&, std::shared_ptr<torch::nn::Module>)>;

/// torch's global RNG is one per process: ranks that are threads (the tests) hold this mutex
/// while they seed it and build a model.
std::mutex& model_init_mutex();

/// Copies rank 0's parameters (frozen ones too) and buffers to every rank, tied weights once.
void broadcast_parameters(ProcessGroup& pg, torch::nn::Module& module);

/// Largest |a - b| over the unique parameters of two models with the same structure.
double max_param_diff(torch::nn::Module& a, torch::nn::Module& b);

/// True when every rank holds bit-identical parameters (gathers them all).
bool parameters_identical_across_ranks(ProcessGroup& pg, torch::nn::Module& module);

/// The CS336 scenario for `model_name` ("toy" or "tied"): ranks seeded differently (so the
/// broadcast must fix rank 1), 20x10 inputs and 20x5 targets, 10 rows per rank at W = 2 (20/W in
/// general), MSE, SGD lr 0.1, `steps` steps with a fresh shuffle each step. After every step the DDP
/// model must equal single-process training on all rows (rtol 1e-5, atol 1e-8), frozen parameters
/// must not move, and all ranks must agree. Throws dp::CheckFailed naming the step and parameter.
void check_cs336_scenario(ProcessGroup& pg, const std::string& model_name, const MakeGradSync& make,
                          int steps = 5, bool verbose = false);

/// The toy-MLP experiment: batch 100 split across ranks, SGD lr 0.01, MSE, 10 epochs (one step
/// each). DDP weights must equal single-process full-batch weights (max difference < 1e-5), printed
/// per tensor when `verbose`. Throws dp::CheckFailed.
void check_toy_mlp_experiment(ProcessGroup& pg, const MakeGradSync& make, bool verbose = false);

}  // namespace dp
