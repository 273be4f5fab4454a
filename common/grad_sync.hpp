// The contract every DDP stage implements: what a gradient synchronization does around a training step,
// and the broadcast that makes every rank start from the same weights.
#pragma once

#include "common/dist.hpp"

#include "common/libtorch.hpp"

#include <cstdint>
#include <functional>
#include <memory>

namespace dp {

/// What a DDP variant does around a training step, seen from the training loop:
///
///     sync.on_train_batch_start(); opt.zero_grad(); loss(model->forward(x_local)).backward();
///     sync.after_backward(); opt.step();
///
/// Stages 02 and 03 do all their communication in after_backward(); stages 04 and 05 start it during
/// backward, from gradient hooks, and only wait in after_backward(). Every implementation must:
/// - make every rank start from rank 0's parameters when it is constructed (broadcast_parameters());
/// - leave in every trainable parameter's .grad() the average over ranks after after_backward(), so
///   that training equals single-process training on the whole batch;
/// - never move a frozen parameter (requires_grad false);
/// - issue the same collectives in the same order on every rank.
///
/// dp::check_cs336_scenario() and dp::check_toy_mlp_experiment() check this; the typed test suite
/// tests/stages/test_grad_sync_contract.cpp runs them on every implementation. A GradSync with an
/// optimizer is a dp::Strategy (common/strategy.hpp: dp::ddp_strategy()), what the checks and the
/// benchmark run.
class GradSync {
 public:
  virtual ~GradSync() = default;
  /// Called at the very start of every step, before zero_grad (stages 04 and 05 check here that the
  /// previous step was finished).
  virtual void on_train_batch_start() {}
  /// Called after loss.backward() and before optimizer.step(): afterwards every trainable
  /// parameter's .grad() holds the average over ranks.
  virtual void after_backward() = 0;
  /// Collectives this variant issues per training step (for benchmark tables).
  virtual int64_t calls_per_step() const = 0;
};

/// Builds a stage's GradSync for `model` on every rank. The result must make every rank start from
/// rank 0's parameters (its constructor calls broadcast_parameters()).
using MakeGradSync = std::function<std::unique_ptr<GradSync>(ProcessGroup&, std::shared_ptr<torch::nn::Module>)>;

/// Copies rank 0's parameters (frozen ones too) and buffers to every rank, tied weights once, in place.
/// First checks that every rank built the same model (the same number of unique parameters, each of the
/// same shape); otherwise every rank throws dp::UsageError naming the first mismatch, before any
/// collective could pair unrelated tensors. Collective: every rank of `pg` must call it.
void broadcast_parameters(ProcessGroup& pg, torch::nn::Module& module);

}  // namespace dp
