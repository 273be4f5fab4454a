// HSDP: FSDP inside each node, the reduced shards all-reduced across nodes.
#include "stages/10_hierarchy/hsdp.hpp"

#include "common/base/errors.hpp"
#include "common/contract/grad_sync.hpp"  // broadcast_parameters

#include <fmt/format.h>
#include <torch/csrc/utils/tensor_flatten.h>  // flatten_dense_tensors

namespace dp {

std::string hsdp_sync_name(HsdpSync s) {
  switch (s) {
    case HsdpSync::every_micro_batch: return "every micro-batch";
    case HsdpSync::all_reduce_last: return "all-reduce on the last";
    case HsdpSync::none_until_last: return "nothing until the last";
  }
  return "?";
}

namespace {

// Every rank starts from world rank 0's weights: Fsdp broadcasts over the node only, and two nodes whose rank 0s
// drew different weights would train two different models.
std::shared_ptr<torch::nn::Module> from_world_rank_zero(ProcessGroup& world, std::shared_ptr<torch::nn::Module> m) {
  broadcast_parameters(world, *m);
  return m;
}

}  // namespace

Hsdp::Hsdp(Mesh& mesh, std::shared_ptr<torch::nn::Module> model, const ModuleUnits& units, FsdpOptions opts,
           HsdpSync sync)
    : Fsdp(mesh.intra(), from_world_rank_zero(mesh.world(), std::move(model)), units, opts), mesh_(mesh), sync_(sync) {
  if (sync == HsdpSync::none_until_last && opts.compute_dtype != torch::kFloat32)
    throw UsageError(fmt::format(
        "HSDP with {} keeps whole gradients in the compute dtype ({}) across micro-batches, "
        "losing their low bits; use float32 compute, or sync '{}'",
        hsdp_sync_name(sync), c10::toString(opts.compute_dtype), hsdp_sync_name(HsdpSync::all_reduce_last)));
  const ShardedParams s = sharding();
  for (const auto& group : s.groups) shards_.push_back(group.chunk);
  replicated_ = s.replicated;
  crossing_.resize(shards_.size());
}

// [hsdp]
// Unit u's shard gradient g now holds the node's mean of this micro-batch added to what earlier ones left. L x g
// is the node's sum of them all: summed over the nodes and divided by W it is the mean over every rank. What an
// earlier micro-batch's all-reduce made equal on every node comes back M times and is divided by M again, so the
// same sum is right after every micro-batch as after the last one only.
void Hsdp::after_shard_reduced(size_t u) {
  if (!crosses_now() || mesh_.nodes() == 1) return;
  torch::NoGradGuard no_grad;
  cross(u, shards_[u].grad() * static_cast<double>(mesh_.per_node()));
}

void Hsdp::cross(size_t u, torch::Tensor sum) {
  Crossing& c = crossing_[u];
  c.sum = std::move(sum);
  c.work = mesh_.inter().all_reduce_async(c.sum, fmt::format("unit {} across nodes", u));
  ++inter_calls_;
  inter_sent_ += 2.0 * (mesh_.nodes() - 1) / mesh_.nodes() * static_cast<double>(c.sum.nbytes());
}

void Hsdp::finish_gradient_synchronization() {
  Fsdp::finish_gradient_synchronization();  // in the node; each unit's crossing launched as its reduce-scatter ended
  if (crosses_now() && mesh_.nodes() > 1) all_reduce_across_nodes();
}

void Hsdp::all_reduce_across_nodes() {
  torch::NoGradGuard no_grad;
  const int M = mesh_.nodes(), W = mesh_.world().world_size();
  for (size_t u = 0; u < crossing_.size(); ++u) {
    Crossing& c = crossing_[u];
    if (!c.work.valid()) continue;
    c.work.wait();
    shards_[u].mutable_grad().copy_(c.sum.div_(W));
    c = Crossing();
  }
  // The replicated gradients (the norms): the node's mean after Fsdp's all-reduce, equal on every node for what
  // earlier micro-batches crossed; summed over the nodes in one flat buffer and divided by M.
  std::vector<torch::Tensor> grads;
  for (auto& p : replicated_) grads.push_back(p.grad());
  if (grads.empty()) return;
  torch::Tensor flat = torch::utils::flatten_dense_tensors(grads);
  mesh_.inter().all_reduce(flat, "replicated across nodes");
  ++inter_calls_;
  inter_sent_ += 2.0 * (M - 1) / M * static_cast<double>(flat.nbytes());
  const auto mean = torch::utils::unflatten_dense_tensors(flat.div_(M), grads);
  for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(mean[i]);
}
// [hsdp]

std::string Hsdp::describe_hsdp() const {
  return fmt::format("HSDP on {}: {}; gradients across nodes: {}", mesh_.describe(), describe(), hsdp_sync_name(sync_));
}

}  // namespace dp
