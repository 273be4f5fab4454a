// A cluster of nodes seen from a rank: the world's ranks laid out as a 2-D mesh, nodes x ranks per node, with
// one process group per row (the ranks of a node, on the fast links) and one per column (one rank of each
// node, joined over the slow links between nodes). What torch's DeviceMesh of shape (nodes, per_node) with
// dims ("replicate", "shard") gives PyTorch's HSDP; stage 10 builds its hierarchical collectives on it.
#pragma once

#include "common/dist/dist.hpp"

#include <memory>
#include <string>

namespace dp {

/// Rank r of W = nodes x per_node ranks sits on node r / per_node at local index r % per_node: consecutive
/// ranks share a node, as a launcher numbers them (RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK).
class Mesh {
 public:
  /// Forms the two groups of this rank through `world`'s store (ProcessGroup::new_group): first its node's,
  /// then its column's. Every rank of `world` calls it, with the same `nodes`. Throws dp::UsageError when
  /// `nodes` is < 1 or does not divide the world size (naming both and the divisors that would). `world` must
  /// outlive the mesh.
  static Mesh make(ProcessGroup& world, int nodes);

  int nodes() const { return nodes_; }
  int per_node() const { return per_node_; }
  /// This rank's node (GROUP_RANK) and its index within the node (LOCAL_RANK).
  int node() const { return world_->rank() / per_node_; }
  int local() const { return world_->rank() % per_node_; }
  ProcessGroup& world() { return *world_; }
  /// The ranks of this rank's node: per_node() of them, ranked by local index.
  ProcessGroup& intra() { return *intra_; }
  /// One rank of every node, those with this rank's local index: nodes() of them, ranked by node.
  ProcessGroup& inter() { return *inter_; }
  /// "2 nodes x 2 ranks".
  std::string describe() const;

 private:
  ProcessGroup* world_ = nullptr;
  int nodes_ = 1, per_node_ = 1;
  std::shared_ptr<ProcessGroup> intra_, inter_;  // shared: a Mesh is returned by value
};

/// The number of nodes a program should lay its mesh out in when the user did not say: DP_NET_NODES when
/// ddp_launch --net-nodes simulates them, else the launch's WORLD_SIZE / LOCAL_WORLD_SIZE (real nodes), else 1.
int nodes_from_environment();

}  // namespace dp
