// Optimizer state as named tensors, and back (AdamW, Adam, SGD): what a checkpoint stores.
// torch::optim keeps Adam's moments and SGD's momentum in per-class structs keyed by the parameter's
// address; a checkpoint needs them as plain (name, tensor) pairs it can store, send and put back.
#pragma once

#include <nlohmann/json.hpp>
#include "common/base/libtorch.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dp {

/// "adamw", "adam" or "sgd" for those torch::optim optimizers, "custom" for any other.
std::string optimizer_kind(const torch::optim::Optimizer& opt);

/// One parameter's optimizer state.
struct ParamState {
  bool present = false;                          ///< false: no state yet (before the first step; SGD without momentum)
  int64_t step = 0;                              ///< Adam's and AdamW's step count (0 for SGD)
  std::map<std::string, torch::Tensor> tensors;  ///< by name: exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer
};

/// The names of the state tensors an optimizer of `kind` keeps, in a fixed order (max_exp_avg_sq
/// only with amsgrad).
std::vector<std::string> state_tensor_names(const std::string& kind, bool amsgrad);

/// `p`'s state in `opt`. Throws dp::UsageError for a kind of state other than AdamW's, Adam's, SGD's.
ParamState get_param_state(const torch::optim::Optimizer& opt, const torch::Tensor& p);

/// Makes `s` the state of `p` in `opt`, an optimizer of `kind` (optimizer_kind()); removes p's state
/// when `s` is not present.
void set_param_state(torch::optim::Optimizer& opt, const std::string& kind, const torch::Tensor& p, ParamState s);

/// A parameter group's options (lr, betas, eps, weight decay, momentum, ...) as JSON, for the record.
nlohmann::json options_json(const torch::optim::OptimizerOptions& o);

}  // namespace dp
