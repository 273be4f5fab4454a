// Tolerances from first principles: how far two runs of the same training may drift apart when they
// differ only in rounding (sums of the same terms in another order, a bf16 rounding at another place).
//
// Every check that compares data-parallel training with one process states its bound with these
// functions, from the dtype's unit roundoff and quantities known at run time (learning rate, steps,
// momentum, the largest gradient entry, the number of terms summed in another order), instead of a
// number measured on one machine. The model is first-order rounding-error analysis (Higham, "Accuracy
// and Stability of Numerical Algorithms", 2nd ed., sections 2.2 and 4.2):
//
//   one rounding       fl(x op y) = (x op y)(1 + d),  |d| <= u
//   a sum of n terms   |fl(sum) - sum| <= gamma_n * sum |x_i|,  gamma_n = n u / (1 - n u)
//
// A gradient entry that went through `roundings` roundings whose inputs differ between the two runs
// differs by at most roundings * u * G, where G is the largest |gradient| of the step (normwise: the
// rows are samples of one distribution, so the terms of a sum are no larger than the result it makes;
// the margin test, `ctest -L margin`, measures how far below the bound the checks stay on this CPU,
// at 1-4 ranks, several seeds and other ATen kernel paths). The optimizer turns gradient differences
// into weight differences; sgd_weight_bound() says how.
#pragma once

#include "common/base/libtorch.hpp"

#include <string>
#include <utility>

namespace dp {

/// Unit roundoff u of a floating-point dtype: the largest relative error of one rounding to nearest,
/// half the gap between 1 and the next number. float64 2^-53, float32 2^-24 (6.0e-8), float16 2^-11
/// (4.9e-4), bfloat16 2^-8 (3.9e-3). Throws std::invalid_argument for other dtypes.
double unit_roundoff(torch::ScalarType dtype);

/// Higham's gamma_n = n u / (1 - n u): the relative bound on a sum (or dot product) of n terms
/// computed in any order. Throws std::invalid_argument when n u >= 1 (the bound says nothing).
double gamma_n(double n, double u);

/// How far an entry of a weight gradient computed by a data-parallel scheme and by one process computing
/// alike can differ, relative to the largest entry: `terms` products summed in another grouping, then the
/// W rank partials, in fp32 (gamma_{terms + W}, first order; ATen accumulates bf16 products in fp32 too);
/// the loss's scale 1/rows instead of 1/(rows W) lets each of the `depth` ops between the weight and the
/// loss round its output differently, forward and backward (2 roundings of `dtype` per op), and below fp32
/// each side also rounds its weight gradient to `dtype` once (2 more). `roundings`, when given, receives
/// the count of the latter. What check_strategy() and extension 07a's Transformer check multiply.
double gradient_rounding_error(double terms, int W, int depth, torch::ScalarType dtype, double* roundings = nullptr);

/// The largest |weight difference| after `steps` SGD steps (learning rate `lr`, momentum `momentum`,
/// no weight decay) of two runs whose gradients differ by at most `grad_diff` per entry each step.
/// First order: step s moves the weights by lr times the velocity v_s = sum_{j<s} momentum^j g_{s-j},
/// so a gradient difference reaches the weights scaled by lr (1 + momentum + ... + momentum^(s-1)).
/// The update w - lr v is itself rounded to the weights' dtype (fp32 master weights): two runs whose
/// updates differ at all may land on neighbouring floats, one ulp <= 2 u(fp32) |w| apart, every step
/// (`max_weight`: the largest |w|).
/// `resync`: the weights are made equal again after every step (only the velocity carries the past),
/// so the bound is that of the last step alone; otherwise the steps' differences add up.
double sgd_weight_bound(double lr, double momentum, int steps, double grad_diff, double max_weight,
                        bool resync = false);

/// The largest |entry| over `params` (weights): the scale of their own rounding.
double max_abs(const std::vector<torch::Tensor>& params);

/// Entry-wise bounds on |weight difference| under AdamW, whose update m^ / (sqrt(v^) + eps) divides by
/// each entry's own gradient scale: a rounding difference in a large gradient entry barely moves its
/// weight, one in a near-zero entry can move it by up to lr. First order, per entry and step s:
///   |d m^| <= dg and |d sqrt(v^)| <= dg (bias-corrected means of the gradients and of their squares,
///   weights summing to 1), so |d update| <= 2 dg / (sqrt(v^_s) + eps), and never more than 2 (the
///   update itself stays within about +-1 in the first steps).
/// The weight difference adds lr times that over the steps, plus one ulp of the weight per step (the
/// update's own rounding, 2 u(fp32) |w|; decoupled weight decay moves both runs' weights alike:
/// lr * wd * |dw|, second order, left out). sqrt(v^) comes from the reference's own gradients, tracked
/// here as AdamW tracks them.
class AdamWeightBound {
 public:
  AdamWeightBound(double lr, double beta2, double eps) : lr_(lr), beta2_(beta2), eps_(eps) {}
  /// After a step of the reference: its gradients (in parameter order) and the bound on how far the
  /// other run's gradients can be from them, per entry (e.g. roundings * u * G).
  void add_step(const std::vector<torch::Tensor>& params, double grad_diff);
  /// |a - b| / bound, largest over every entry of every parameter: the margin (<= 1 passes). `first`:
  /// the index of a[0] among the parameters given to add_step() (to compare one tensor at a time).
  double worst_ratio(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, size_t first = 0) const;
  /// First-order bound on how far a function of the weights (a loss) can differ between the runs:
  /// sum over entries of |its gradient| x the entry's bound. `params` carry that gradient in .grad().
  double first_order_change(const std::vector<torch::Tensor>& params) const;

 private:
  double lr_, beta2_, eps_;
  int steps_ = 0;
  std::vector<torch::Tensor> v_, bound_;  // per parameter: AdamW's second moment, the bound so far
};

/// A bound with the words that say how it was derived, for a check's output line.
struct Bound {
  double value = 0;        ///< the bound itself
  std::string derivation;  ///< e.g. "lr 0.05 x 2.71 (momentum) x 30 roundings x u(bf16) 3.9e-03 x max|g| 0.12"
};

/// How a check compares: the measured difference, its bound and their ratio (the margin; <= 1 passes).
struct Margin {
  Margin() = default;
  Margin(double d, double b, std::string how = {}) : diff(d), bound(b), derivation(std::move(how)) {}
  double diff = 0;         ///< largest |difference| measured
  double bound = 0;        ///< what it must stay within
  std::string derivation;  ///< how `bound` was derived, in words and numbers (empty when not given)
  double ratio() const { return bound > 0 ? diff / bound : (diff > 0 ? INFINITY : 0); }
  bool ok() const { return diff <= bound; }
};

/// The largest |gradient| entry over `params` (undefined gradients skipped): the scale G of the bounds.
double max_abs_grad(const std::vector<torch::Tensor>& params);

}  // namespace dp
