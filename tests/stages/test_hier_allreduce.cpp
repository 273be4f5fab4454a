// Stage 10's hierarchical all-reduce (stages/10_hierarchy/hierarchical.hpp), ranks as threads: it sums like
// the flat all-reduce on every mesh layout and the same bits land on every rank; the bytes it counts per tier
// are the formula's; as stage 05's bucket hook it trains like one process; a failed peer ends in an exception.
#include "common/comm/shard_comm.hpp"
#include "common/dist/mesh.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/tolerance.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/10_hierarchy/hierarchical.hpp"
#include "tests/support/ranks.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>

namespace {

using dp::HierarchicalAllReduce;
using dp::HierarchicalHook;
using dp::Mesh;
using dp::ProcessGroup;
using dp::TierBytes;
using dp::testing::run_ranks;
using dp::testing::same_on_all_ranks;

struct Layout {
  int nodes, per_node;
};
const Layout kLayouts[] = {{2, 2}, {3, 2}, {2, 3}, {1, 4}, {4, 1}};

// [n] normal entries, different on every rank and length.
torch::Tensor random_data(int64_t n, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * rank + n);
  return torch::randn({n}, gen);
}

TEST(HierAllReduce, SumsLikeTheFlatAllReduceOnEveryRankAlike) {
  for (const Layout& lay : kLayouts) {
    const int W = lay.nodes * lay.per_node;
    SCOPED_TRACE(::testing::Message() << lay.nodes << " nodes x " << lay.per_node);
    run_ranks(W, [&](ProcessGroup& pg) {
      Mesh mesh = Mesh::make(pg, lay.nodes);
      HierarchicalAllReduce hier(mesh);
      // 1 and 7 and 1001 need padding for per_node 2, 3 and 4 (not 1001 at 3); 12 is reduced in place.
      for (int64_t n : {1, 7, 12, 1001}) {
        torch::Tensor x = random_data(n, pg.rank());
        torch::Tensor flat = x.clone(), ours = x.clone();
        pg.all_reduce(flat);
        hier.run(ours);
        // Both are sums of the same W terms in other orders, each within gamma_{W-1} sum_i |x_i| of the
        // exact sum (Higham 4.2; sum_i |x_i| computed in fp64): 2 gamma_{W-1} apart at most.
        torch::Tensor abs_sum = x.abs().to(torch::kFloat64);
        pg.all_reduce(abs_sum);
        const double u = dp::unit_roundoff(torch::kFloat32);
        torch::Tensor bound = 2 * dp::gamma_n(W - 1, u) * abs_sum;
        torch::Tensor diff = (ours - flat).abs().to(torch::kFloat64);
        EXPECT_TRUE((diff <= bound).all().item<bool>()) << "n " << n << ": max |diff| " << diff.max().item<double>()
                                                        << ", max bound " << bound.max().item<double>();
        EXPECT_TRUE(same_on_all_ranks(pg, ours)) << "n " << n;
      }
    });
  }
}

// Rank r's ring successor is r + 1 (mod W); ranks r and r + 1 share a node when r / per_node is the same.
// Counted hop by hop, not by the formula: what each rank sends is 2(W-1)/W x bytes.
TEST(HierAllReduce, ByteFormulasAgreeWithTheRingsHops) {
  const double B = 1e6;
  for (const Layout& lay : kLayouts) {
    const int W = lay.nodes * lay.per_node;
    TierBytes mean;
    double uplink0 = 0;  // what node 0 sends over its uplink
    for (int r = 0; r < W; ++r) {
      const bool crosses = r / lay.per_node != ((r + 1) % W) / lay.per_node;
      (crosses ? mean.inter : mean.intra) += 2.0 * (W - 1) / W * B / W;
      if (crosses && r / lay.per_node == 0) uplink0 += 2.0 * (W - 1) / W * B;
    }
    const TierBytes flat = dp::flat_ring_bytes(B, lay.nodes, lay.per_node);
    EXPECT_DOUBLE_EQ(flat.intra, mean.intra) << lay.nodes << " x " << lay.per_node;
    EXPECT_DOUBLE_EQ(flat.inter, mean.inter) << lay.nodes << " x " << lay.per_node;
    EXPECT_DOUBLE_EQ(dp::uplink_bytes_flat(B, lay.nodes, lay.per_node), uplink0);
    // Hierarchical: the node's per_node ranks all send their inter-node bytes out of it.
    const TierBytes h = dp::hierarchical_bytes(B, lay.nodes, lay.per_node);
    EXPECT_DOUBLE_EQ(dp::uplink_bytes_hierarchical(B, lay.nodes, lay.per_node), lay.per_node * h.inter);
  }
  // 2 x 2: intra 2 (1/2) B, inter 2 (1/2) B/2; the uplink carries B against the flat ring's 1.5 B.
  EXPECT_DOUBLE_EQ(dp::hierarchical_bytes(B, 2, 2).intra, B);
  EXPECT_DOUBLE_EQ(dp::hierarchical_bytes(B, 2, 2).inter, B / 2);
  EXPECT_DOUBLE_EQ(dp::uplink_bytes_flat(B, 2, 2), 1.5 * B);
  EXPECT_DOUBLE_EQ(dp::uplink_bytes_hierarchical(B, 2, 2), B);
  EXPECT_THROW(dp::flat_ring_bytes(B, 0, 2), std::invalid_argument);
}

TEST(HierAllReduce, CountsTheFormulasBytesPerTier) {
  for (const Layout& lay : kLayouts) {
    const int W = lay.nodes * lay.per_node;
    run_ranks(W, [&](ProcessGroup& pg) {
      Mesh mesh = Mesh::make(pg, lay.nodes);
      HierarchicalAllReduce hier(mesh);
      TierBytes expected;
      for (int64_t n : {12, 1001}) {  // padded to a multiple of per_node: those are the bytes sent
        torch::Tensor t = random_data(n, pg.rank());
        hier.run(t);
        const int64_t padded = dp::FlatLayout::of(n, lay.per_node).padded;
        const TierBytes f = dp::hierarchical_bytes(4.0 * padded, lay.nodes, lay.per_node);
        expected.intra += f.intra;
        expected.inter += f.inter;
      }
      EXPECT_DOUBLE_EQ(hier.sent().intra, expected.intra) << lay.nodes << " x " << lay.per_node;
      EXPECT_DOUBLE_EQ(hier.sent().inter, expected.inter) << lay.nodes << " x " << lay.per_node;
    });
  }
}

// Stage 05's DDP at 2 nodes x 2 ranks with the hook, against one process (the checks of every DDP variant):
// one bucket (10 kB), a few (500 B) and one per tensor (1 B), each bucket queued while backward goes on.
TEST(HierHook, BucketedDdpTrainsLikeOneProcess) {
  for (double cap_mb : {1e-2, 5e-4, 1e-6}) {
    SCOPED_TRACE(::testing::Message() << "cap " << cap_mb << " MB");
    run_ranks(4, [&](ProcessGroup& pg) {
      Mesh mesh = Mesh::make(pg, 2);
      std::shared_ptr<HierarchicalHook> state;
      size_t buckets = 0;
      dp::MakeGradSync make = [&](ProcessGroup& g, std::shared_ptr<torch::nn::Module> m) {
        auto ddp = std::make_unique<dp::BucketedDdp>(g, std::move(m), cap_mb);
        state = std::make_shared<HierarchicalHook>(mesh);
        ddp->register_comm_hook(dp::hierarchical_hook(state));
        buckets = ddp->bucket_count();
        return ddp;
      };
      dp::check_toy_mlp_experiment(pg, make);
      EXPECT_GT(state->sent().inter, 0);  // the hook did the reducing
      dp::check_cs336_scenario(pg, "tied", make);
      if (cap_mb < 1e-5) EXPECT_EQ(buckets, 4u);  // the tied model's 4 trainable tensors, one bucket each
    });
  }
}

// A bucket that fails in the worker (here one that is not contiguous) ends in an exception at wait(), never a hang,
// and every bucket queued after it fails with the same exception without communicating: the ranks' sequences of
// collectives no longer match. (A peer that died surfaces the same way, as the collective's own error, which the
// worker hands on like this one.) One rank, so that no connection is open when the mesh's groups go: among ranks
// that are threads of one process, tearing a failed run's subgroups down raced the world's closing barrier (CI).
TEST(HierHook, AFailedBucketEndsInAnExceptionNotAHang) {
  const auto start = std::chrono::steady_clock::now();
  run_ranks(
      1,
      [&](ProcessGroup& pg) {
        Mesh mesh = Mesh::make(pg, 1);
        auto state = std::make_shared<HierarchicalHook>(mesh);
        dp::CommHook hook = dp::hierarchical_hook(state);
        torch::Tensor a = torch::ones({10, 10}).t(), b = torch::ones({100});  // a: not contiguous
        dp::BucketWork wa = hook(pg, a, "bucket 0"), wb = hook(pg, b, "bucket 1");
        EXPECT_THROW(wa.wait(), std::invalid_argument);
        EXPECT_THROW(wb.wait(), std::invalid_argument);  // the first failure, again: bucket 1 never ran
        EXPECT_TRUE(torch::equal(b, torch::ones({100})));
      },
      std::chrono::milliseconds(3000));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

}  // namespace
