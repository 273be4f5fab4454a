// Units: how a model that can be sharded tells a wrapper where each part of its forward begins and ends.
// LibTorch's C++ modules have no forward hooks (Python's FSDP gathers a unit's weights in a pre-forward
// hook), so a model that can be sharded runs each unit through a runner that the wrapper supplies.
#pragma once

#include "common/base/libtorch.hpp"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dp {

/// How a wrapper that shards a model (FSDP) runs one unit of it. LibTorch's C++ modules have no forward
/// hooks, so a model that can be sharded says where its units begin and end: it calls
/// `run(unit, body)`, and `run` must call `body()` once and return its result. In between, the wrapper
/// may gather the unit's weights first and free them afterwards. An empty runner calls body() directly.
using UnitRunner = std::function<torch::Tensor(size_t unit, const std::function<torch::Tensor()>& body)>;
/// The modules of each unit, in the order forward() runs the units.
using ModuleUnits = std::vector<std::vector<std::shared_ptr<torch::nn::Module>>>;

/// A model whose forward runs in units (the Transformer, ToyFSDPModel): what a wrapper that gathers
/// weights per unit needs, seen through a torch::nn::Module pointer (dynamic_cast).
class UnitModel {
 public:
  virtual ~UnitModel() = default;
  /// forward(), each unit run through `run` (an empty runner: plain forward()).
  virtual torch::Tensor forward_units(const torch::Tensor& x, const UnitRunner& run) = 0;
  /// The modules of units 0, 1, ... in the order forward_units() runs them.
  virtual ModuleUnits units() = 0;
};

/// `m` as a UnitModel, or nullptr when it has no units.
inline UnitModel* as_unit_model(torch::nn::Module& m) { return dynamic_cast<UnitModel*>(&m); }

/// A trainable parameter of a unit and the module that registers it.
struct UnitParameter {
  torch::Tensor param;
  const torch::nn::Module* owner;
};

/// Each unit's trainable parameters (requires_grad; frozen ones are left out), module by module in the
/// order the unit's modules list them, each once: what a wrapper that shards per unit sorts. Throws
/// std::invalid_argument, the message starting with `who`, when a trainable parameter of `model` is in
/// two units or in none.
std::vector<std::vector<UnitParameter>> unit_parameters(const torch::nn::Module& model, const ModuleUnits& units,
                                                        const std::string& who);

/// A unit's trainable tensors: those a wrapper shards over the ranks, and those it keeps whole.
struct TensorUnit {
  std::vector<torch::Tensor> sharded, replicated;
};

/// unit_parameters() of each unit, sorted by the module that registers them: sharded where `is_sharded(module)`,
/// replicated otherwise. Throws what unit_parameters() throws, and std::invalid_argument, the message starting
/// with `who`, when `model` is null or there are no units.
std::vector<TensorUnit> tensor_units(const std::shared_ptr<torch::nn::Module>& model, const ModuleUnits& units,
                                     const std::function<bool(const torch::nn::Module&)>& is_sharded,
                                     const std::string& who);

}  // namespace dp
