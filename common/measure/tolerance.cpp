// Tolerances from first principles (see tolerance.hpp for the model).
#include "common/measure/tolerance.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace dp {

double unit_roundoff(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat64: return std::ldexp(1.0, -53);
    case torch::kFloat32: return std::ldexp(1.0, -24);
    case torch::kFloat16: return std::ldexp(1.0, -11);  // 10 stored mantissa bits
    case torch::kBFloat16: return std::ldexp(1.0, -8);  // 7 stored mantissa bits
    default:
      throw std::invalid_argument(fmt::format("unit_roundoff: {} is not a floating-point dtype", c10::toString(dtype)));
  }
}

double gamma_n(double n, double u) {
  if (n * u >= 1) throw std::invalid_argument(fmt::format("gamma_n: n u = {} x {:.3g} >= 1 bounds nothing", n, u));
  return n * u / (1 - n * u);
}

double sgd_weight_bound(double lr, double momentum, int steps, double grad_diff, double max_weight, bool resync) {
  // The velocity of step s carries the gradient differences of steps 1..s weighted by momentum^(s-j).
  double velocity = 0, total = 0;  // velocity: 1 + m + ... + m^(s-1); total: the sum of those over steps
  for (int s = 1; s <= steps; ++s) {
    velocity = 1 + momentum * velocity;
    total += velocity;
  }
  const double ulp = 2 * unit_roundoff(torch::kFloat32) * max_weight;  // the update's own rounding
  return resync ? lr * grad_diff * velocity + ulp : lr * grad_diff * total + steps * ulp;
}

double max_abs(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  double m = 0;
  for (const auto& p : params)
    if (p.numel() > 0) m = std::max(m, p.detach().abs().max().item<double>());
  return m;
}

void AdamWeightBound::add_step(const std::vector<torch::Tensor>& params, double grad_diff) {
  torch::NoGradGuard no_grad;
  ++steps_;
  if (v_.empty())
    for (const auto& p : params) {
      v_.push_back(torch::zeros_like(p, torch::kFloat64));
      bound_.push_back(torch::zeros_like(p, torch::kFloat64));
    }
  const double correction = 1 - std::pow(beta2_, steps_);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].grad().defined()) continue;  // no gradient: AdamW does not move it in either run
    const auto g = params[i].grad().to(torch::kFloat64);
    v_[i].mul_(beta2_).add_(g * g * (1 - beta2_));
    const auto scale = (v_[i] / correction).sqrt() + eps_;
    const auto ulp = params[i].detach().to(torch::kFloat64).abs() * (2 * unit_roundoff(torch::kFloat32));
    bound_[i].add_((2 * grad_diff / scale).clamp_max(2.0) * lr_ + ulp);
  }
}

double AdamWeightBound::worst_ratio(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                                    size_t first) const {
  torch::NoGradGuard no_grad;
  double worst = 0;
  for (size_t i = 0; i < a.size() && first + i < bound_.size(); ++i) {
    const auto d = (a[i].detach().to(torch::kFloat64) - b[i].detach().to(torch::kFloat64)).abs();
    // An entry with bound 0 never moved in either run: any difference there is infinitely off (0/0: none).
    worst = std::max(worst, (d / bound_[first + i]).nan_to_num(0.0, INFINITY).max().item<double>());
  }
  return worst;
}

double AdamWeightBound::first_order_change(const std::vector<torch::Tensor>& params) const {
  torch::NoGradGuard no_grad;
  double total = 0;
  for (size_t i = 0; i < params.size() && i < bound_.size(); ++i)
    if (params[i].grad().defined())
      total += (params[i].grad().to(torch::kFloat64).abs() * bound_[i]).sum().item<double>();
  return total;
}

double max_abs_grad(const std::vector<torch::Tensor>& params) {
  double g = 0;
  for (const auto& p : params)
    if (p.grad().defined() && p.grad().numel() > 0) g = std::max(g, p.grad().abs().max().item<double>());
  return g;
}

double gradient_rounding_error(double terms, int W, int depth, torch::ScalarType dtype, double* roundings) {
  const double low = 2.0 * depth + (dtype == torch::kFloat32 ? 0 : 2);
  if (roundings) *roundings = low;
  return (terms + W) * unit_roundoff(torch::kFloat32) + low * unit_roundoff(dtype);
}

}  // namespace dp
