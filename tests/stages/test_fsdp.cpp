// Stage 07: FSDP against single-process training (a port of CS336 2026's test_fsdp.py) and what FSDP
// promises besides: weights own no memory between steps, the next unit is gathered while this one
// computes, a step issues 2U-1 (or U) all-gathers and U reduce-scatters, a second backward is refused.
// (Momentum and accumulated micro-batches: the strategy contract, test_strategy_contract.cpp; the
// Transformer: extension 07a's test.)
// One typed suite runs every body in the four modes (fp32/bf16 x reshard after forward or not); ranks
// are threads (run_ranks).
#include "common/comm/grad_hooks.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/cli.hpp"     // parse_compute_dtype
#include "common/measure/memory.hpp"  // tensor_bytes
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "stages/07_fsdp/fsdp.hpp"
#include "stages/07_fsdp/strategies.hpp"
#include "tests/stages/fsdp_modes.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <mutex>

namespace {

using namespace dp::testing;
using dp::Fsdp;
using dp::FsdpOptions;
using dp::ProcessGroup;

template <typename M>
class FsdpContract : public ::testing::Test {};
TYPED_TEST_SUITE(FsdpContract, FsdpModes, FsdpModeNames);

dp::ToyFSDPModel seeded_toy(uint64_t seed) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  return dp::ToyFSDPModel();
}

// CS336 2026's test_fsdp_correctness: 3 SGD steps equal one process on all rows (fp32 1e-6, bf16 1e-4).
TYPED_TEST(FsdpContract, Cs336CorrectnessWorld2) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto r = dp::check_strategy(pg, dp::fsdp_strategy(TypeParam::options()), dp::StrategyCheck::cs336_fsdp());
    EXPECT_LE(r.diff, r.bound) << "rank " << pg.rank();
  });
}

// Padding: 6,400 / 8,192 / 8,192 / 6,400 sharded elements over 3 ranks leave partly padded chunks.
TYPED_TEST(FsdpContract, Cs336CorrectnessWorld3Padded) {
  run_ranks(3, [](ProcessGroup& pg) {
    auto r = dp::check_strategy(pg, dp::fsdp_strategy(TypeParam::options()), dp::StrategyCheck::cs336_fsdp());
    EXPECT_LE(r.diff, r.bound);
  });
}

// CS336 2026's test_fsdp_gradient_sync: fp32 shard-shaped gradients, replicated ones equal on all ranks.
TYPED_TEST(FsdpContract, Cs336GradientSync) {
  run_ranks(2, [](ProcessGroup& pg) { dp::check_gradient_sync(pg, dp::fsdp_strategy(TypeParam::options())); });
}

// Between steps the model's Linear/Embedding weights own no memory; a rank keeps its chunk only; the
// gathered full weights of all units, shards gathered back, are rank 0's initial weights.
TYPED_TEST(FsdpContract, ShardsOnlyBetweenSteps) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = seeded_toy(10 + pg.rank());  // different per rank: construction must broadcast rank 0's
    auto rank0 = seeded_toy(10);
    Fsdp fsdp(pg, model.ptr(), model->units(), TypeParam::options());
    for (auto* lin : {model->fc1.get(), model->fc2.get(), model->lm_head.get()})
      EXPECT_EQ(lin->weight.storage().nbytes(), 0u);
    EXPECT_EQ(model->embedding->weight.storage().nbytes(), 0u);
    EXPECT_EQ(fsdp.gathered_bytes(), 0);
    EXPECT_EQ(fsdp.sharded_parameters(), 29376 - 64 - 128);                      // all but the two RMSNorm gains
    EXPECT_EQ(dp::tensor_bytes(fsdp.parameters()), 4 * (29184 / 2 + 64 + 128));  // 29,184 split evenly, norms whole
    auto full = fsdp.gather_full_parameters();
    auto want = dp::unique_named_parameters(*rank0, true);
    ASSERT_EQ(full.size(), want.size());
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_EQ(full[i].first, want[i].first);
      EXPECT_TRUE(torch::equal(full[i].second, want[i].second)) << full[i].first;
    }
  });
}

// The sharding's gather() of the pieces the optimizer steps is the full model (what gather_full_parameters()
// gives), and its cut() cuts it back into exactly those pieces: a checkpoint's round trip. At 3 ranks every
// unit carries padding, which gather() must cut and cut() must restore as zeros.
TYPED_TEST(FsdpContract, GatherFullAndShardFullRoundTrip) {
  run_ranks(3, [](ProcessGroup& pg) {
    auto model = seeded_toy(3);
    Fsdp fsdp(pg, model.ptr(), model->units(), TypeParam::options());
    const dp::ShardedParams held = fsdp.sharding();
    const auto pieces = fsdp.parameters();
    const auto full = held.gather(pg, pieces);
    const auto named = fsdp.gather_full_parameters();
    ASSERT_EQ(full.size(), named.size());
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_EQ(full[i].scalar_type(), torch::kFloat32);
      EXPECT_TRUE(torch::equal(full[i], named[i].second)) << named[i].first;
    }
    const auto back = held.cut(full, pg.rank());
    ASSERT_EQ(back.size(), pieces.size());
    for (size_t i = 0; i < back.size(); ++i) EXPECT_TRUE(torch::equal(back[i], pieces[i].detach())) << "piece " << i;
    EXPECT_THROW(held.cut({full[0]}, pg.rank()), std::invalid_argument);
    EXPECT_THROW(held.gather(pg, {pieces[0]}), std::invalid_argument);  // before any collective: every rank throws
  });
}

// The prefetch: when unit u starts computing in forward, units up to u + 1 have been launched; a step
// issues 2U - 1 all-gathers when resharding (the last unit is not freed after forward), else U, U
// reduce-scatters and one all-reduce (the replicated norm gains); afterwards nothing stays gathered.
// Reshard keeps at most two units gathered at once.
TYPED_TEST(FsdpContract, PrefetchAndCollectiveCounts) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = seeded_toy(1);
    Fsdp fsdp(pg, model.ptr(), model->units(), TypeParam::options());
    const int64_t U = static_cast<int64_t>(fsdp.unit_count());
    std::vector<int64_t> launched_at_start;
    auto run = fsdp.runner();
    dp::UnitRunner spy = [&](size_t u, const std::function<torch::Tensor()>& body) {
      return run(u, [&] {
        launched_at_start.push_back(fsdp.all_gathers());
        return body();
      });
    };
    auto tokens = torch::randint(0, 100, {2, 8});
    model->forward_units(tokens, spy).to(torch::kFloat32).sum().backward();
    fsdp.finish_gradient_synchronization();
    for (int64_t u = 0; u < U; ++u) EXPECT_EQ(launched_at_start[u], std::min(u + 2, U)) << "unit " << u;
    EXPECT_EQ(fsdp.all_gathers(), TypeParam::reshard ? 2 * U - 1 : U);
    EXPECT_EQ(fsdp.reduce_scatters(), U);
    EXPECT_EQ(fsdp.all_reduces(), 1);
    EXPECT_EQ(fsdp.gathered_bytes(), 0);
    const int64_t e = TypeParam::options().compute_dtype == torch::kFloat32 ? 4 : 2;
    if (TypeParam::reshard)
      EXPECT_EQ(fsdp.peak_gathered_bytes(), (8192 + 8192) * e);  // fc1 and fc2 units
    else
      EXPECT_EQ(fsdp.peak_gathered_bytes(), 29184 * e);  // every unit, from forward to backward
  });
}

// No gradient: forward under NoGradGuard frees every unit right after it ran.
TYPED_TEST(FsdpContract, NoGradForwardFreesEverything) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = seeded_toy(1);
    Fsdp fsdp(pg, model.ptr(), model->units(), TypeParam::options());
    torch::NoGradGuard no_grad;
    auto out = model->forward_units(torch::randint(0, 100, {2, 8}), fsdp.runner());
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 8, 100}));
    EXPECT_EQ(fsdp.gathered_bytes(), 0);
  });
}

// A second backward before finish_gradient_synchronization() is refused with the stage 04 message.
TYPED_TEST(FsdpContract, SecondBackwardRefused) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = seeded_toy(1);
    Fsdp fsdp(pg, model.ptr(), model->units(), TypeParam::options());
    auto tokens = torch::randint(0, 100, {2, 8});
    model->forward_units(tokens, fsdp.runner()).to(torch::kFloat32).sum().backward();
    auto again = model->forward_units(tokens, fsdp.runner()).to(torch::kFloat32).sum();
    try {
      again.backward();
      ADD_FAILURE() << "a second backward was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(dp::kBackwardTwiceMessage), std::string::npos) << e.what();
    }
  });
}

// Exercise 07.1's classic slips (docs/workbook.md), planted: a unit's forward that runs with its all-gather
// launched but never waited on, or never launched. Whatever run_unit does, the runner checks that the unit is
// whole before its forward and names the mistake, on every rank, at the first unit.
struct NoWaitFsdp : Fsdp {
  using Fsdp::Fsdp;
  torch::Tensor run_unit(size_t u, const std::function<torch::Tensor()>& body) override {
    launch_gather(u);  // ...and no wait_gathered(u): the forward would read weights still arriving
    return body();
  }
};
struct NoGatherFsdp : Fsdp {
  using Fsdp::Fsdp;
  torch::Tensor run_unit(size_t, const std::function<torch::Tensor()>& body) override { return body(); }
};

template <typename Mutant>
void expect_shard_not_gathered(const std::string& how) {
  run_ranks(2, [&](ProcessGroup& pg) {
    auto model = seeded_toy(1);
    Mutant fsdp(pg, model.ptr(), model->units(), {});
    try {
      model->forward_units(torch::randint(0, 100, {2, 8}), fsdp.runner());
      ADD_FAILURE() << "rank " << pg.rank() << ": a forward with unit 0 " << how << " ran";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("hint [shard-not-gathered]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("unit 0"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(how), std::string::npos) << e.what();
    }
  });
}

TEST(FsdpCanFail, GatherNotWaitedIsNamed) { expect_shard_not_gathered<NoWaitFsdp>("never waited on"); }
TEST(FsdpCanFail, GatherNotLaunchedIsNamed) { expect_shard_not_gathered<NoGatherFsdp>("not gathered"); }

TEST(Fsdp, ComputeDtypeNamesAndRefusals) {
  EXPECT_EQ(dp::parse_compute_dtype("bf16"), torch::kBFloat16);
  EXPECT_EQ(dp::parse_compute_dtype("float32"), torch::kFloat32);
  expect_usage_error([] { dp::parse_compute_dtype("float16"); }, {"float16", "bfloat16", "float32"});
}

TEST(Fsdp, ParameterInNoUnitRefused) {
  run_ranks(1, [](ProcessGroup& pg) {
    auto model = seeded_toy(1);
    auto units = model->units();
    units.pop_back();  // lm_head in no unit
    EXPECT_THROW(Fsdp(pg, model.ptr(), units, {}), std::invalid_argument);
  });
}

TEST(Fsdp, ParameterInTwoUnitsRefused) {
  run_ranks(1, [](ProcessGroup& pg) {
    auto model = seeded_toy(1);
    auto units = model->units();
    units.push_back(units.back());  // lm_head in the last unit and in one more
    try {
      Fsdp fsdp(pg, model.ptr(), units, {});
      ADD_FAILURE() << "a parameter in two units was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("is in units"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
