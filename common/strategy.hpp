// The contract of a way of training data-parallel, seen from the training loop: what happens around
// forward and backward, and who steps the optimizer. DDP (a GradSync, then one optimizer over all
// parameters) is one implementation; a scheme that steps inside the synchronization, or that shards the
// optimizer, is another, and the same check and benchmark serve them all.
#pragma once

#include "common/dist.hpp"
#include "common/grad_sync.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace dp {

/// Builds the optimizer of a list of parameters: all of a model's, one parameter's, or a shard's. A
/// Strategy is given one and decides over which parameters to build it, and how many times.
using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

/// One training step of a data-parallel scheme, on every rank:
///
///     s.zero_grad(); loss(model->forward(x_local)).backward(); s.after_backward(); s.step();
///
/// After step() every rank's model must equal single-process training on the whole batch with the
/// optimizer the Strategy was built with (dp::check_cs336_scenario() checks it), and every rank must
/// issue the same collectives in the same order.
class Strategy {
 public:
  virtual ~Strategy() = default;
  /// Start of a step: clears the gradients (and may check that the previous step finished).
  virtual void zero_grad() = 0;
  /// After loss.backward(): finishes the gradients' synchronization (DDP: averaged in .grad()).
  virtual void after_backward() = 0;
  /// The optimizer's step, with whatever communication it needs; nothing when after_backward() stepped.
  virtual void step() = 0;
  /// Collectives per training step (for benchmark tables).
  virtual int64_t calls_per_step() const = 0;
};

/// Builds a Strategy around `model` (already the same architecture on every rank) that trains with the
/// optimizer `make_optimizer` builds. It must make every rank start from rank 0's parameters.
using MakeStrategy = std::function<std::unique_ptr<Strategy>(ProcessGroup&, std::shared_ptr<torch::nn::Module>,
                                                             const MakeOptimizer&)>;

/// DDP as a Strategy: the GradSync around backward, then one optimizer over every unique parameter.
class DdpStrategy : public Strategy {
 public:
  /// Throws std::invalid_argument when `opt` is null; a null `sync` means no communication at all (the
  /// benchmarks' baseline: each rank trains alone).
  DdpStrategy(std::unique_ptr<GradSync> sync, std::unique_ptr<torch::optim::Optimizer> opt);
  void zero_grad() override;
  void after_backward() override;
  void step() override { opt_->step(); }
  int64_t calls_per_step() const override { return sync_ ? sync_->calls_per_step() : 0; }

 private:
  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
};

/// The MakeStrategy of a DDP stage: `make` builds its GradSync, then one optimizer over every unique
/// parameter of the model (tied weights once).
MakeStrategy ddp_strategy(MakeGradSync make);

/// Each rank trains alone, no communication: the baseline every benchmark compares against.
MakeStrategy no_communication();

}  // namespace dp
