// Extension 05c, on stage 05: the optimizer overlapped with communication (PyTorch 2.x's "optimizer in
// backward"). Stage 05 steps one optimizer after the last bucket arrived, so the whole optimizer time comes
// after the wire. Here each bucket's parameters are stepped as soon as that bucket's average is back, while
// the buckets after it are still on the wire; only the last bucket's share of the optimizer is left after
// communication. Built on stage 05's seam BucketedDdp::on_bucket_averaged().
#pragma once

#include "common/contract/strategy.hpp"
#include "common/dist/dist.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"

#include "common/base/libtorch.hpp"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dp {

/// One optimizer per trainable parameter of `ddp`, stepped inside ddp.finish_gradient_synchronization(),
/// bucket by bucket: once bucket b's average is in its parameters' .grad(), their optimizers step while
/// buckets b+1, b+2, ... are still on the wire. The training loop then has no opt.step():
///   OverlappedOptimizer overlapped(ddp, make);
///   loop: ddp.on_train_batch_start(); overlapped.zero_grad(); loss.backward(); ddp.finish_gradient_synchronization();
/// The result is bit-identical to stepping one optimizer over all parameters after finish, for any
/// torch::optim optimizer whose update of a parameter reads only that parameter, its gradient and its own
/// state (SGD, Adam, AdamW, RMSprop, Adagrad: all of LibTorch's except LBFGS). One optimizer per parameter,
/// not per bucket, so that buckets may change (ArrivalOrderDdp) and every state stays. Nothing steps under
/// no_sync() (finish synchronizes nothing there).
class OverlappedOptimizer {
 public:
  /// Builds the optimizers, `make` called once per trainable parameter with a one-element vector, and
  /// attaches to `ddp`, which must outlive this object. Throws std::logic_error for an empty `make` or in
  /// the middle of a step (what on_bucket_averaged() throws).
  OverlappedOptimizer(BucketedDdp& ddp, const MakeOptimizer& make);
  /// Detaches from the BucketedDdp (between steps).
  ~OverlappedOptimizer();
  OverlappedOptimizer(const OverlappedOptimizer&) = delete;
  OverlappedOptimizer& operator=(const OverlappedOptimizer&) = delete;

  /// The per-parameter optimizers, indexed like ddp.parameters() (nullptr for frozen parameters): to change a
  /// learning rate, change it in each.
  const std::vector<std::unique_ptr<torch::optim::Optimizer>>& optimizers() const { return *optimizers_; }
  /// Every optimizer's zero_grad().
  void zero_grad();

 private:
  using Optimizers = std::vector<std::unique_ptr<torch::optim::Optimizer>>;
  BucketedDdp& ddp_;
  std::shared_ptr<Optimizers> optimizers_;  // shared with the callback, which may outlive this object mid-step
};

/// A BucketedDdp (or a subclass) with its optimizer overlapped, as a dp::Strategy: after_backward() steps
/// each bucket's parameters as soon as that bucket arrived, and step() has nothing left to do.
class OverlappedOptimizerDdp : public Strategy {
 public:
  OverlappedOptimizerDdp(std::unique_ptr<BucketedDdp> ddp, const MakeOptimizer& make);
  /// on_train_batch_start(), then every per-parameter optimizer's zero_grad().
  void zero_grad() override;
  void after_backward() override { ddp_->finish_gradient_synchronization(); }
  void step() override {}
  int64_t calls_per_step() const override { return ddp_->calls_per_step(); }
  /// Parameters and gradients of the model, the state of every per-parameter optimizer.
  TrainingBytes bytes() const override;
  double sent_bytes_per_step() const override;
  double buffer_bytes() const override { return static_cast<double>(ddp_->buffer_bytes()); }  // the buckets
  std::string describe() const override;
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() override {
    return whole_parameters(*ddp_->module);
  }
  /// false: no_sync() until true (nothing steps in between).
  void set_requires_gradient_sync(bool sync) override { ddp_->set_requires_gradient_sync(sync); }
  FullState full_state() override;
  void load_full_state(const FullState& s) override;
  std::vector<torch::optim::Optimizer*> optimizers() override;
  BucketedDdp& ddp() { return *ddp_; }

 private:
  std::unique_ptr<BucketedDdp> ddp_;
  std::unique_ptr<OverlappedOptimizer> overlapped_;  // after ddp_: detached first
};

/// Builds a BucketedDdp (or a subclass) over a model.
using MakeBucketedDdp = std::function<std::unique_ptr<BucketedDdp>(ProcessGroup&, std::shared_ptr<torch::nn::Module>)>;

/// Throws CheckFailed unless OverlappedOptimizer with AdamW trains a small Transformer bit for bit like
/// one AdamW step after finish_gradient_synchronization(), both over DDPs from `make_ddp` (3 steps; small
/// buckets give many). Prints a PASS line on rank 0. Collective.
void check_overlapped_optimizer(ProcessGroup& pg, const MakeBucketedDdp& make_ddp);

}  // namespace dp
