// Toy models for checking DDP and optimizer sharding (parameter lists that count tied weights once:
// common/model/params.hpp).
//
// All toy models map [N, 10] -> [N, 5]. ToyModel and ToyModelWithTiedWeights follow the models in
// CS336 assignment 2's tests: one has a frozen parameter and one unused parameter, the other shares one
// weight between two layers. A model built twice after the same torch::manual_seed(s) has identical
// values, which is how the tests build a reference model and a DDP replica.
#pragma once

#include "common/model/transformer.hpp"
#include "common/model/units.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dp {

/// Input width of every toy model: x is [N, kToyIn].
constexpr int64_t kToyIn = 10;
/// Output width of every toy model: forward(x) is [N, kToyOut].
constexpr int64_t kToyOut = 5;

/// Common base of the toy models, so that programs can pick one by name (make_toy_model) and
/// call forward() without knowing its type.
struct ToyBase : torch::nn::Module {
  /// x: [N, 10] float -> [N, 5].
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

/// Plain MLP 10 -> 20 -> 20 -> 5: three Linear layers (with bias) and a ReLU between them.
/// 745 parameters in 6 tensors, all trainable.
struct ToyMLPImpl : ToyBase {
  ToyMLPImpl();
  torch::Tensor forward(torch::Tensor x) override;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(ToyMLP);

/// The `fc2` submodule of ToyModel: a Linear(10, 50) registered as `fc`, so its parameters are
/// named `fc2.fc.weight` [50, 10] and `fc2.fc.bias` [50]. The bias is frozen (requires_grad false).
struct ToyFc2Impl : torch::nn::Module {
  ToyFc2Impl();
  /// x: [N, 10] -> [N, 50].
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ToyFc2);

/// CS336's ToyModel: relu(fc1) -> relu(fc2) -> fc3, path 10 -> 10 -> 50 -> 5.
///
/// Parameters, in LibTorch's named_parameters() order (a module's own parameters come before its
/// children's, as in PyTorch):
/// `no_grad_fixed_param` [2] (frozen, never used in forward), `fc1.weight` [10, 10],
/// `fc2.fc.weight` [50, 10], `fc2.fc.bias` [50] (frozen but used), `fc3.weight` [5, 50].
/// Trainable: 850 floats.
struct ToyModelImpl : ToyBase {
  ToyModelImpl();
  torch::Tensor forward(torch::Tensor x) override;
  torch::nn::Linear fc1{nullptr};
  ToyFc2 fc2{nullptr};
  torch::nn::Linear fc3{nullptr};
  torch::Tensor no_grad_fixed_param;
};
TORCH_MODULE(ToyModel);

/// A bias-free linear layer whose weight is another layer's weight: it registers the *same* tensor
/// (same TensorImpl) as its parameter `weight`, so autograd sums the gradients of both uses.
/// (LibTorch refuses to re-register a name that torch::nn::Linear already registered, hence this class.)
struct TiedLinearImpl : torch::nn::Module {
  /// shared: [out, in], the weight to share. x: [N, in] -> [N, out].
  explicit TiedLinearImpl(torch::Tensor shared);
  torch::Tensor forward(torch::Tensor x);
  torch::Tensor weight;
};
TORCH_MODULE(TiedLinear);

/// CS336's ToyModelWithTiedWeights: bias-free fc1 10->10, fc2 10->50, fc3 50->10, fc4 10->50,
/// fc5 50->5; forward relu(fc1) -> relu(fc2) -> relu(fc3) -> relu(fc4) -> fc5.
/// fc4.weight IS fc2.weight. named_parameters() lists 5 entries (fc4.weight included), but the
/// model has 4 distinct tensors, 1350 floats: use unique_parameters().
struct ToyModelWithTiedWeightsImpl : ToyBase {
  ToyModelWithTiedWeightsImpl();
  torch::Tensor forward(torch::Tensor x) override;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  TiedLinear fc4{nullptr};
  torch::nn::Linear fc5{nullptr};
};
TORCH_MODULE(ToyModelWithTiedWeights);

/// CS336 2026's ToyFSDPModel, the model of its FSDP tests: Embedding(100, 64) -> RMSNorm(64) ->
/// Linear 64->128 -> ReLU -> RMSNorm(128) -> Linear 128->64 -> lm_head 64->100, bias-free Linears
/// initialised like the TransformerLM's. 29,376 parameters; tokens [B, T] in [0, 100) -> logits [B, T, 100].
/// Units (forward_units): 0 embedding, 1 norm1 + fc1, 2 norm2 + fc2, 3 lm_head.
struct ToyFSDPModelImpl : torch::nn::Module, UnitModel {
  ToyFSDPModelImpl();
  torch::Tensor forward(const torch::Tensor& tokens) { return forward_units(tokens, {}); }
  torch::Tensor forward_units(const torch::Tensor& tokens, const UnitRunner& run) override;
  ModuleUnits units() override;
  torch::nn::Embedding embedding{nullptr};
  RMSNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, lm_head{nullptr};
};
TORCH_MODULE(ToyFSDPModel);

/// Names accepted by make_toy_model: "mlp", "toy", "tied".
std::vector<std::string> toy_model_names();

/// Builds ToyMLP ("mlp"), ToyModel ("toy") or ToyModelWithTiedWeights ("tied") with the current
/// global RNG state (seed it first for reproducible values). Throws dp::UsageError on any other name.
std::shared_ptr<ToyBase> make_toy_model(const std::string& name);

/// torch's global RNG is one per process. Code that seeds it and then builds models from it holds this
/// mutex for the whole sequence, so that threads of one process cannot interleave their seeding and
/// drawing: the tests run ranks as threads, and the DDP checks (common/ddp_check) seed and build their
/// models on every rank. In the programs every rank is a process of its own and the lock is uncontended.
std::mutex& model_init_mutex();

}  // namespace dp
