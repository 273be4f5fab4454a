// The contract every DDP stage implements: what a gradient synchronization does around a training step,
// and the broadcast that makes every rank start from the same weights.
#pragma once

#include "common/dist/dist.hpp"
#include "common/model/params.hpp"  // ModelTensors

#include "common/base/libtorch.hpp"

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
/// optimizer is a dp::Strategy (common/contract/strategy.hpp: dp::ddp_strategy()), what the checks and the
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
  /// Bytes of the buffers it keeps between steps for its communication, beside the gradients themselves
  /// (stage 05's buckets, a copy of every gradient); 0 for a variant that keeps none (stage 03's flat
  /// buffer lives for one step only).
  virtual int64_t buffer_bytes() const { return 0; }
  /// false: the backward passes that follow only accumulate into .grad(), with no communication, and
  /// after_backward() leaves them so; true (the default): the next backward synchronizes everything
  /// accumulated (PyTorch's no_sync(), FSDP2's set_requires_gradient_sync). A variant that ignores it
  /// synchronizes every micro-batch: the same gradients, K times the traffic.
  virtual void set_requires_gradient_sync(bool /*sync*/) {}
  /// The current setting (always true for a variant that ignores it).
  virtual bool requires_gradient_sync() const { return true; }
};

/// PyTorch's `with ddp.no_sync():` for any GradSync: local accumulation while the guard lives, then the
/// setting it found restored, so that guards nest. Movable, not copyable; it must not outlive `sync`.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(GradSync& sync) : sync_(&sync), before_(sync.requires_gradient_sync()) {
    sync.set_requires_gradient_sync(false);
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept : sync_(other.sync_), before_(other.before_) { other.sync_ = nullptr; }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  ~NoSyncGuard() {
    if (sync_) sync_->set_requires_gradient_sync(before_);
  }

 private:
  GradSync* sync_;  // null once moved from
  bool before_;
};

/// Builds a stage's GradSync for `model` on every rank. The result must make every rank start from
/// rank 0's parameters (its constructor calls broadcast_parameters()).
using MakeGradSync = std::function<std::unique_ptr<GradSync>(ProcessGroup&, std::shared_ptr<torch::nn::Module>)>;

/// The MakeGradSync of a GradSync class constructed as `T(pg, model)`, such as a stage's DDP class.
template <typename T>
MakeGradSync make_grad_sync() {
  return [](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) -> std::unique_ptr<GradSync> {
    return std::make_unique<T>(pg, std::move(m));
  };
}

/// Copies rank 0's parameters (frozen ones too) and buffers to every rank, tied weights once, in place.
/// First checks that every rank built the same model (the same number of unique parameters, each of the
/// same shape); otherwise every rank throws dp::UsageError naming the first mismatch, before any
/// collective could pair unrelated tensors. Collective: every rank of `pg` must call it.
void broadcast_parameters(ProcessGroup& pg, torch::nn::Module& module);
/// The same for a model given as tensors (a Python nn.Module's, through the package in python/).
void broadcast_parameters(ProcessGroup& pg, const ModelTensors& model);

}  // namespace dp
