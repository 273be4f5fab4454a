// ShardedOptimizer: the greedy partition, the step (local step, then a broadcast from every owner), groups.
// ZeRO-1 as ZeroRedundancyOptimizer does it: whole parameters, greedy balance, a plain local optimizer.
#include "extensions/06b_cs336_design/sharded_optimizer.hpp"

#include "common/base/format.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/cli.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "common/state/optim_state.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>
#include <typeinfo>
#include <unordered_set>

namespace dp {

namespace optim = torch::optim;

// [partition]
std::vector<int> partition_greedy(const std::vector<int64_t>& sizes, std::vector<int64_t>& loads) {
  if (loads.empty()) throw std::invalid_argument("partition_greedy: need at least one rank");
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Largest first; stable_sort keeps equal sizes in input order, so the result is deterministic.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<int> owner(sizes.size(), -1);
  for (size_t i : order) {
    // min_element returns the first minimum: ties go to the lowest rank.
    auto least = std::min_element(loads.begin(), loads.end());
    owner[i] = static_cast<int>(least - loads.begin());
    *least += sizes[i];
  }
  return owner;
}
// [partition]

ShardedOptimizer::ShardedOptimizer(ProcessGroup& pg, std::vector<optim::OptimizerParamGroup> groups,
                                   MakeOptimizer make_local)
    : pg_(&pg), loads_(static_cast<size_t>(pg.world_size()), 0) {
  // The local optimizer starts empty and receives each group's owned part through add_param_group,
  // so the constructor and a later add_param_group follow one code path.
  if (make_local) {
    local_ = make_local({});
    if (!local_) throw UsageError("ShardedOptimizer: make_local returned no optimizer");
    local_->param_groups().clear();  // the empty group a torch::optim optimizer makes of no tensors
    kind_ = optimizer_kind(*local_);
  } else {
    kind_ = "external";  // the caller steps owned_parameters() itself, then calls broadcast_from_owners()
  }
  for (const auto& g : groups) add_param_group(g);
}

// [add_param_group]
void ShardedOptimizer::add_param_group(const optim::OptimizerParamGroup& group) {
  const size_t g = groups_.size();
  // Check everything before changing anything, so a refused group leaves the optimizer as it was.
  std::vector<torch::Tensor> params;  // this group's distinct new tensors, in the order given
  std::unordered_set<const void*> seen;
  for (const auto& p : group.params()) {
    if (!p.defined()) throw UsageError(fmt::format("add_param_group: group {} holds an undefined tensor", g));
    const void* key = p.unsafeGetTensorImpl();
    if (!seen.insert(key).second) continue;  // tied weight listed twice: keep it once
    if (auto it = slot_of_.find(key); it != slot_of_.end())
      throw UsageError(fmt::format("add_param_group: a parameter of shape {} is already in group {}",
                                   shape_text(p.sizes()), slots_[it->second].group));
    if (!p.is_leaf())
      throw UsageError(fmt::format("add_param_group: a tensor of shape {} is not a leaf (can't optimize it)",
                                   shape_text(p.sizes())));
    params.push_back(p);
  }

  // The dynamic types compared through references taken first: a call inside typeid is evaluated, which Clang
  // warns about (-Wpotentially-evaluated-expression).
  if (local_ && group.has_options()) {
    const auto& given = group.options();
    const auto& local = local_->defaults();
    if (typeid(given) != typeid(local))
      throw UsageError(
          fmt::format("add_param_group: group {} has options of another optimizer than the local {}", g, kind_));
  }

  // Owners for the trainable tensors, given what every rank already owns (earlier owners stay).
  std::vector<size_t> trainable;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].requires_grad()) {
      trainable.push_back(i);
      sizes.push_back(params[i].numel());
    }
  const std::vector<int> owners = partition_greedy(sizes, loads_);

  std::vector<int> owner(params.size(), -1);
  for (size_t k = 0; k < trainable.size(); ++k) owner[trainable[k]] = owners[k];
  std::vector<torch::Tensor> mine;
  for (size_t i = 0; i < params.size(); ++i) {
    slot_of_[params[i].unsafeGetTensorImpl()] = slots_.size();
    slots_.push_back({params[i], owner[i], g});
    if (owner[i] == pg_->rank()) mine.push_back(params[i]);
  }

  // The wrapper remembers the whole group with its options; the local optimizer gets the owned part.
  if (!local_) {  // no local optimizer: the group is remembered as given
    local_group_.push_back(-1);
    groups_.emplace_back(params);
    return;
  }
  auto options = group.has_options() ? group.options().clone() : local_->defaults().clone();
  if (mine.empty()) {
    local_group_.push_back(-1);
  } else {
    local_->add_param_group(optim::OptimizerParamGroup(mine, options->clone()));
    local_group_.push_back(static_cast<int>(local_->param_groups().size()) - 1);
  }
  groups_.emplace_back(params, std::move(options));
}
// [add_param_group]

// [step]
void ShardedOptimizer::step() {
  if (!local_)
    throw UsageError(
        "ShardedOptimizer::step: built without a local optimizer; step owned_parameters() "
        "yourself, then call broadcast_from_owners()");
  local_->step();  // only the owned parameters: same per-tensor arithmetic as the unsharded optimizer
  broadcast_from_owners();
}

void ShardedOptimizer::broadcast_from_owners() {
  if (pg_->world_size() == 1) return;
  // Every rank walks the slots in the same order, so the i-th broadcast matches on every rank.
  // detach() aliases the parameter's storage without autograd: the broadcast writes into the model.
  std::vector<torch::Tensor> data;
  std::vector<Work> pending;
  data.reserve(slots_.size());
  for (const auto& s : slots_) {
    if (s.owner < 0) continue;  // frozen: identical everywhere and never changes
    data.push_back(s.param.detach());
    pending.push_back(pg_->broadcast_async(data.back(), s.owner));
  }
  for (auto& w : pending) w.wait();
}
// [step]

void ShardedOptimizer::zero_grad(bool set_to_none) {
  for (auto& s : slots_) {
    auto& grad = s.param.mutable_grad();
    if (!grad.defined()) continue;
    if (set_to_none)
      grad.reset();
    else
      grad.detach_().zero_();
  }
}

void ShardedOptimizer::set_lr(size_t g, double lr) {
  if (g >= groups_.size())
    throw UsageError(fmt::format("set_lr: group {} does not exist ({} groups)", g, groups_.size()));
  if (!local_) throw UsageError("set_lr: this ShardedOptimizer has no local optimizer (set the rate where you step)");
  groups_[g].options().set_lr(lr);
  if (local_group_[g] >= 0) local_->param_groups()[static_cast<size_t>(local_group_[g])].options().set_lr(lr);
}

std::vector<torch::Tensor> ShardedOptimizer::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& s : slots_) out.push_back(s.param);
  return out;
}

std::vector<torch::Tensor> ShardedOptimizer::owned_parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& s : slots_)
    if (s.owner == pg_->rank()) out.push_back(s.param);
  return out;
}

int ShardedOptimizer::owner_of(const torch::Tensor& p) const {
  auto it = slot_of_.find(p.unsafeGetTensorImpl());
  return it == slot_of_.end() ? -1 : slots_[it->second].owner;
}

int ShardedOptimizer::group_of(const torch::Tensor& p) const {
  auto it = slot_of_.find(p.unsafeGetTensorImpl());
  return it == slot_of_.end() ? -1 : static_cast<int>(slots_[it->second].group);
}

std::vector<RankShare> ShardedOptimizer::shares() const {
  std::vector<RankShare> out(static_cast<size_t>(pg_->world_size()));
  for (size_t r = 0; r < out.size(); ++r) out[r].rank = static_cast<int>(r);
  for (const auto& s : slots_) {
    if (s.owner < 0) continue;
    auto& sh = out[static_cast<size_t>(s.owner)];
    sh.params += 1;
    sh.elements += s.param.numel();
    sh.bytes += s.param.numel() * static_cast<int64_t>(s.param.element_size());
  }
  return out;
}

std::string ShardedOptimizer::describe() const {
  const auto per_rank = shares();
  int64_t trainable = 0, elements = 0;
  for (const auto& sh : per_rank) {
    trainable += sh.params;
    elements += sh.elements;
  }
  const int64_t frozen = static_cast<int64_t>(slots_.size()) - trainable;  // frozen tensors have no owner
  std::string out = fmt::format("sharded {} over {}: {} trainable tensors, {} elements", kind_,
                                count_of(pg_->world_size(), "rank"), trainable, with_commas(elements));
  if (frozen > 0) out += fmt::format(" ({} frozen tensors not sharded)", frozen);
  for (const auto& sh : per_rank)
    out += fmt::format("\n  rank {}: {} tensors, {} elements, {} of parameters", sh.rank, sh.params,
                       with_commas(sh.elements), format_bytes(static_cast<double>(sh.bytes)));
  return out;
}

}  // namespace dp
