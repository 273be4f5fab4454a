// Toy models and tie-aware parameter lists.
//
// The toy models are small enough that every rank can hold a full copy and a test can compare a DDP
// run with a single-process run value by value. Each one exercises a case that a naive DDP gets wrong:
// a frozen parameter (no gradient to all-reduce), an unused parameter (never gets a gradient at all)
// and a weight shared by two layers (one tensor, two names).
#include "common/models.hpp"

#include "common/runtime.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_set>

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
  throw UsageError(fmt::format("unknown toy model '{}'; valid names: {}", name,
                               fmt::join(toy_model_names(), ", ")));
}

std::mutex& model_init_mutex() {
  static std::mutex m;
  return m;
}

// --- Parameter lists that count a tied weight once ---------------------------------------------

std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters(const torch::nn::Module& m,
                                                                           bool trainable_only) {
  // named_parameters() walks the module tree (own parameters first, then each child in
  // registration order) and keys entries by dotted name, so a tied weight appears once per name.
  // The TensorImpl pointer identifies the tensor itself; keep its first name only.
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    if (trainable_only && !p.requires_grad()) continue;
    out.emplace_back(item.key(), p);
  }
  return out;
}

std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& m, bool trainable_only) {
  std::vector<torch::Tensor> out;
  for (auto& named : unique_named_parameters(m, trainable_only)) out.push_back(named.second);
  return out;
}

int64_t count_elements(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

void copy_parameters(torch::nn::Module& dst, const torch::nn::Module& src) {
  torch::NoGradGuard no_grad;
  auto d = unique_parameters(dst), s = unique_parameters(src);
  for (size_t i = 0; i < d.size(); ++i) d[i].copy_(s[i]);
}

std::string shape_text(c10::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

}  // namespace dp
