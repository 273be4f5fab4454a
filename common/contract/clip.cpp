// The global gradient norm over shards and replicas, and clipping by it.
#include "common/contract/clip.hpp"

#include <fmt/format.h>

#include <cmath>

namespace dp {

namespace {

double squares(const std::vector<torch::Tensor>& tensors) {
  double sum = 0;
  for (const auto& t : tensors)
    if (t.grad().defined()) sum += t.grad().detach().pow(2).sum(torch::kFloat64).item<double>();
  return sum;
}

}  // namespace

GradientSpread sharded_spread(const ShardedParams& s, ProcessGroup& group) {
  GradientSpread g{{}, s.replicated, &group};
  for (const auto& shard_group : s.groups) g.sharded.push_back(shard_group.chunk);
  return g;
}

// [global_norm]
double global_grad_norm(const GradientSpread& s) {
  double sharded = squares(s.sharded);
  if (s.group && s.group->world_size() > 1) {
    // One number per rank, summed over the shard group only: the replicas' groups hold the same shards again.
    auto t = torch::full({1}, sharded, torch::TensorOptions().dtype(torch::kFloat64).device(s.group->device()));
    s.group->all_reduce(t, "gradient norm");
    sharded = t.item<double>();
  }
  return std::sqrt(sharded + squares(s.whole));  // whole tensors: the same on every rank, counted once
}
// [global_norm]

double clip_grad_norm(const GradientSpread& s, double max_norm) {
  const double norm = global_grad_norm(s);
  const double scale = max_norm / (norm + 1e-6);  // torch.nn.utils.clip_grad_norm_'s coefficient
  if (scale < 1) {
    torch::NoGradGuard no_grad;
    for (const auto* list : {&s.sharded, &s.whole})
      for (const auto& t : *list)
        if (t.grad().defined()) t.grad().mul_(scale);
  }
  return norm;
}

std::string clip_norm_hint(double ratio) {
  if (ratio < 1)
    return fmt::format(
        "; hint [clip-local-shard]: the norm is {:.3f} of one process's, as if each rank took the norm of its own "
        "shard: sum the squares of the shards over the shard group, then take the square root",
        ratio);
  if (ratio > 1)
    return fmt::format(
        "; hint [clip-summed-over-replicas]: the norm is {:.3f} of one process's, as if squares that several ranks "
        "hold were summed over all of them: sum over the shard group only, and count a tensor every rank holds "
        "whole once",
        ratio);
  return "";
}

}  // namespace dp
