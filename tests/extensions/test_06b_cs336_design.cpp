// Extension 06b: CS336's sharded optimizer (ShardedOptimizer) must be indistinguishable from the optimizer it
// wraps, at any world size, with any parameter groups. Ranks run as threads (run_ranks). Checkpoints:
// test_06c_checkpoints.cpp.
#include "common/measure/accounting.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "tests/stages/sharded_opt_support.hpp"
#include "tests/support/expect.hpp"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <tuple>

namespace {

using namespace dp::testing;
using dp::ProcessGroup;
using dp::ShardedOptimizer;

struct Scenario {
  std::string model = "toy";
  std::string kind = "adamw";
  int world = 2;
  std::string layout = "one";  // "one" or "two" groups
  int add_rest_after = -1;     // >= 0: start with fc1.* only, add the other group after this many steps
  int steps = 10;
};

std::string describe(const Scenario& s) {
  return fmt::format("{} {} W={} groups={} add_after={}", s.model, s.kind, s.world, s.layout, s.add_rest_after);
}

// The CS336 sharded-optimizer test, generalised: after EVERY step the sharded model must equal the model
// trained by the plain optimizer, frozen parameters must not move, and all ranks must agree.
void run_scenario(const Scenario& s) {
  run_ranks(s.world, [&](ProcessGroup& pg) {
    auto p = build_pair(s.model, s.steps);
    std::vector<torch::Tensor> frozen_before;
    for (auto& t : dp::unique_parameters(*p.shd))
      if (!t.requires_grad()) frozen_before.push_back(t.detach().clone());

    const std::string layout = s.add_rest_after >= 0 ? "two" : s.layout;
    Groups ref_groups = make_groups(s.kind, *p.ref, layout, false);
    Groups shd_groups = make_groups(s.kind, *p.shd, layout, true);
    Groups ref_later, shd_later;
    if (s.add_rest_after >= 0) {
      ref_later.push_back(ref_groups.back());
      shd_later.push_back(shd_groups.back());
      ref_groups.pop_back();
      shd_groups.pop_back();
    }
    auto ref_opt = plain_optimizer(s.kind, ref_groups);
    ShardedOptimizer sharded(pg, shd_groups, local_factory(s.kind));
    require(sharded.kind() == s.kind, "kind() is " + sharded.kind());

    for (int step = 0; step < s.steps; ++step) {
      if (step == s.add_rest_after) {
        ref_opt->add_param_group(ref_later[0]);
        sharded.add_param_group(shd_later[0]);
      }
      ref_opt->zero_grad();
      sharded.zero_grad();
      loss_of(*p.ref, p.batches[step]).backward();
      loss_of(*p.shd, p.batches[step]).backward();
      ref_opt->step();
      sharded.step();
      require_same(*p.ref, *p.shd, fmt::format("{}: rank {} after step {}", describe(s), pg.rank(), step + 1));
    }
    size_t k = 0;
    for (auto& t : dp::unique_parameters(*p.shd))
      if (!t.requires_grad()) require(torch::equal(t, frozen_before[k++]), "a frozen parameter changed");
    require(dp::parameters_identical_across_ranks(pg, *p.shd), "ranks disagree");
  });
}

// ---------------------------------------------------------------------------------------------------
// Partition
// ---------------------------------------------------------------------------------------------------

TEST(Partition, LargestFirstToLeastLoadedRank) {
  std::vector<int64_t> loads(2, 0);
  // 50 -> r0, 40 -> r1, 30 -> r1 (40 < 50), 20 -> r0 (50 < 70), 10 -> r0 (tie 70/70: lowest rank)
  auto owner = dp::partition_greedy({10, 50, 20, 30, 40}, loads);
  EXPECT_EQ(owner, (std::vector<int>{0, 0, 0, 1, 1}));
  EXPECT_EQ(loads, (std::vector<int64_t>{80, 70}));
}

TEST(Partition, TiesGoToLowestRankAndEqualSizesKeepInputOrder) {
  std::vector<int64_t> loads(3, 0);
  EXPECT_EQ(dp::partition_greedy({5, 5, 5, 5}, loads), (std::vector<int>{0, 1, 2, 0}));
}

TEST(Partition, MoreRanksThanParameters) {
  std::vector<int64_t> loads(4, 0);
  EXPECT_EQ(dp::partition_greedy({3, 7}, loads), (std::vector<int>{1, 0}));
  EXPECT_EQ(loads, (std::vector<int64_t>{7, 3, 0, 0}));
  std::vector<int64_t> none(4, 0);
  EXPECT_TRUE(dp::partition_greedy({}, none).empty());
}

TEST(Partition, StartsFromCurrentLoads) {
  std::vector<int64_t> loads{100, 0};
  EXPECT_EQ(dp::partition_greedy({10, 10}, loads), (std::vector<int>{1, 1}));
}

TEST(Partition, DeterministicAndBalanced) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<int64_t> size(1, 1000);
  std::vector<int64_t> sizes(200);
  for (auto& s : sizes) s = size(gen);
  std::vector<int64_t> a(5, 0), b(5, 0);
  EXPECT_EQ(dp::partition_greedy(sizes, a), dp::partition_greedy(sizes, b));
  // Greedy largest-first: the spread between ranks never exceeds the largest item.
  EXPECT_LE(*std::max_element(a.begin(), a.end()) - *std::min_element(a.begin(), a.end()),
            *std::max_element(sizes.begin(), sizes.end()));
}

// ---------------------------------------------------------------------------------------------------
// Ownership, zero_grad, errors, memory accounting
// ---------------------------------------------------------------------------------------------------

TEST(ShardedOptimizer, FourRanksOverToyModelOneRankOwnsNothing) {
  run_ranks(4, [](ProcessGroup& pg) {
    auto p = build_pair("toy", 1);
    auto opt = ShardedOptimizer::make<optim::AdamW>(pg, p.shd->parameters(), optim::AdamWOptions(0.1));
    const auto named = dp::unique_named_parameters(*p.shd);
    // Trainable sizes: fc1.weight 100, fc2.fc.weight 500, fc3.weight 250 -> ranks 2, 0, 1; rank 3 owns none.
    std::map<std::string, int> want{
        {"no_grad_fixed_param", -1}, {"fc1.weight", 2}, {"fc2.fc.weight", 0}, {"fc2.fc.bias", -1}, {"fc3.weight", 1}};
    for (const auto& [name, t] : named) require(opt.owner_of(t) == want[name], "owner of " + name);
    auto shares = opt.shares();
    require(shares[3].params == 0 && shares[0].elements == 500 && shares[1].bytes == 1000, "shares");
    require(opt.describe().find("rank 3: 0 tensors") != std::string::npos, opt.describe());
    // The rank that owns nothing still steps (a no-op) and receives every broadcast.
    loss_of(*p.shd, p.batches[0]).backward();
    opt.step();
    require(pg.rank() != 3 || opt.local().state().empty(), "rank 3 has state");
    require(dp::parameters_identical_across_ranks(pg, *p.shd), "ranks disagree");
  });
}

TEST(ShardedOptimizer, TiedWeightIsOwnedAndSteppedOnce) {
  run_ranks(4, [](ProcessGroup& pg) {
    auto p = build_pair("tied", 1);
    require(p.shd->parameters().size() == 5, "LibTorch lists the tied weight twice");
    auto opt = ShardedOptimizer::make<optim::AdamW>(pg, p.shd->parameters(), optim::AdamWOptions(0.1));
    require(opt.parameters().size() == 4, "4 distinct tensors");
    for (const auto& sh : opt.shares()) require(sh.params == 1, "one tensor per rank");
  });
}

TEST(ShardedOptimizer, ZeroGradClearsEveryParameterNotOnlyOwned) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto p = build_pair("tied", 1);
    auto opt = ShardedOptimizer::make<optim::SGD>(pg, p.shd->parameters(), optim::SGDOptions(0.1));
    loss_of(*p.shd, p.batches[0]).backward();
    opt.zero_grad();
    for (auto& t : dp::unique_parameters(*p.shd))
      require(t.grad().defined() && t.grad().abs().sum().item<double>() == 0, "grad not zero");
    opt.zero_grad(/*set_to_none=*/true);
    for (auto& t : dp::unique_parameters(*p.shd)) require(!t.grad().defined(), "grad not cleared");
  });
}

TEST(ShardedOptimizer, RefusesDuplicatesNonLeafTensorsAndForeignOptions) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto p = build_pair("toy", 1);
    auto opt = ShardedOptimizer::make<optim::AdamW>(pg, p.shd->parameters(), optim::AdamWOptions(0.1));
    const size_t before = opt.parameters().size();
    auto fc1 = dp::unique_named_parameters(*p.shd)[1].second;
    expect_usage_error([&] { opt.add_param_group(optim::OptimizerParamGroup({fc1})); }, {"already in group 0"});
    auto non_leaf = fc1 * 2;
    expect_usage_error([&] { opt.add_param_group(optim::OptimizerParamGroup({non_leaf})); }, {"not a leaf"});
    require(opt.parameters().size() == before && opt.param_groups().size() == 1, "refused group left traces");
    expect_usage_error([&] { opt.set_lr(5, 0.1); }, {"group 5"});
    auto extra = torch::zeros({3}, torch::requires_grad());
    expect_usage_error(
        [&] { opt.add_param_group(optim::OptimizerParamGroup({extra}, std::make_unique<optim::SGDOptions>(0.1))); },
        {"options of another optimizer"});
  });
}

TEST(ShardedOptimizer, StateBytesAreOneShareOfTheUnshardedState) {
  run_ranks(3, [](ProcessGroup& pg) {
    auto p = build_pair("toy", 1);
    auto opt = ShardedOptimizer::make<optim::AdamW>(pg, p.shd->parameters(), optim::AdamWOptions(0.1));
    loss_of(*p.shd, p.batches[0]).backward();
    opt.step();
    const int64_t owned = dp::count_elements(opt.owned_parameters());
    auto bytes = dp::count_training_bytes(*p.shd, opt.local());
    require(bytes.state == 8 * owned, fmt::format("state {} bytes for {} owned elements", bytes.state, owned));
    require(bytes.params == 4 * (850 + 2 + 50), "params bytes");  // frozen ones are weights too
    require(bytes.grads == 4 * 850, "grad bytes");
    auto all = pg.all_gather(static_cast<double>(bytes.state));
    require(std::accumulate(all.begin(), all.end(), 0.0) == 8.0 * 850, "states must add up to the unsharded state");
  });
  auto e = dp::zero1_expected_bytes(1000, 4);
  EXPECT_EQ(e.params, 4000);
  EXPECT_EQ(e.grads, 4000);
  EXPECT_EQ(e.state, 2000);
  EXPECT_EQ(dp::zero1_expected_bytes(1000, 1).total(), 16000);
  EXPECT_GT(dp::peak_rss_bytes(), 0);
  EXPECT_GT(dp::current_rss_bytes(), 0);
  EXPECT_GE(dp::peak_rss_bytes(), dp::current_rss_bytes());
}

// ---------------------------------------------------------------------------------------------------
// Equivalence with the unsharded optimizer (CS336 and variations)
// ---------------------------------------------------------------------------------------------------

TEST(Cs336, ShardedAdamWEqualsAdamWOnToyModel) { run_scenario({"toy", "adamw", 2}); }
TEST(Cs336, ShardedAdamWEqualsAdamWOnTiedModel) { run_scenario({"tied", "adamw", 2}); }

// The exact CS336 construction: the convenience constructor and the model's raw parameter list.
TEST(Cs336, ConvenienceConstructorMatchesPlainAdamW) {
  run_ranks(2, [](ProcessGroup& pg) {
    for (const std::string model : {"toy", "tied"}) {
      auto p = build_pair(model, 10);
      const auto opts = optim::AdamWOptions(0.1).weight_decay(0.1).betas(std::make_tuple(0.9, 0.999)).eps(1e-8);
      optim::AdamW ref(dp::unique_parameters(*p.ref), opts);
      auto shd = ShardedOptimizer::make<optim::AdamW>(pg, p.shd->parameters(), opts);
      for (int step = 0; step < 10; ++step) {
        ref.zero_grad();
        shd.zero_grad();
        loss_of(*p.ref, p.batches[step]).backward();
        loss_of(*p.shd, p.batches[step]).backward();
        ref.step();
        shd.step();
        require_same(*p.ref, *p.shd, fmt::format("{} step {}", model, step + 1));
      }
    }
  });
}

using Combo = std::tuple<std::string, std::string, int>;  // model, optimizer, world size
class Equivalence : public ::testing::TestWithParam<Combo> {};

TEST_P(Equivalence, EveryStepEqualsUnsharded) {
  auto [model, kind, world] = GetParam();
  run_scenario({model, kind, world});
}
TEST_P(Equivalence, ParamGroupsWithDifferentLearningRates) {
  auto [model, kind, world] = GetParam();
  run_scenario({model, kind, world, "two"});
}
TEST_P(Equivalence, GroupAddedAfterStep3) {
  auto [model, kind, world] = GetParam();
  run_scenario({model, kind, world, "two", 3});
}

INSTANTIATE_TEST_SUITE_P(Stage06, Equivalence,
                         ::testing::Combine(::testing::Values("toy", "tied"), ::testing::Values("adamw", "adam", "sgd"),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<Combo>& info) {
                           return fmt::format("{}_{}_W{}", std::get<0>(info.param), std::get<1>(info.param),
                                              std::get<2>(info.param));
                         });

// ---------------------------------------------------------------------------------------------------
// DDP + sharded AdamW on the tiny Transformer
// ---------------------------------------------------------------------------------------------------

TEST(Transformer, DdpWithShardedAdamWEqualsDdpWithAdamW) {
  constexpr int kWorld = 2, kSteps = 3, kPerRank = 2, kT = 16;
  run_ranks(kWorld, [&](ProcessGroup& pg) {
    auto cfg = dp::TransformerConfig::preset("tiny", kT);
    auto twins = twin_transformers(cfg, 42, {kSteps, kWorld * kPerRank, kT + 1});
    auto &ref = twins.ref, &shd = twins.shd;
    const torch::Tensor& tokens = twins.tokens;
    dp::broadcast_parameters(pg, *ref);
    dp::broadcast_parameters(pg, *shd);
    const auto opts = optim::AdamWOptions(1e-3).weight_decay(0.1);
    optim::AdamW plain(dp::unique_parameters(*ref), opts);
    auto sharded = ShardedOptimizer::make<optim::AdamW>(pg, dp::unique_parameters(*shd), opts);
    // Data parallel by hand: each rank's rows, gradients summed over ranks and divided by W.
    auto ddp_step = [&](dp::TransformerLM& m, auto& opt, const torch::Tensor& batch) {
      opt.zero_grad();
      auto rows = batch.narrow(0, pg.rank() * kPerRank, kPerRank);
      dp::lm_loss(m->forward(rows.narrow(1, 0, kT)), rows.narrow(1, 1, kT)).backward();
      for (auto& p : dp::unique_parameters(*m, true)) {
        auto g = p.grad();
        pg.all_reduce(g);
        g.div_(kWorld);
      }
      opt.step();
    };
    for (int step = 0; step < kSteps; ++step) {
      ddp_step(ref, plain, tokens[step]);
      ddp_step(shd, sharded, tokens[step]);
      require_same(*ref, *shd, fmt::format("transformer step {}", step + 1));
    }
    require(dp::parameters_identical_across_ranks(pg, *shd), "ranks disagree");
  });
}

}  // namespace
