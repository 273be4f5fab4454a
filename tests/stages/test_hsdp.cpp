// Stage 10: HSDP against single-process training on 2-D meshes of ranks as threads (2x2, 2x3, 3x2), in each
// accumulation flavour; what each flavour sends across nodes per step; and the slips the check must catch.
// (HSDP in the training-strategy contract suite: test_strategy_contract.cpp.)
#include "common/base/errors.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/model/models.hpp"
#include "stages/10_hierarchy/hsdp.hpp"
#include "stages/10_hierarchy/strategies.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

namespace {

using dp::HsdpSync;
using dp::ProcessGroup;
using dp::testing::run_ranks;

const HsdpSync kFlavours[] = {HsdpSync::every_micro_batch, HsdpSync::all_reduce_last, HsdpSync::none_until_last};

// Every flavour, 1 and 3 micro-batches per step, on three meshes: equal to one process on the whole batch
// (the common check's bound), the same on every rank, with a factor 2 of margin.
TEST(Hsdp, TrainsLikeOneProcessOnEveryMeshInEveryFlavour) {
  struct Layout {
    int world, nodes;
  };
  for (const Layout l : {Layout{4, 2}, Layout{6, 2}, Layout{6, 3}})
    for (const HsdpSync sync : kFlavours)
      for (const int k : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << l.nodes << " nodes x " << l.world / l.nodes << ", "
                                          << dp::hsdp_sync_name(sync) << ", " << k << " micro-batches");
        run_ranks(l.world, [&](ProcessGroup& pg) {
          dp::StrategyCheck c;
          c.steps = 2;
          c.accumulate = k;
          c.rows = 6;
          const dp::Margin m = dp::check_strategy(pg, dp::hsdp_strategy(l.nodes, {}, sync), c);
          EXPECT_LE(m.ratio(), 0.5) << "within the bound, but with less than a factor 2 of margin";
        });
      }
}

// bf16 compute: the reference computes in bf16 too (Strategy::compute_dtype()).
TEST(Hsdp, TrainsLikeOneProcessInBf16) {
  run_ranks(4, [](ProcessGroup& pg) {
    dp::FsdpOptions f;
    f.compute_dtype = torch::kBFloat16;
    dp::StrategyCheck c;
    c.accumulate = 2;
    const dp::Margin m = dp::check_strategy(pg, dp::hsdp_strategy(2, f, HsdpSync::all_reduce_last), c);
    EXPECT_LE(m.ratio(), 0.5);
  });
}

// What crosses the uplink in one step of K = 3 micro-batches at 2x2, counted by the strategy: the all-reduces
// across nodes (one per unit, one of the replicated norms) K times (every micro-batch) or once; reduce-scatters
// in the node K x U times, or U (nothing until the last). Together they carry every shard and replicated
// gradient: 2(M-1)/M x 4 bytes x (the padded chunks + the replicated elements) per crossing.
TEST(Hsdp, EachFlavourSendsWhatItSaysAcrossNodes) {
  for (const HsdpSync sync : kFlavours)
    run_ranks(4, [sync](ProcessGroup& pg) {
      dp::Mesh mesh = dp::Mesh::make(pg, 2);
      dp::ToyFSDPModel model{nullptr};
      {
        std::lock_guard<std::mutex> lock(dp::testing::rng_mutex());
        torch::manual_seed(3);
        model = dp::ToyFSDPModel();
      }
      dp::Hsdp hsdp(mesh, model.ptr(), model->units(), {}, sync);
      const int64_t U = static_cast<int64_t>(hsdp.unit_count());
      int64_t elements = 0;
      for (const auto& p : hsdp.parameters()) elements += p.numel();
      const int K = 3;
      for (int k = 0; k < K; ++k) {
        hsdp.set_last_micro_batch(k == K - 1);
        model->forward_units(torch::randint(0, 100, {2, 8}), hsdp.runner()).sum().backward();
        hsdp.finish_gradient_synchronization();
      }
      const int64_t crossings = sync == HsdpSync::every_micro_batch ? K : 1;
      EXPECT_EQ(hsdp.inter_all_reduces(), crossings * (U + 1)) << dp::hsdp_sync_name(sync);  // units, the norms
      EXPECT_EQ(hsdp.reduce_scatters(), (sync == HsdpSync::none_until_last ? 1 : K) * U) << dp::hsdp_sync_name(sync);
      EXPECT_DOUBLE_EQ(hsdp.inter_sent_bytes(), crossings * 2.0 * (2 - 1) / 2 * 4.0 * elements);
    });
}

// The slips: no all-reduce across nodes (each node trains on its own half of the batch), and the node's mean sent
// where its sum belongs (gradients L times too small). Both leave the models different from one process's.
struct CrossNodesSkipped : dp::Hsdp {
  using Hsdp::Hsdp;
  void after_shard_reduced(size_t) override {}
  void all_reduce_across_nodes() override {}
};
struct NodeMeanSentNotSum : dp::Hsdp {
  using Hsdp::Hsdp;
  void after_shard_reduced(size_t u) override {
    if (crosses_now()) cross(u, shards()[u].grad().clone());
  }
};
template <typename Mutant>
dp::MakeHsdp plant() {
  return [](dp::Mesh& mesh, std::shared_ptr<torch::nn::Module> model, const dp::ModuleUnits& units,
            dp::FsdpOptions opts, HsdpSync sync) -> std::unique_ptr<dp::Hsdp> {
    return std::make_unique<Mutant>(mesh, std::move(model), units, opts, sync);
  };
}
template <typename Mutant>
void expect_caught() {
  run_ranks(4, [](ProcessGroup& pg) {
    EXPECT_THROW(dp::check_strategy(pg, dp::hsdp_strategy(2, {}, HsdpSync::all_reduce_last, plant<Mutant>())),
                 dp::CheckFailed);
  });
}
TEST(HsdpCanFail, AllReduceAcrossNodesSkipped) { expect_caught<CrossNodesSkipped>(); }
TEST(HsdpCanFail, NodeMeanSentWhereItsSumBelongs) { expect_caught<NodeMeanSentNotSum>(); }

// Refused before any group forms: nodes that do not divide the ranks; bf16 gradients kept across micro-batches.
TEST(HsdpBadInput, NodesThatDoNotDivideTheRanks) {
  run_ranks(4, [](ProcessGroup& pg) { EXPECT_THROW(dp::check_strategy(pg, dp::hsdp_strategy(3)), dp::UsageError); });
}
TEST(HsdpBadInput, Bf16WithNothingUntilTheLast) {
  run_ranks(2, [](ProcessGroup& pg) {
    dp::FsdpOptions f;
    f.compute_dtype = torch::kBFloat16;
    EXPECT_THROW(dp::check_strategy(pg, dp::hsdp_strategy(2, f, HsdpSync::none_until_last)), dp::UsageError);
  });
}

}  // namespace
