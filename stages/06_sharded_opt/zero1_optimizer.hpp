// Zero1Optimizer: ZeRO stage 1 as the ZeRO paper describes it.
// All trainable parameters live in one flat fp32 buffer, padded to a multiple of the world size and cut
// into equal chunks; so do their gradients. A step reduce-scatters the gradient buffer (each rank gets the
// sum of its own chunk), steps the chunk with an ordinary torch::optim optimizer, and all-gathers the
// parameter buffer. That is DDP's own traffic, 2 x (N-1)/N x 4P bytes per rank, where the CS336 design
// (extension 06b: all-reduce every gradient, step the owned tensors, broadcast them) moves 3 x (N-1)/N x 4P.
#pragma once

#include "common/comm/shard_comm.hpp"
#include "common/contract/strategy.hpp"  // MakeOptimizer
#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dp {

/// ZeRO-1 over flat buffers, around any torch::optim optimizer.
///
/// - The model's trainable parameters (tied weights once; frozen ones left alone) become views of one flat
///   buffer, their gradients views of another: backward accumulates straight into the gradient buffer.
/// - The local optimizer has one parameter: this rank's chunk of the parameter buffer (a leaf that aliases
///   it), whose .grad is this rank's chunk of the summed gradients divided by N. Its state is 1/N of the
///   unsharded state, and it is built by `make_local` (the MakeOptimizer every Strategy is given) over that
///   one tensor.
/// - Gradients: each rank passes its own (DDP's gradient averaging is part of step()). The CS336 test,
///   where every rank computes the same full gradient, works too: N equal copies summed, divided by N.
/// - One parameter group with one set of options (the local optimizer's defaults).
class Zero1Optimizer {
 public:
  Zero1Optimizer(ProcessGroup& pg, const std::vector<torch::Tensor>& params, const MakeOptimizer& make_local,
                 ReduceScatterHow how = {});

  /// `Zero1Optimizer::make<torch::optim::AdamW>(pg, model->parameters(), AdamWOptions(1e-3))`.
  template <typename Opt, typename Options>
  static std::unique_ptr<Zero1Optimizer> make(ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                                              const Options& defaults) {
    return std::make_unique<Zero1Optimizer>(pg, params, [defaults](std::vector<torch::Tensor> chunk) {
      return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<Opt>(std::move(chunk), defaults));
    });
  }

  Zero1Optimizer(const Zero1Optimizer&) = delete;
  Zero1Optimizer& operator=(const Zero1Optimizer&) = delete;

  /// Reduce-scatters the gradients (sum / N), steps this rank's chunk, all-gathers the parameters into
  /// the model. A collective: every rank calls it.
  void step();
  /// Runs `f` inside step(), between the reduce-scatter and the local step, when this rank's chunk holds the
  /// averaged gradient: where stage 10's gradient clipping (Strategy::set_max_grad_norm()) scales it.
  void set_before_local_step(std::function<void()> f) { before_local_step_ = std::move(f); }
  /// Zeroes the gradient buffer (every parameter's gradient). Local.
  void zero_grad();

  /// This rank's optimizer; its only parameter is shard().
  torch::optim::Optimizer& local() { return *local_; }
  const torch::optim::Optimizer& local() const { return *local_; }
  /// This rank's chunk of the flat parameter buffer (the tensor the local optimizer steps).
  const torch::Tensor& shard() const { return shard_; }
  /// The split of the flat buffers over the ranks.
  const FlatLayout& layout() const { return layout_; }
  /// The distinct trainable parameters, in the order of the flat buffer.
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  /// Bytes of the buffers this design adds: the shard's gradient and the all-to-all's receive buffer
  /// (the whole padded buffer; none with a native reduce_scatter).
  int64_t buffer_bytes() const;
  /// "adamw", "adam", "sgd" or "custom".
  const std::string& kind() const { return kind_; }
  /// A few lines: the optimizer, the layout, the reduce-scatter in use.
  std::string describe() const;

 private:
  void gather_gradients();  // brings gradients that backward did not write into the buffer there
  ProcessGroup* pg_;
  ReduceScatterHow algo_;  // how step() reduce-scatters: an algorithm, or a caller's (extension 07c's)
  std::vector<torch::Tensor> params_;
  std::vector<int64_t> offsets_;  // params_[i] starts at offsets_[i] in the flat buffers
  FlatLayout layout_;
  torch::Tensor flat_params_, flat_grads_, scratch_, shard_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::string kind_;
  std::function<void()> before_local_step_;
};

/// The tensors a flat-buffer ZeRO-1 shards: trainable ones, a tied weight once, in the order given. Throws
/// dp::UsageError naming `who` when one is not a float32 leaf on `device`.
std::vector<torch::Tensor> flattenable_parameters(const std::vector<torch::Tensor>& params, const torch::Device& device,
                                                  const std::string& who);

}  // namespace dp
