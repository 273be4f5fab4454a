// The contract of a way of training data-parallel, seen from the training loop: what happens around
// forward and backward, and who steps the optimizer. DDP (a GradSync, then one optimizer over all
// parameters) is one implementation; a scheme that steps inside the synchronization, or that shards the
// optimizer, is another, and the same check and benchmark serve them all.
#pragma once

#include "common/contract/clip.hpp"
#include "common/contract/grad_sync.hpp"
#include "common/dist/dist.hpp"
#include "common/measure/accounting.hpp"
#include "common/model/units.hpp"
#include "common/state/full_state.hpp"

#include "common/base/libtorch.hpp"

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dp {

/// Builds the optimizer of a list of parameters: all of a model's, one parameter's, or a shard's. A
/// Strategy is given one and decides over which parameters to build it, and how many times.
using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

/// One training step of a data-parallel scheme, on every rank:
///
///     s.zero_grad(); loss(model->forward_units(x_local, s.runner())).backward(); s.after_backward(); s.step();
///
/// (a model without units runs plain forward(); only schemes that shard parameters need the runner).
/// With K micro-batches accumulated into one step, each backward is followed by after_backward():
///
///     s.zero_grad();
///     for k < K: s.set_requires_gradient_sync(k == K - 1); (loss_k / K).backward(); s.after_backward();
///     s.step();
///
/// After step() every rank's model must equal single-process training on the whole batch with the
/// optimizer the Strategy was built with (dp::check_strategy() checks it), and every rank must issue
/// the same collectives in the same order. Besides the step, a Strategy says what it holds and sends
/// (for the accounting), describes itself, and gives its state in full and takes it back (for checks
/// and checkpoints, at any world size and from any other Strategy). Feature-specific calls (a
/// communication hook, bucket order) stay on the classes.
class Strategy {
 public:
  virtual ~Strategy() = default;
  /// Start of a step: clears the gradients (and may check that the previous step finished).
  virtual void zero_grad() = 0;
  /// What forward runs its units through (FSDP gathers a unit's weights there); empty when the scheme
  /// keeps whole parameters, and then forward_units(x, {}) is plain forward.
  virtual UnitRunner runner() { return {}; }
  /// After loss.backward(): finishes the gradients' synchronization (DDP: averaged in .grad()).
  virtual void after_backward() = 0;
  /// false: the backward passes that follow may only accumulate locally, and the next after_backward()s
  /// may leave the gradients unsynchronized (PyTorch's no_sync(), FSDP2's set_requires_gradient_sync);
  /// true (the default): the next backward synchronizes everything accumulated. A scheme that ignores it
  /// synchronizes every micro-batch: the same result, K times the traffic.
  virtual void set_requires_gradient_sync(bool /*sync*/) {}
  /// The optimizer's step, with whatever communication it needs; nothing when after_backward() stepped.
  virtual void step() = 0;
  /// Collectives per training step (for benchmark tables; a scheme that counts them as it goes gives
  /// the last step's, 0 before the first).
  virtual int64_t calls_per_step() const = 0;
  /// Bytes this rank holds between steps, measured from its tensors: parameters (what the model or the
  /// scheme keeps resident), gradients, optimizer state (0 before the optimizer's first step).
  virtual TrainingBytes bytes() const = 0;
  /// Bytes of the buffers it keeps between steps for communication, on top of bytes(): stage 05's buckets,
  /// ZeRO-1's chunk gradient and all-to-all buffer; 0 for a scheme that keeps none.
  virtual double buffer_bytes() const { return 0; }
  /// Bytes of parameters gathered whole for compute, at their peak so far, on top of bytes(): FSDP's units
  /// in flight; 0 for a scheme that keeps whole parameters resident.
  virtual double gathered_peak_bytes() const { return 0; }
  /// Bytes this rank sends per step over the network (common/measure/accounting.hpp's formula of the scheme,
  /// or what it counted in the last step).
  virtual double sent_bytes_per_step() const = 0;
  /// One line: the scheme and its settings.
  virtual std::string describe() const = 0;
  /// The dtype in which forward and backward compute with module `m`'s own parameters: float32 unless the
  /// scheme casts them (FSDP's bf16 compute casts Linear and Embedding weights). A single-process reference
  /// casts alike (dp::reference_backward()), so that a check compares like with like.
  virtual torch::ScalarType compute_dtype(const torch::nn::Module& /*m*/) const { return torch::kFloat32; }
  /// Every trainable parameter in full (tied ones once, in named_parameters() order, fp32), the same on
  /// every rank: what a check compares and a checkpoint stores. A collective: every rank calls it.
  virtual std::vector<std::pair<std::string, torch::Tensor>> full_parameters() = 0;
  /// The parameters in full (as full_parameters(), copied) and each one's optimizer state in full: what
  /// a checkpoint stores. A collective.
  virtual FullState full_state() = 0;
  /// full_state() for a reader done before anything trains again (a checkpoint being written): a scheme in
  /// which this rank holds everything returns its live tensors, not copies, so saving needs no second copy
  /// of the state in memory. Default: full_state(). A collective.
  virtual FullState full_state_view() { return full_state(); }
  /// Installs `s` (from any Strategy, any world size: every rank passes the same) into the model and
  /// the optimizer, each rank keeping what it holds. Throws std::invalid_argument, before changing
  /// anything, when its names or shapes differ from the model's. Not a collective.
  virtual void load_full_state(const FullState& s) = 0;
  /// The optimizers that step (one; one per parameter; one per shard or bucket): where a learning-rate
  /// schedule sets each group's rate (set_learning_rate()).
  virtual std::vector<torch::optim::Optimizer*> optimizers() = 0;
  /// Where the gradient the optimizer applies lives when it steps (common/contract/clip.hpp): what clipping
  /// needs. The default throws dp::UsageError (such a scheme cannot clip): a scheme whose optimizers step during
  /// backward, for one, has no moment at which the whole gradient is known.
  virtual GradientSpread gradient_spread();

  /// From the next step on, clip the gradient's global L2 norm to `max_norm` as torch.nn.utils.clip_grad_norm_
  /// does on one process (0: no clipping). The scheme clips where its gradient is final, just before its
  /// optimizer steps (ZeRO-1: after the reduce-scatter inside step()). Throws dp::UsageError for a negative or
  /// non-finite value, or a scheme that cannot clip (gradient_spread()).
  void set_max_grad_norm(double max_norm);
  /// The norm before clipping in the last step (NaN before the first clipped step).
  double last_grad_norm() const { return last_grad_norm_; }

 protected:
  /// Each step() calls it where the gradient is final, before its optimizer steps: clips when asked.
  void clip_before_step();

 private:
  double max_grad_norm_ = 0;
  double last_grad_norm_ = std::nan("");
};

/// Sets the learning rate of every parameter group of every optimizer of `s`.
void set_learning_rate(Strategy& s, double lr);

/// The full state of a scheme in which this rank holds everything: `model`'s trainable parameters and
/// their state in `opt`, copied; with `copy` false the live tensors themselves (each one a whole storage:
/// a view into a larger buffer is copied, since a serializer writes a tensor's whole storage).
FullState whole_state(torch::nn::Module& model, const torch::optim::Optimizer& opt, bool copy = true);

/// Throws std::invalid_argument naming the first difference when `s` does not hold one state for each of
/// `model`'s trainable parameters, with the same names and shapes in the same order.
void check_full_state(torch::nn::Module& model, const FullState& s);

/// Copies `s`'s parameters into `model` (after check_full_state()), then returns the model's trainable
/// parameters, in `s`'s order, for the caller to install their optimizer state.
std::vector<torch::Tensor> load_parameters(torch::nn::Module& model, const FullState& s);

/// Builds a Strategy around `model` (already the same architecture on every rank) that trains with the
/// optimizer `make_optimizer` builds. It must make every rank start from rank 0's parameters.
using MakeStrategy =
    std::function<std::unique_ptr<Strategy>(ProcessGroup&, std::shared_ptr<torch::nn::Module>, const MakeOptimizer&)>;

/// DDP as a Strategy: the GradSync around backward, then one optimizer over every unique parameter.
class DdpStrategy : public Strategy {
 public:
  /// Throws std::invalid_argument when `model` or `opt` is null; a null `sync` means no communication at
  /// all (the benchmarks' baseline: each rank trains alone). `name` is what describe() calls it.
  DdpStrategy(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, std::unique_ptr<GradSync> sync,
              std::unique_ptr<torch::optim::Optimizer> opt, std::string name = "DDP");
  void zero_grad() override;
  void after_backward() override;
  /// The GradSync's switch (stage 05's buckets accumulate locally; the others synchronize every micro-batch).
  void set_requires_gradient_sync(bool sync) override {
    if (sync_) sync_->set_requires_gradient_sync(sync);
  }
  void step() override {
    clip_before_step();
    opt_->step();
  }
  int64_t calls_per_step() const override { return sync_ ? sync_->calls_per_step() : 0; }
  /// count_training_bytes(model, optimizer): every rank holds everything (16P with AdamW).
  TrainingBytes bytes() const override;
  /// ddp_bytes_per_step(P, N): one all-reduce of every gradient, however it is cut; 0 without a sync.
  double sent_bytes_per_step() const override;
  /// The GradSync's buffers (stage 05's buckets).
  double buffer_bytes() const override { return sync_ ? static_cast<double>(sync_->buffer_bytes()) : 0.0; }
  std::string describe() const override;
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() override;
  FullState full_state() override { return whole_state(*model_, *opt_); }
  FullState full_state_view() override { return whole_state(*model_, *opt_, /*copy=*/false); }
  void load_full_state(const FullState& s) override;
  std::vector<torch::optim::Optimizer*> optimizers() override { return {opt_.get()}; }
  /// Every parameter whole and equal on every rank once the GradSync finished: the norm needs no communication.
  GradientSpread gradient_spread() override;

 private:
  ProcessGroup& pg_;
  std::shared_ptr<torch::nn::Module> model_;
  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::string name_;
};

/// The model's trainable parameters, tied ones once, named and detached (copied with `copy`): what
/// full_parameters() (full_state()) gives for a scheme in which every rank holds whole parameters.
std::vector<std::pair<std::string, torch::Tensor>> whole_parameters(torch::nn::Module& model, bool copy = false);

/// The MakeStrategy of a DDP stage: `make` builds its GradSync, then one optimizer over every unique
/// parameter of the model (tied weights once).
MakeStrategy ddp_strategy(MakeGradSync make, std::string name = "DDP");

/// `make`'s strategies with set_max_grad_norm(max_norm) called once built (0: no clipping): every variant of a
/// benchmark clipping alike.
MakeStrategy with_max_grad_norm(MakeStrategy make, double max_norm);

/// Each rank trains alone, no communication: the baseline every benchmark compares against.
MakeStrategy no_communication();

}  // namespace dp
