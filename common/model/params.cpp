// Parameter lists that count a tied weight once.
#include "common/model/params.hpp"

#include "common/base/hash.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <unordered_set>

namespace dp {

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

ModelTensors model_tensors(const std::shared_ptr<torch::nn::Module>& m, const char* who) {
  if (!m) throw std::invalid_argument(std::string(who) + ": module is null");
  return {unique_named_parameters(*m), m->buffers(/*recurse=*/true)};
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

static_assert(kFnv1a64Basis == 0xcbf29ce484222325ULL, "parameter_hash()'s default basis (params.hpp) is FNV's");

uint64_t parameter_hash(const torch::nn::Module& m, uint64_t basis) {
  uint64_t h = basis;
  for (const auto& p : unique_parameters(m, /*trainable_only=*/true)) {
    const auto c = p.detach().contiguous();
    h = fnv1a64(c.data_ptr(), c.nbytes(), h);
  }
  return h;
}

}  // namespace dp
