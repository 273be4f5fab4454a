// Stage 10: HSDP, hybrid sharding. Inside a node the ranks run stage 07's FSDP over the node's fast links (the
// gathers and reduce-scatters never leave the node); across nodes each rank holds the same shard as one rank
// of every other node, and only that shard's reduced gradient crosses the slow uplink, in one all-reduce per
// step. PyTorch's FSDP2 calls it HSDP (a 2-D DeviceMesh of ("replicate", "shard")); torchtitan and Megatron
// train clusters this way.
#pragma once

#include "common/dist/mesh.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include "common/base/libtorch.hpp"

#include <memory>
#include <string>
#include <vector>

namespace dp {

/// When the shards' gradients cross the uplink, with K micro-batches accumulated into one step.
enum class HsdpSync {
  every_micro_batch,  ///< reduce-scatter in the node and all-reduce across nodes after every micro-batch:
                      ///< K x the uplink traffic (what accumulation under a wrapper that ignores no_sync costs)
  all_reduce_last,    ///< reduce-scatter in the node after every micro-batch, all-reduce across nodes after the
                      ///< last only (FSDP2's set_requires_all_reduce(False) before it): 1 x the uplink traffic
  none_until_last,    ///< no communication until the last micro-batch (FSDP2's set_requires_gradient_sync(False)):
                      ///< each rank keeps whole fp32 gradients of the sharded weights meanwhile (memory of DDP)
};

/// "every micro-batch", "all-reduce on the last", "nothing until the last".
std::string hsdp_sync_name(HsdpSync s);

/// FSDP over mesh.intra(), with the reduced gradient shards (and the replicated parameters' gradients) all-reduced
/// over mesh.inter(). Usage, on every rank, as Fsdp's:
///   Hsdp hsdp(mesh, model, model->units(), {}, HsdpSync::all_reduce_last);
///   torch::optim::AdamW opt(hsdp.parameters(), ...);
///   loop: opt.zero_grad();
///         for k < K: hsdp.set_last_micro_batch(k == K - 1); loss_k.backward(); hsdp.finish_gradient_synchronization();
///         opt.step();
/// After the last micro-batch every rank's shard gradient is the mean over all W = nodes x per_node ranks, the same
/// on the ranks of one column; stepping the shards therefore keeps the nodes' copies equal, with no broadcast. Each
/// unit's all-reduce across nodes starts as soon as its reduce-scatter in the node completed, during backward.
class Hsdp : public Fsdp {
 public:
  /// Broadcasts world rank 0's parameters to every rank (Fsdp's own broadcast reaches only the node), then
  /// shards each unit over the node. `mesh` must outlive it. FSDP's compute dtype bf16 or fp16 is refused
  /// with none_until_last (dp::UsageError): K micro-batches' whole gradients would add up in that dtype.
  Hsdp(Mesh& mesh, std::shared_ptr<torch::nn::Module> model, const ModuleUnits& units, FsdpOptions opts, HsdpSync sync);

  /// Whether the coming backward is the last micro-batch of the step (true, the default, without accumulation).
  void set_last_micro_batch(bool last) { last_ = last; }
  /// After every backward: FSDP's reduce-scatters and replicated all-reduce inside the node (unless
  /// none_until_last and not the last micro-batch), then, when sync says so, the units' all-reduces across
  /// nodes completed (launched as each reduce-scatter completed) and the replicated gradients all-reduced.
  void finish_gradient_synchronization();

  /// Collectives across nodes since construction, and the bytes this rank sent over the uplink by ring
  /// arithmetic: 2(M-1)/M of each buffer all-reduced. Fsdp's sent_bytes() counts the node's links.
  int64_t inter_all_reduces() const { return inter_calls_; }
  double inter_sent_bytes() const { return inter_sent_; }
  /// One line: the mesh, FSDP's line, the sync.
  std::string describe_hsdp() const;

 protected:
  bool reduce_this_backward() const override { return sync_ != HsdpSync::none_until_last || last_; }
  /// On a micro-batch whose gradients cross the uplink: the unit's shard gradient (L x of it: the node's sum, with
  /// what earlier micro-batches left) all-reduced across nodes, launched at once, behind the rest of backward.
  void after_shard_reduced(size_t u) override;
  /// Launches the all-reduce of `sum` ([chunk], unit u's) over mesh.inter(); all_reduce_across_nodes() waits.
  void cross(size_t u, torch::Tensor sum);
  /// Waits for the units' all-reduces and sets each shard's gradient to its sum / W; all-reduces the replicated
  /// gradients in one flat buffer (then / M). Virtual so that a test can plant the classic slips.
  virtual void all_reduce_across_nodes();
  bool crosses_now() const { return sync_ == HsdpSync::every_micro_batch || last_; }
  const std::vector<torch::Tensor>& shards() const { return shards_; }

 private:
  struct Crossing {
    torch::Tensor sum;  // [chunk] fp32: the unit's shard gradient summed over the nodes, once `work` is done
    Work work;
  };
  Mesh& mesh_;
  HsdpSync sync_;
  bool last_ = true;
  std::vector<torch::Tensor> shards_;  // each unit's fp32 shard: parameters() without the replicated tensors
  std::vector<torch::Tensor> replicated_;
  std::vector<Crossing> crossing_;  // per unit, this micro-batch
  int64_t inter_calls_ = 0;
  double inter_sent_ = 0;
};

}  // namespace dp
