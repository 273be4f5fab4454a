#include "common/harness/hints.hpp"

#include <fmt/format.h>

#include <cmath>

namespace dp {

std::string update_hint(const torch::Tensor& ours_before, const torch::Tensor& ours_after,
                        const torch::Tensor& ref_before, const torch::Tensor& ref_after, int world_size) {
  torch::NoGradGuard no_grad;
  const auto ours = (ours_after - ours_before).to(torch::kFloat64).reshape(-1);
  const auto ref = (ref_after - ref_before).to(torch::kFloat64).reshape(-1);
  const double ref_norm = ref.norm().item<double>();
  if (!(ref_norm > 0)) return "";
  // Our update as k times the reference's plus what k cannot explain: a 2% residual leaves room for the
  // rounding of sums in another order (many orders of magnitude below it) and for momentum, whose first
  // step is the plain gradient step.
  const double k = ours.dot(ref).item<double>() / (ref_norm * ref_norm);
  const double residual = (ours - k * ref).norm().item<double>() / ref_norm;
  const double W = world_size;
  if (ours.norm().item<double>() <= 1e-12 * ref_norm)
    return "; hint [gradient-never-arrived]: this parameter did not move while one process's did: its averaged "
           "gradient never reached .grad() (the result not copied back, or sent before the gradient was ready)";
  if (residual > 0.02 || W < 2) return "";
  if (std::abs(k - W) <= 0.02 * W)
    return fmt::format(
        "; hint [summed-not-averaged]: this step moved the parameter {:.3g} times as far as one "
        "process did, the world size: the gradients were summed over the ranks but not divided "
        "by the world size",
        k);
  if (std::abs(k - 1 / W) <= 0.02 / W)
    return fmt::format(
        "; hint [averaged-twice]: this step moved the parameter {:.3g} times as far as one process "
        "did, 1 / world size: the gradients were divided by the world size twice",
        k);
  return "";
}

std::string with_ranks_differ_hint(const std::string& problem) {
  return problem.substr(0, problem.find("; hint [")) +
         "; hint [ranks-differ]: after this step the ranks hold different parameters, so some rank stepped with "
         "a gradient the others did not have: an all-reduce missing, its result not copied back into .grad(), "
         "a gradient read before its wait() returned, or (ZeRO) the all-gather after the step missing";
}

std::string not_waited_hint() {
  return "; hint [not-waited]: the optimizer would read gradients that a collective is still writing: wait() on "
         "every handle you launched before the step (a wait on one handle does not wait for another; a handle "
         "dropped unwaited is a collective nobody waits for)";
}

std::string not_broadcast_hint() {
  return "; hint [not-broadcast]: the ranks started from different weights: the wrapper must copy rank 0's "
         "parameters to every rank when it is built (broadcast_parameters), frozen ones too";
}

}  // namespace dp
