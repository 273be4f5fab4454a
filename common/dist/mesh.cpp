// The 2-D mesh of a cluster of nodes: one subgroup per node, one per column across nodes.
#include "common/dist/mesh.hpp"

#include "common/base/errors.hpp"
#include "common/dist/launch_env.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

namespace dp {

Mesh Mesh::make(ProcessGroup& world, int nodes) {
  const int W = world.world_size();
  if (nodes < 1 || W % nodes != 0) {
    std::vector<int> divisors;
    for (int d = 1; d <= W; ++d)
      if (W % d == 0) divisors.push_back(d);
    throw UsageError(fmt::format("{} nodes cannot split {} ranks evenly; use a number of nodes that divides {} ({})",
                                 nodes, W, W, fmt::join(divisors, ", ")));
  }
  Mesh m;
  m.world_ = &world;
  m.nodes_ = nodes;
  m.per_node_ = W / nodes;
  // [mesh]
  std::vector<int> row, column;
  for (int i = 0; i < m.per_node_; ++i) row.push_back(m.node() * m.per_node_ + i);
  for (int n = 0; n < nodes; ++n) column.push_back(n * m.per_node_ + m.local());
  // Every rank forms its row first, then its column: a group waits only for its own members, who are
  // forming the same group at the same time.
  m.intra_ = std::make_shared<ProcessGroup>(world.new_group(row, "node"));
  m.inter_ = std::make_shared<ProcessGroup>(world.new_group(column, "replica"));
  // [mesh]
  return m;
}

std::string Mesh::describe() const {
  return fmt::format("{} node{} x {} rank{}", nodes_, nodes_ == 1 ? "" : "s", per_node_, per_node_ == 1 ? "" : "s");
}

int nodes_from_environment() {
  const LaunchEnv env = LaunchEnv::from_environment();  // throws UsageError naming a malformed DP_NET_NODES
  if (env.net_nodes > 0) return env.net_nodes;
  if (env.launched && env.local_world_size > 0 && env.world_size % env.local_world_size == 0)
    return env.world_size / env.local_world_size;
  return 1;
}

}  // namespace dp
