// Toy models and tie-aware parameter lists.
//
// The toy models are small enough that every rank can hold a full copy and a test can compare a DDP
// run with a single-process run value by value. Each one exercises a case that a naive DDP gets wrong:
// a frozen parameter (no gradient to all-reduce), an unused parameter (never gets a gradient at all)
// and a weight shared by two layers (one tensor, two names).
#include "common/model/models.hpp"

#include "common/base/errors.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dp {

namespace F = torch::nn::functional;

// --- ToyMLP -----------------------------------------------------------------------------------

ToyMLPImpl::ToyMLPImpl() {
  fc1 = register_module("fc1", torch::nn::Linear(kToyIn, 20));
  fc2 = register_module("fc2", torch::nn::Linear(20, 20));
  fc3 = register_module("fc3", torch::nn::Linear(20, kToyOut));
}

torch::Tensor ToyMLPImpl::forward(torch::Tensor x) {
  x = torch::relu(fc1(x));  // [N, 20]
  x = torch::relu(fc2(x));  // [N, 20]
  return fc3(x);            // [N, 5]
}

// --- ToyModel ---------------------------------------------------------------------------------

ToyFc2Impl::ToyFc2Impl() {
  fc = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(kToyIn, 50).bias(true)));
  // Frozen, yet part of the forward pass: the bias shifts the activations but must never be
  // updated, so DDP has to skip it when it all-reduces gradients.
  fc->bias.set_requires_grad(false);
}

torch::Tensor ToyFc2Impl::forward(torch::Tensor x) { return fc(x); }

ToyModelImpl::ToyModelImpl() {
  fc1 = register_module("fc1", torch::nn::Linear(torch::nn::LinearOptions(kToyIn, kToyIn).bias(false)));
  fc2 = register_module("fc2", ToyFc2());
  fc3 = register_module("fc3", torch::nn::Linear(torch::nn::LinearOptions(50, kToyOut).bias(false)));
  // Registered but never read by forward(): its .grad stays undefined after backward, which a DDP
  // that waits for "every parameter's gradient" would wait on forever.
  no_grad_fixed_param = register_parameter("no_grad_fixed_param", torch::tensor({2.0f, 2.0f}),
                                           /*requires_grad=*/false);
}

torch::Tensor ToyModelImpl::forward(torch::Tensor x) {
  x = torch::relu(fc1(x));  // [N, 10]
  x = torch::relu(fc2(x));  // [N, 50]
  return fc3(x);            // [N, 5]
}

// --- ToyModelWithTiedWeights ------------------------------------------------------------------

TiedLinearImpl::TiedLinearImpl(torch::Tensor shared) {
  // register_parameter stores the handle it is given, so this module's "weight" and the owner's
  // weight are one TensorImpl: one .grad, one optimizer state, two names.
  weight = register_parameter("weight", std::move(shared));
}

torch::Tensor TiedLinearImpl::forward(torch::Tensor x) { return F::linear(x, weight); }

ToyModelWithTiedWeightsImpl::ToyModelWithTiedWeightsImpl() {
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  fc1 = register_module("fc1", linear(kToyIn, 10));
  fc2 = register_module("fc2", linear(10, 50));
  fc3 = register_module("fc3", linear(50, 10));
  fc4 = register_module("fc4", TiedLinear(fc2->weight));  // [50, 10], the same tensor as fc2's
  fc5 = register_module("fc5", linear(50, kToyOut));
}

torch::Tensor ToyModelWithTiedWeightsImpl::forward(torch::Tensor x) {
  x = torch::relu(fc1(x));  // [N, 10]
  x = torch::relu(fc2(x));  // [N, 50]  first use of the shared weight
  x = torch::relu(fc3(x));  // [N, 10]
  x = torch::relu(fc4(x));  // [N, 50]  second use: its gradient adds to the first
  return fc5(x);            // [N, 5]
}

// --- Choosing a model by name ------------------------------------------------------------------

std::vector<std::string> toy_model_names() { return {"mlp", "toy", "tied"}; }

std::shared_ptr<ToyBase> make_toy_model(const std::string& name) {
  if (name == "mlp") return std::make_shared<ToyMLPImpl>();
  if (name == "toy") return std::make_shared<ToyModelImpl>();
  if (name == "tied") return std::make_shared<ToyModelWithTiedWeightsImpl>();
  throw UsageError(fmt::format("unknown toy model '{}'; valid names: {}", name, fmt::join(toy_model_names(), ", ")));
}

// --- CS336 2026's ToyFSDPModel: the Transformer's pieces, four units --------------------------------

ToyFSDPModelImpl::ToyFSDPModelImpl() {
  embedding = register_module("embedding", torch::nn::Embedding(100, 64));
  trunc_normal_(embedding->weight, 1.0);
  norm1 = register_module("norm1", RMSNorm(64));
  fc1 = register_module("fc1", make_linear(64, 128));
  norm2 = register_module("norm2", RMSNorm(128));
  fc2 = register_module("fc2", make_linear(128, 64));
  lm_head = register_module("lm_head", make_linear(64, 100));
}

torch::Tensor ToyFSDPModelImpl::forward_units(const torch::Tensor& tokens, const UnitRunner& run) {
  auto x = run_unit(run, 0, [&] { return embedding(tokens); });      // [B, T, 64]
  x = run_unit(run, 1, [&] { return torch::relu(fc1(norm1(x))); });  // [B, T, 128]
  x = run_unit(run, 2, [&] { return fc2(norm2(x)); });               // [B, T, 64]
  return run_unit(run, 3, [&] { return lm_head(x); });               // [B, T, 100]
}

ModuleUnits ToyFSDPModelImpl::units() {
  return {{embedding.ptr()}, {norm1.ptr(), fc1.ptr()}, {norm2.ptr(), fc2.ptr()}, {lm_head.ptr()}};
}

std::mutex& model_init_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace dp
