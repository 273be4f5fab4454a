#include "common/contract/strategy.hpp"

#include "common/base/errors.hpp"
#include "common/base/format.hpp"
#include "common/measure/memory.hpp"
#include "common/model/params.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <stdexcept>

namespace dp {

GradientSpread Strategy::gradient_spread() {
  throw UsageError(
      fmt::format("{} cannot clip gradients: it does not say where its gradient lives when its optimizer steps "
                  "(Strategy::gradient_spread()); drop --clip-grad-norm, or train with DDP, ZeRO-1, FSDP or HSDP",
                  describe()));
}

void Strategy::set_max_grad_norm(double max_norm) {
  if (!std::isfinite(max_norm) || max_norm < 0)
    throw UsageError(
        fmt::format("the gradient-norm limit must be a finite number >= 0 (0: no clipping), got {}; "
                    "e.g. --clip-grad-norm 1.0",
                    max_norm));
  if (max_norm > 0) gradient_spread();  // a scheme that cannot clip says so now, before any step
  max_grad_norm_ = max_norm;
}

void Strategy::clip_before_step() {
  if (max_grad_norm_ > 0) last_grad_norm_ = clip_grad_norm(gradient_spread(), max_grad_norm_);
}

DdpStrategy::DdpStrategy(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, std::unique_ptr<GradSync> sync,
                         std::unique_ptr<torch::optim::Optimizer> opt, std::string name)
    : pg_(pg), model_(std::move(model)), sync_(std::move(sync)), opt_(std::move(opt)), name_(std::move(name)) {
  if (!model_) throw std::invalid_argument("DdpStrategy: the model is null");
  if (!opt_) throw std::invalid_argument("DdpStrategy: the optimizer is null");
}

void DdpStrategy::zero_grad() {
  if (sync_) sync_->on_train_batch_start();  // stages 04 and 05 check that the last step finished
  opt_->zero_grad();
}

void DdpStrategy::after_backward() {
  if (sync_) sync_->after_backward();
}

GradientSpread DdpStrategy::gradient_spread() { return {{}, unique_parameters(*model_, true), nullptr}; }

TrainingBytes DdpStrategy::bytes() const { return count_training_bytes(*model_, *opt_); }

double DdpStrategy::sent_bytes_per_step() const {
  return sync_ ? ddp_bytes_per_step(count_elements(unique_parameters(*model_, true)), pg_.world_size()) : 0.0;
}

std::string DdpStrategy::describe() const {
  return sync_ ? name_ + " over " + count_of(pg_.world_size(), "rank") + ", " +
                     count_of(calls_per_step(), "collective") + " per step"
               : "each rank alone (no communication)";
}

std::vector<std::pair<std::string, torch::Tensor>> DdpStrategy::full_parameters() { return whole_parameters(*model_); }

std::vector<std::pair<std::string, torch::Tensor>> whole_parameters(torch::nn::Module& model, bool copy) {
  auto named = unique_named_parameters(model, /*trainable_only=*/true);
  for (auto& [name, p] : named) p = copy ? p.detach().clone() : p.detach();
  return named;
}

void DdpStrategy::load_full_state(const FullState& s) {
  set_local_states(*opt_, load_parameters(*model_, s), s.optimizer);
}

void set_learning_rate(Strategy& s, double lr) {
  for (auto* opt : s.optimizers())
    for (auto& g : opt->param_groups()) g.options().set_lr(lr);
}

FullState whole_state(torch::nn::Module& model, const torch::optim::Optimizer& opt, bool copy) {
  FullState s;
  s.params = whole_parameters(model, copy);
  s.optimizer = local_states(opt, unique_parameters(model, /*trainable_only=*/true), copy);
  if (!copy) {
    auto own = [](torch::Tensor& t) {
      if (t.storage().nbytes() != t.nbytes()) t = t.clone();
    };
    for (auto& [name, p] : s.params) own(p);
    for (auto& st : s.optimizer)
      for (auto& [key, t] : st.tensors) own(t);
  }
  return s;
}

void check_full_state(torch::nn::Module& model, const FullState& s) {
  const auto named = unique_named_parameters(model, /*trainable_only=*/true);
  if (s.params.size() != named.size() || s.optimizer.size() != named.size())
    throw std::invalid_argument(fmt::format("a full state of {} parameters ({} optimizer states) for a model of {}",
                                            s.params.size(), s.optimizer.size(), named.size()));
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, p] = named[i];
    if (s.params[i].first != name || s.params[i].second.sizes() != p.sizes())
      throw std::invalid_argument(fmt::format("full state: parameter {} is {} [{}], the model's is {} [{}]", i,
                                              s.params[i].first, fmt::join(s.params[i].second.sizes(), "x"), name,
                                              fmt::join(p.sizes(), "x")));
  }
}

std::vector<torch::Tensor> load_parameters(torch::nn::Module& model, const FullState& s) {
  check_full_state(model, s);
  auto params = unique_parameters(model, /*trainable_only=*/true);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(s.params[i].second);
  return params;
}

MakeStrategy ddp_strategy(MakeGradSync make, std::string name) {
  if (!make) throw std::invalid_argument("ddp_strategy: no GradSync factory");
  return [make = std::move(make), name = std::move(name)](
             ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
             const MakeOptimizer& make_optimizer) -> std::unique_ptr<Strategy> {
    auto sync = make(pg, model);  // broadcasts rank 0's weights before the optimizer sees them
    auto opt = make_optimizer(unique_parameters(*model));
    return std::make_unique<DdpStrategy>(pg, model, std::move(sync), std::move(opt), name);
  };
}

MakeStrategy no_communication() {
  return [](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
            const MakeOptimizer& make_optimizer) -> std::unique_ptr<Strategy> {
    auto opt = make_optimizer(unique_parameters(*model));
    return std::make_unique<DdpStrategy>(pg, model, nullptr, std::move(opt));
  };
}

MakeStrategy with_max_grad_norm(MakeStrategy make, double max_norm) {
  return [make = std::move(make), max_norm](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
                                            const MakeOptimizer& opt) {
    auto s = make(pg, std::move(model), opt);
    s->set_max_grad_norm(max_norm);
    return s;
  };
}

}  // namespace dp
