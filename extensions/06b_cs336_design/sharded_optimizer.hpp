// Extension 06b, on stage 06: ShardedOptimizer, CS336's design of ZeRO stage 1, the optimizer state sharded
// over the ranks by whole parameter tensors.
// In the style of PyTorch's ZeroRedundancyOptimizer: every rank keeps the whole model and the whole
// gradient, but only the optimizer state (AdamW's two moments, SGD's momentum) of the parameters it owns.
// A step updates the owned parameters with an ordinary torch::optim optimizer, then every parameter is
// broadcast from its owner so all replicas agree again.
#pragma once

#include "common/contract/strategy.hpp"  // MakeOptimizer
#include "common/dist/dist.hpp"
#include "common/measure/memory.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace dp {

/// Gives each item (sizes[i] elements) to one rank: largest item first, each to the rank with the
/// smallest load so far (ties: the lowest rank; equal sizes keep their input order). `loads` holds
/// one entry per rank, the elements each rank already owns; it is updated. Returns the owner of each
/// item in input order. Pure arithmetic, so every rank computes the same answer.
std::vector<int> partition_greedy(const std::vector<int64_t>& sizes, std::vector<int64_t>& loads);

/// What one rank owns.
struct RankShare {
  int rank = 0;
  int64_t params = 0;    ///< number of parameter tensors
  int64_t elements = 0;  ///< their total number of elements
  int64_t bytes = 0;     ///< their total bytes (elements x element size)
};

/// ZeRO-1 around any torch::optim optimizer.
///
/// Rules, identical on every rank (so every rank must construct it and add groups in the same order):
/// - Parameters are whole tensors given to one owner each by partition_greedy() (by element count).
///   A tensor listed twice (tied weights, same TensorImpl) is owned and stepped once.
/// - Frozen parameters (requires_grad false when their group is added) get no owner: they are never
///   stepped nor broadcast, so they never change. Unfreezing one later is not supported.
/// - Every group keeps its own options (lr, weight decay, ...); a group without options gets the local
///   optimizer's defaults, as in torch::optim.
/// - step() runs the local optimizer (the same per-parameter arithmetic as the unsharded optimizer,
///   hence bit-identical results), then broadcasts every owned-by-someone parameter from its owner.
///   Gradients must already be the same on every rank (DDP averages them; this class does not).
class ShardedOptimizer {
 public:
  /// `groups`: the parameter groups, as for any torch::optim optimizer. `make_local` (the MakeOptimizer every
  /// Strategy is given) builds this rank's optimizer, called once with no tensors; the empty group a
  /// torch::optim optimizer makes of them is dropped, and the owned part of each group is then added to it,
  /// its options or, where it brings none, the optimizer's defaults. An empty `make_local` builds none: the
  /// caller steps owned_parameters() with an optimizer of its own (the Python package's any torch.optim
  /// class) and then calls broadcast_from_owners(); step() and set_lr() then throw.
  ShardedOptimizer(ProcessGroup& pg, std::vector<torch::optim::OptimizerParamGroup> groups, MakeOptimizer make_local);

  /// The usual way to build one: the local optimizer is an `Opt` (torch::optim::AdamW, Adam, SGD, ...)
  /// with `defaults` for every group that brings no options of its own, e.g.
  /// `ShardedOptimizer::make<torch::optim::AdamW>(pg, model->parameters(), AdamWOptions(1e-3))`.
  template <typename Opt, typename Options>
  static ShardedOptimizer make(ProcessGroup& pg, std::vector<torch::optim::OptimizerParamGroup> groups,
                               const Options& defaults) {
    return ShardedOptimizer(pg, std::move(groups), [defaults](std::vector<torch::Tensor> none) {
      return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<Opt>(std::move(none), defaults));
    });
  }
  /// The same with one group of `params` (tied weights may appear twice).
  template <typename Opt, typename Options>
  static ShardedOptimizer make(ProcessGroup& pg, std::vector<torch::Tensor> params, const Options& defaults) {
    return make<Opt>(pg, std::vector<torch::optim::OptimizerParamGroup>{{std::move(params)}}, defaults);
  }

  ShardedOptimizer(ShardedOptimizer&&) = default;
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  /// Steps the owned parameters, then broadcasts every parameter from its owner (all broadcasts are
  /// started in the same order on every rank, then all are waited for). A collective: every rank calls it.
  void step();
  /// step()'s communication: every parameter broadcast from its owner. A collective.
  void broadcast_from_owners();
  /// Clears the gradients of ALL parameters (not only the owned ones): zeroes them in place, or with
  /// set_to_none drops them (the next backward allocates fresh ones). Local, no communication.
  void zero_grad(bool set_to_none = false);
  /// Adds a group before or during training: its new trainable parameters get owners by the same
  /// greedy rule, starting from the current loads (earlier owners never change); the owner's local
  /// optimizer gets a group with these options. Throws dp::UsageError if a parameter is already in
  /// another group or is not a leaf tensor. Local, but every rank must make the same calls.
  void add_param_group(const torch::optim::OptimizerParamGroup& group);

  /// Sets the learning rate of group `g` (in the wrapper and in the local optimizer).
  void set_lr(size_t g, double lr);

  /// The groups as given (every parameter, owned or not; tied weights once), with their options.
  const std::vector<torch::optim::OptimizerParamGroup>& param_groups() const { return groups_; }
  /// Every distinct parameter, in the order they were added (the broadcast order).
  std::vector<torch::Tensor> parameters() const;
  /// The parameters this rank owns and steps.
  std::vector<torch::Tensor> owned_parameters() const;
  /// Owner rank of `p`, or -1 for a frozen parameter or one this optimizer does not hold.
  int owner_of(const torch::Tensor& p) const;
  bool owns(const torch::Tensor& p) const { return owner_of(p) == pg_->rank(); }
  /// Index in param_groups() of the group holding `p`, or -1 if this optimizer does not hold it.
  int group_of(const torch::Tensor& p) const;

  /// This rank's optimizer over its own parameters (its state() holds this rank's shard).
  torch::optim::Optimizer& local() { return *local_; }
  const torch::optim::Optimizer& local() const { return *local_; }
  /// "adamw", "adam", "sgd" (found from the local optimizer's type), or "custom".
  const std::string& kind() const { return kind_; }
  ProcessGroup& process_group() { return *pg_; }
  int rank() const { return pg_->rank(); }
  int world_size() const { return pg_->world_size(); }

  /// What every rank owns (computed locally: the partition is the same everywhere).
  std::vector<RankShare> shares() const;
  /// A few lines: the optimizer kind, then per rank its parameters, elements and bytes.
  std::string describe() const;

 private:
  struct Slot {
    torch::Tensor param;
    int owner = -1;  // -1: frozen, never stepped nor broadcast
    size_t group = 0;
  };
  ProcessGroup* pg_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::string kind_;
  std::vector<torch::optim::OptimizerParamGroup> groups_;
  std::vector<int> local_group_;  // groups_[g] -> index in local_->param_groups(), or -1
  std::vector<Slot> slots_;
  std::unordered_map<const void*, size_t> slot_of_;  // TensorImpl* -> index in slots_
  std::vector<int64_t> loads_;                       // elements owned per rank
};

}  // namespace dp
