// torch::optim state <-> named tensors, for AdamW, Adam and SGD.
#include "common/state/optim_state.hpp"

#include "common/base/c10d_compat.hpp"
#include "common/dist/runtime.hpp"

namespace dp {

namespace optim = torch::optim;

namespace {

using compat::optim_state_key;

template <typename AdamState>
ParamState adam_like(const AdamState& s) {
  ParamState out{true, s.step(), {{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}}};
  if (s.max_exp_avg_sq().defined()) out.tensors["max_exp_avg_sq"] = s.max_exp_avg_sq();
  return out;
}

template <typename AdamState>
std::unique_ptr<optim::OptimizerParamState> make_adam_like(const ParamState& s) {
  auto out = std::make_unique<AdamState>();
  out->step(s.step);
  out->exp_avg(s.tensors.at("exp_avg"));
  out->exp_avg_sq(s.tensors.at("exp_avg_sq"));
  if (s.tensors.count("max_exp_avg_sq")) out->max_exp_avg_sq(s.tensors.at("max_exp_avg_sq"));
  return out;
}

}  // namespace

std::string optimizer_kind(const optim::Optimizer& opt) {
  if (dynamic_cast<const optim::AdamW*>(&opt)) return "adamw";
  if (dynamic_cast<const optim::Adam*>(&opt)) return "adam";
  if (dynamic_cast<const optim::SGD*>(&opt)) return "sgd";
  return "custom";
}

std::vector<std::string> state_tensor_names(const std::string& kind, bool amsgrad) {
  if (kind == "sgd") return {"momentum_buffer"};
  std::vector<std::string> n{"exp_avg", "exp_avg_sq"};
  if (amsgrad) n.push_back("max_exp_avg_sq");
  return n;
}

ParamState get_param_state(const optim::Optimizer& opt, const torch::Tensor& p) {
  auto it = opt.state().find(optim_state_key(p));
  if (it == opt.state().end()) return {};
  const auto* st = it->second.get();
  if (auto* a = dynamic_cast<const optim::AdamWParamState*>(st)) return adam_like(*a);
  if (auto* b = dynamic_cast<const optim::AdamParamState*>(st)) return adam_like(*b);
  if (auto* c = dynamic_cast<const optim::SGDParamState*>(st)) {
    if (!c->momentum_buffer().defined()) return {};
    return {true, 0, {{"momentum_buffer", c->momentum_buffer()}}};
  }
  throw UsageError("checkpoint: the optimizer keeps a kind of state this format does not know");
}

void set_param_state(optim::Optimizer& opt, const std::string& kind, const torch::Tensor& p, ParamState s) {
  auto& state = opt.state();
  const auto key = optim_state_key(p);
  if (!s.present) {
    state.erase(key);
  } else if (kind == "adamw") {
    state[key] = make_adam_like<optim::AdamWParamState>(s);
  } else if (kind == "adam") {
    state[key] = make_adam_like<optim::AdamParamState>(s);
  } else {
    auto sgd = std::make_unique<optim::SGDParamState>();
    sgd->momentum_buffer(s.tensors.at("momentum_buffer"));
    state[key] = std::move(sgd);
  }
}

nlohmann::json options_json(const optim::OptimizerOptions& o) {
  if (auto* a = dynamic_cast<const optim::AdamWOptions*>(&o))
    return {{"lr", a->lr()},
            {"betas", {std::get<0>(a->betas()), std::get<1>(a->betas())}},
            {"eps", a->eps()},
            {"weight_decay", a->weight_decay()},
            {"amsgrad", a->amsgrad()}};
  if (auto* b = dynamic_cast<const optim::AdamOptions*>(&o))
    return {{"lr", b->lr()},
            {"betas", {std::get<0>(b->betas()), std::get<1>(b->betas())}},
            {"eps", b->eps()},
            {"weight_decay", b->weight_decay()},
            {"amsgrad", b->amsgrad()}};
  if (auto* c = dynamic_cast<const optim::SGDOptions*>(&o))
    return {{"lr", c->lr()},
            {"momentum", c->momentum()},
            {"dampening", c->dampening()},
            {"weight_decay", c->weight_decay()},
            {"nesterov", c->nesterov()}};
  return {{"lr", o.get_lr()}};
}

}  // namespace dp
