// Stage 04 (OverlapDdp) on its own: one launch per unique trainable parameter, the same launch order on
// every rank, and unused parameters reduced in finish. What every DDP variant must do is in
// test_grad_sync_contract.cpp, what every hook-driven one must do in test_hook_contract.cpp. Ranks are
// threads.
#include "common/model/models.hpp"
#include "stages/04_overlap/overlap_ddp.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

using namespace dp::testing;  // run_ranks, make_local, make_seeded, rng_mutex, same_on_all_ranks
using dp::OverlapDdp;
using dp::ProcessGroup;

// A model with a trainable parameter that forward never uses.
struct WithUnusedImpl : torch::nn::Module {
  WithUnusedImpl() {
    fc = register_module("fc", torch::nn::Linear(dp::kToyIn, dp::kToyOut));
    unused = register_parameter("unused", torch::ones({3}));
  }
  torch::Tensor forward(torch::Tensor x) { return fc(x); }
  torch::nn::Linear fc{nullptr};
  torch::Tensor unused;
};

// --- One launch per unique trainable parameter, from backward -------------------------------------

TEST(Stage04Overlap, OneLaunchPerTrainableParameterTiedWeightOnce) {
  run_ranks(2, [](ProcessGroup& pg) {
    for (const char* name : {"toy", "tied"}) {
      std::shared_ptr<dp::ToyBase> model;
      {
        std::lock_guard<std::mutex> lock(rng_mutex());
        torch::manual_seed(pg.rank());
        model = dp::make_toy_model(name);
      }
      OverlapDdp ddp(pg, model);
      // toy: fc1.weight, fc2.fc.weight, fc3.weight (the two frozen ones are skipped);
      // tied: fc1..fc3 and fc5, with fc4.weight being fc2.weight.
      const size_t expected = std::string(name) == "toy" ? 3 : 4;
      ASSERT_EQ(ddp.parameters().size(), expected) << name;
      for (int step = 0; step < 2; ++step) {
        ddp.on_train_batch_start();
        const auto before = ddp.launched_count();
        model->forward(torch::ones({4, dp::kToyIn}) * (pg.rank() + 1)).pow(2).mean().backward();
        // The tied weight's AccumulateGrad runs once per backward, with both uses summed: one launch.
        EXPECT_EQ(ddp.launched_count() - before, static_cast<int64_t>(expected)) << name;
        ddp.finish_gradient_synchronization();
        auto launches = ddp.launches();
        ASSERT_EQ(launches.size(), expected);
        for (auto& l : launches) EXPECT_TRUE(l.during_backward) << name;
        for (auto& p : ddp.parameters()) EXPECT_TRUE(same_on_all_ranks(pg, p.grad())) << name;
      }
    }
  });
}

// The same launch order on every rank (Gloo pairs the k-th collectives of all ranks).
TEST(Stage04Overlap, LaunchOrderIsTheSameOnEveryRankAndLastLayerFirst) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    OverlapDdp ddp(pg, model);
    ddp.on_train_batch_start();
    model->forward(x).pow(2).mean().backward();
    ddp.finish_gradient_synchronization();
    std::vector<double> order;
    for (auto& l : ddp.launches()) order.push_back(static_cast<double>(l.index));
    auto all = pg.all_gather(order);
    for (auto& other : all) EXPECT_EQ(other, order);
    // Registration order is fc1.weight, fc1.bias, fc2..., fc3.bias: backward reaches fc3 first.
    ASSERT_EQ(order.size(), 6u);
    EXPECT_GE(order.front(), 4);
    EXPECT_LE(order.back(), 1);
  });
}

// --- A parameter that gets no gradient ------------------------------------------------------------

TEST(Stage04Overlap, UnusedParameterIsReducedInFinish) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = make_seeded<WithUnusedImpl>(pg.rank());
    OverlapDdp ddp(pg, model);
    ASSERT_EQ(ddp.parameters().size(), 3u);
    for (int step = 0; step < 2; ++step) {
      ddp.on_train_batch_start();
      model->forward(torch::ones({2, dp::kToyIn}) * (pg.rank() + 1)).sum().backward();
      EXPECT_EQ(ddp.launches().size(), 2u);  // fc.weight and fc.bias, from backward
      ddp.finish_gradient_synchronization();
      auto launches = ddp.launches();
      ASSERT_EQ(launches.size(), 3u);
      EXPECT_FALSE(launches.back().during_backward);
      EXPECT_EQ(ddp.parameter_names()[launches.back().index], "unused");
      ASSERT_TRUE(model->unused.grad().defined());
      EXPECT_TRUE(torch::equal(model->unused.grad(), torch::zeros({3})));
    }
  });
}

}  // namespace
