// The 2-D mesh (common/dist/mesh.hpp) and the subgroups it is made of (ProcessGroup::new_group), over ranks
// as threads: each group holds exactly the ranks it should, its collectives reach only them, and bad layouts
// are refused before any group forms.
#include "common/base/errors.hpp"
#include "common/dist/mesh.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace dp {
namespace {

using testing::run_ranks;

// Every rank's world rank, summed over a group: which ranks the group holds, seen from inside it.
double sum_of_world_ranks(ProcessGroup& group, int world_rank) {
  torch::Tensor t = torch::full({1}, static_cast<double>(world_rank), torch::kFloat64);
  group.all_reduce(t);
  return t.item<double>();
}

TEST(Mesh, RowsAreNodesAndColumnsJoinOneRankPerNode) {
  // 6 ranks as 3 nodes x 2: node n holds 2n and 2n+1; column l holds l, l+2, l+4.
  run_ranks(6, [](ProcessGroup& world) {
    Mesh m = Mesh::make(world, 3);
    const int r = world.rank();
    EXPECT_EQ(m.nodes(), 3);
    EXPECT_EQ(m.per_node(), 2);
    EXPECT_EQ(m.node(), r / 2);
    EXPECT_EQ(m.local(), r % 2);
    EXPECT_EQ(m.intra().world_size(), 2);
    EXPECT_EQ(m.inter().world_size(), 3);
    EXPECT_EQ(m.intra().rank(), r % 2);
    EXPECT_EQ(m.inter().rank(), r / 2);
    EXPECT_EQ(sum_of_world_ranks(m.intra(), r), 2 * m.node() + 2 * m.node() + 1);
    EXPECT_EQ(sum_of_world_ranks(m.inter(), r), m.local() + (m.local() + 2) + (m.local() + 4));
    EXPECT_EQ(sum_of_world_ranks(world, r), 15);  // the world group still works beside its subgroups
    EXPECT_EQ(m.describe(), "3 nodes x 2 ranks");
  });
}

TEST(Mesh, TwoMeshesInOneJobNeverMeet) {
  // The second mesh of the same layout forms its groups under new keys: the first's keys hold the addresses
  // of groups already formed, and a group that read them would connect to the wrong sockets.
  run_ranks(
      4,
      [](ProcessGroup& world) {
        Mesh a = Mesh::make(world, 2);
        Mesh b = Mesh::make(world, 2);
        Mesh c = Mesh::make(world, 4);  // 4 nodes of one rank: each intra group is the rank alone
        EXPECT_EQ(c.intra().world_size(), 1);
        EXPECT_EQ(c.inter().world_size(), 4);
        EXPECT_EQ(sum_of_world_ranks(c.inter(), world.rank()), 6);
        EXPECT_EQ(sum_of_world_ranks(b.intra(), world.rank()), world.rank() < 2 ? 1 : 5);
        EXPECT_EQ(sum_of_world_ranks(a.intra(), world.rank()), world.rank() < 2 ? 1 : 5);
        EXPECT_EQ(sum_of_world_ranks(b.inter(), world.rank()), world.rank() % 2 == 0 ? 2 : 4);
      },
      std::chrono::milliseconds(5000));
}

TEST(Mesh, NodesThatDoNotDivideTheRanksAreRefusedNamingTheDivisors) {
  run_ranks(4, [](ProcessGroup& world) {
    try {
      Mesh::make(world, 3);
      ADD_FAILURE() << "3 nodes over 4 ranks was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("3 nodes cannot split 4 ranks"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("(1, 2, 4)"), std::string::npos) << e.what();
    }
    EXPECT_THROW(Mesh::make(world, 0), UsageError);
  });
}

TEST(NewGroup, RefusesRanksThatAreNotIncreasingOrDoNotHoldTheCaller) {
  run_ranks(2, [](ProcessGroup& world) {
    EXPECT_THROW(world.new_group({1, 0}, "backwards"), std::invalid_argument);
    EXPECT_THROW(world.new_group({0, 2}, "too far"), std::invalid_argument);
    const int other = 1 - world.rank();
    EXPECT_THROW(world.new_group({other}, "without me"), std::invalid_argument);
    ProcessGroup alone = world.new_group({world.rank()}, "alone");
    EXPECT_EQ(alone.world_size(), 1);
    EXPECT_EQ(sum_of_world_ranks(alone, world.rank()), world.rank());
  });
}

}  // namespace
}  // namespace dp
