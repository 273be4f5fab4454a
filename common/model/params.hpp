// Parameter lists that count a tied weight once, and the small utilities built on them. LibTorch's
// parameters() lists a tied weight under every name it is registered with: summing, all-reducing or
// sharding that list would treat it twice.
#pragma once

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dp {

/// The distinct parameters of `m` in named_parameters() order, each tensor once (first occurrence
/// kept; identity is the TensorImpl, so tied weights count once). LibTorch's parameters() lists a
/// tied weight under every name it is registered with; summing or all-reducing that list would
/// count it twice. With trainable_only, parameters with requires_grad false are left out.
std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& m, bool trainable_only = false);

/// A shape as people write it, "[10, 5]" (for messages).
std::string shape_text(c10::IntArrayRef sizes);

/// Copies `src`'s unique parameter values into `dst`, a model of the same structure (frozen ones too):
/// the C++ stand-in for Python's copy.deepcopy of the weights. No autograd history is recorded.
void copy_parameters(torch::nn::Module& dst, const torch::nn::Module& src);

/// unique_parameters() with the dotted name of each tensor's first registration ("fc2.fc.weight").
std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters(const torch::nn::Module& m,
                                                                           bool trainable_only = false);

/// A model as tensors: its distinct parameters with their dotted names (tied weights once, frozen ones too) and its
/// buffers, in registration order. What the DDP classes need of a model, whoever built it: model_tensors() of a
/// C++ module, or a Python nn.Module's named_parameters() and buffers() handed over by the package in python/.
struct ModelTensors {
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
  std::vector<torch::Tensor> buffers;
};

/// unique_named_parameters() and the buffers of `m`. Throws std::invalid_argument naming `who` when m is null.
ModelTensors model_tensors(const std::shared_ptr<torch::nn::Module>& m, const char* who);

/// Total number of elements of the tensors (e.g. a model's parameter count).
int64_t count_elements(const std::vector<torch::Tensor>& tensors);

/// FNV-1a (common/base/hash.hpp's fnv1a64) over the bytes of every trainable unique parameter of `m`
/// in turn, from `basis` (FNV's offset basis, kFnv1a64Basis, by default): equal on two ranks exactly when
/// their replicas are bit-identical, barring a 64-bit collision.
uint64_t parameter_hash(const torch::nn::Module& m, uint64_t basis = 0xcbf29ce484222325ULL);

}  // namespace dp
