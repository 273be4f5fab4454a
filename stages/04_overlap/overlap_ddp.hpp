// Stage 04: start each gradient's all-reduce from inside backward, as soon as that gradient is final.
//
// Stage 03 waited for backward to finish and then communicated; the network sat idle during backward
// and the CPU sat idle during communication. Here a hook on every parameter (common/comm/grad_hooks.hpp)
// launches an asynchronous all-reduce the moment autograd has finished that parameter's gradient, so the
// all-reduce of the last layer's gradient runs while autograd still computes the gradients of the earlier
// layers.
// finish_gradient_synchronization() (after_backward()) then only waits for what is still in flight.
#pragma once

#include "common/comm/grad_hooks.hpp"
#include "common/contract/grad_sync.hpp"
#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dp {

/// Data parallelism with one asynchronous all-reduce per parameter, launched from autograd hooks.
///
/// Usage, on every rank:
///   auto ddp = std::make_shared<OverlapDdp>(pg, model);   // model: your shared_ptr (keep it for forward)
///   loop: ddp->on_train_batch_start(); opt.zero_grad(); loss = f(model->forward(x_local)); loss.backward();
///         ddp->finish_gradient_synchronization(); opt.step();
/// Every trainable parameter's gradient then holds the average over ranks. The process group must
/// outlive this object. Frozen parameters (requires_grad false) are broadcast but never hooked.
class OverlapDdp : public GradSync {
 public:
  /// Broadcasts rank 0's parameters and buffers to every rank, then hooks each unique trainable parameter.
  OverlapDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> module);
  /// The same for a model given as tensors (module stays null): a Python nn.Module's, through python/.
  OverlapDdp(ProcessGroup& pg, const ModelTensors& model);
  /// Removes the hooks (hooks_, the last member, goes first). Does not wait for collectives still in
  /// flight (they keep their tensors alive). Not copyable (its mutex and hooks are not).
  ~OverlapDdp() override = default;

  /// The wrapped model. Call forward on your own typed pointer to it (torch::nn::Module has no
  /// virtual forward); its parameters are the ones being synchronized.
  std::shared_ptr<torch::nn::Module> module;

  /// Throws std::logic_error when the previous step's gradients were never finished.
  void on_train_batch_start() override;
  /// Same as finish_gradient_synchronization().
  void after_backward() override { finish_gradient_synchronization(); }
  /// One all-reduce per trainable parameter tensor.
  int64_t calls_per_step() const override { return static_cast<int64_t>(params_.size()); }
  /// Waits for every launched all-reduce and divides the gradients by the world size. A trainable
  /// parameter whose hook did not run in this backward (unused in forward) is all-reduced here with its
  /// current .grad() (zeros if it has none). Does nothing when no hook ran since the last call.
  void finish_gradient_synchronization();

  /// The unique trainable parameters in registration order (tied weights once): the hooked ones.
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  /// Their dotted names, same order.
  const std::vector<std::string>& parameter_names() const { return names_; }
  /// All-reduces launched since construction. Lock-free: may be read from another autograd hook.
  int64_t launched_count() const { return log_.total(); }
  /// The launches of the step in progress or, between steps, of the last finished step, in launch order.
  std::vector<LaunchRecord> launches() const { return log_.step(); }

 private:
  void check_not_ready(size_t i);    // pre-hook: already ready this step? then a second backward
  void on_gradient_ready(size_t i);  // post-hook: .grad() is final, launch its all-reduce
  void launch(size_t i, bool during_backward);

  struct Pending {
    Work work;
    torch::Tensor grad;  // the tensor being reduced in place (same storage as the parameter's .grad())
  };

  ProcessGroup& pg_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;

  mutable std::mutex mu_;         // hooks run on autograd's thread (another thread for CUDA tensors)
  bool in_step_ = false;          // a synchronization began; finish not called yet
  std::vector<char> launched_;    // per parameter, this step
  std::vector<Pending> pending_;  // in launch order
  LaunchLog log_;                 // for launched_count() and launches()

  std::unique_ptr<AccumulateGradHooks> hooks_;  // last member: destroyed first, before the state it uses
};

}  // namespace dp
