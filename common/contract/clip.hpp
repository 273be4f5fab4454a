// Gradient-norm clipping when the gradient is spread over ranks. torch.nn.utils.clip_grad_norm_ scales every
// gradient by min(1, max_norm / (norm + 1e-6)), where norm is the L2 norm of the whole model's gradient. On one
// process that is one sum of squares. Data-parallel, the gradient the optimizer applies lives somewhere else
// for each scheme: whole on every rank (DDP), cut into shards over a group (ZeRO-1, FSDP), or cut into shards
// over a node's group and repeated on every node (HSDP). The norm must count each element exactly once: the
// squares summed over the shard group, and never over the replicas, which hold the same elements again. The
// two classic mistakes are the two halves of that sentence: the norm of the local shard alone (too small, about
// 1/sqrt(N) of the true one, so clipping loosens as the cluster grows), and the sum over every rank (too large
// by sqrt(replicas)).
#pragma once

#include "common/dist/dist.hpp"
#include "common/state/full_state.hpp"

#include "common/base/libtorch.hpp"

#include <string>
#include <vector>

namespace dp {

/// Where the gradient that an optimizer is about to apply lives, seen from one rank.
struct GradientSpread {
  /// Tensors whose .grad() is this rank's share: every element of the model's gradient lies in exactly one
  /// rank's share within `group` (ZeRO-1's chunk, FSDP's shards).
  std::vector<torch::Tensor> sharded;
  /// Tensors whose .grad() every rank holds whole and equal (all of DDP's; FSDP's replicated norms): counted once.
  std::vector<torch::Tensor> whole;
  /// The group over which `sharded` splits the model: its ranks' squares are summed. Null when nothing is sharded.
  ProcessGroup* group = nullptr;
};

/// The spread of a scheme that holds its model as `s` (common/state/full_state.hpp): each group's chunk is this
/// rank's share over `group`, the replicated tensors are whole on every rank (FSDP over its group; HSDP over the
/// node's group, the other nodes holding the same shards again).
GradientSpread sharded_spread(const ShardedParams& s, ProcessGroup& group);

/// The L2 norm of the whole gradient: sqrt(sum over `group` of the squares of `sharded` + the squares of
/// `whole`), each tensor's squares summed in fp64 (so the order of the ranks' partial sums does not matter).
/// One all-reduce of one number over `group` when there is one (a collective of its ranks). A tensor without
/// a gradient counts 0.
double global_grad_norm(const GradientSpread& spread);

/// torch.nn.utils.clip_grad_norm_ over a spread gradient: the norm (global_grad_norm()), then every gradient
/// of the spread scaled by max_norm / (norm + 1e-6) when that is below 1. Returns the norm before clipping.
double clip_grad_norm(const GradientSpread& spread, double max_norm);

/// What a clipping check says when a norm differs from one process's by a factor `ratio` (ours / reference):
/// "; hint [clip-local-shard]: ..." below 1 (a shard's norm alone), "; hint [clip-summed-over-replicas]: ..."
/// above 1, "" when ratio is 1.
std::string clip_norm_hint(double ratio);

}  // namespace dp
