// Stage 05 on its own: bucket assignment as a pure function (no ranks), the buckets BucketedDdp builds
// at CS336's caps, bad caps, and buckets launched strictly in index order. What every DDP variant must
// do is in test_grad_sync_contract.cpp, what every hook-driven one must do in test_hook_contract.cpp.
// Ranks are threads.
#include "common/base/c10d_compat.hpp"
#include "common/dist/runtime.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/05_bucketed/buckets.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/ranks.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

using namespace dp::testing;  // run_ranks, make_seeded, rng_mutex, same_on_all_ranks, OutOfOrderImpl
using dp::assign_buckets;
using dp::BucketedDdp;
using dp::ProcessGroup;
using Buckets = std::vector<std::vector<size_t>>;

const double kCsCaps[] = {0.0016, 0.0001, 0.01};  // MB, the caps of CS336's test_ddp.py

// Bucket assignment of a model's unique parameters (what BucketedDdp does), without ranks.
Buckets assignment_of(const torch::nn::Module& m, double cap_mb) {
  std::vector<int64_t> bytes;
  std::vector<bool> trainable;
  for (auto& p : dp::unique_parameters(m)) {
    bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
    trainable.push_back(p.requires_grad());
  }
  return assign_buckets(bytes, trainable, cap_mb);
}

std::vector<std::vector<std::string>> names_of(const torch::nn::Module& m, const Buckets& buckets) {
  auto named = dp::unique_named_parameters(m);
  std::vector<std::vector<std::string>> out;
  for (auto& b : buckets) {
    out.emplace_back();
    for (size_t i : b) out.back().push_back(named[i].first);
  }
  return out;
}

// ================================ assign_buckets (no ranks) ========================================

TEST(Stage05Buckets, ReverseOrderAndCapBoundary) {
  // Reverse order: 3 (400 B) alone, since 400 + 300 > 500; then 2 + 1 = 500 B fits exactly; then 0.
  EXPECT_EQ(assign_buckets({100, 200, 300, 400}, {true, true, true, true}, 0.0005), (Buckets{{3}, {2, 1}, {0}}));
  EXPECT_EQ(assign_buckets({100, 200, 300, 400}, {true, true, true, true}, 1.0), (Buckets{{3, 2, 1, 0}}));
  EXPECT_TRUE(assign_buckets({}, {}, 1.0).empty());
}

TEST(Stage05Buckets, MegabyteIsTenToTheSixBytes) {
  EXPECT_EQ(assign_buckets({600000, 400000}, {true, true}, 1.0).size(), 1u);  // exactly 10^6 bytes
  EXPECT_EQ(assign_buckets({600000, 400001}, {true, true}, 1.0).size(), 2u);
  EXPECT_EQ(assign_buckets({600000, 448576}, {true, true}, 1.0).size(), 2u);  // 2^20 B would still fit in a MiB
}

TEST(Stage05Buckets, OversizedParameterGetsItsOwnBucket) {
  EXPECT_EQ(assign_buckets({5000, 10, 10}, {true, true, true}, 0.001), (Buckets{{2, 1}, {0}}));
  EXPECT_EQ(assign_buckets({10, 5000, 10}, {true, true, true}, 0.001), (Buckets{{2}, {1}, {0}}));
  EXPECT_EQ(assign_buckets({5000}, {true}, 0.001), (Buckets{{0}}));
}

TEST(Stage05Buckets, FrozenParametersAreSkipped) {
  EXPECT_EQ(assign_buckets({100, 200, 300}, {true, false, true}, 1.0), (Buckets{{2, 0}}));
  // A frozen parameter takes no room: 300 + 100 fit in 400 B although 200 B sit between them.
  EXPECT_EQ(assign_buckets({100, 200, 300}, {true, false, true}, 0.0004), (Buckets{{2, 0}}));
  EXPECT_TRUE(assign_buckets({100, 200}, {false, false}, 1.0).empty());
}

TEST(Stage05Buckets, BadCapOrInputThrows) {
  for (double cap : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    try {
      assign_buckets({100}, {true}, cap);
      ADD_FAILURE() << "no error for cap " << cap;
    } catch (const dp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("MB"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(assign_buckets({100, 200}, {true}, 1.0), std::invalid_argument);
  EXPECT_THROW(assign_buckets({-1}, {true}, 1.0), std::invalid_argument);
}

// CS336's ToyModel: trainable fc1.weight 400 B, fc2.fc.weight 2000 B, fc3.weight 1000 B.
TEST(Stage05Buckets, ToyModelAtCs336Caps) {
  dp::ToyModel model;
  using Names = std::vector<std::vector<std::string>>;
  EXPECT_EQ(names_of(*model, assignment_of(*model, 0.0016)),
            (Names{{"fc3.weight"}, {"fc2.fc.weight"}, {"fc1.weight"}}));
  EXPECT_EQ(assignment_of(*model, 0.0001).size(), 3u);
  EXPECT_EQ(names_of(*model, assignment_of(*model, 0.01)), (Names{{"fc3.weight", "fc2.fc.weight", "fc1.weight"}}));
}

// CS336's ToyModelWithTiedWeights: fc4.weight is fc2.weight and must be counted once.
TEST(Stage05Buckets, TiedModelAtCs336CapsCountsTiedWeightOnce) {
  dp::ToyModelWithTiedWeights model;
  using Names = std::vector<std::vector<std::string>>;
  EXPECT_EQ(names_of(*model, assignment_of(*model, 0.0016)),
            (Names{{"fc5.weight"}, {"fc3.weight"}, {"fc2.weight"}, {"fc1.weight"}}));
  EXPECT_EQ(assignment_of(*model, 0.0001).size(), 4u);
  auto one = assignment_of(*model, 0.01);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].size(), 4u);  // 400 + 2000 + 2000 + 1000 = 5400 B, not 7400
  // Even with an unlimited cap, fc2.weight appears once.
  EXPECT_EQ(names_of(*model, assignment_of(*model, 1e9)),
            (Names{{"fc5.weight", "fc3.weight", "fc2.weight", "fc1.weight"}}));
}

// ================================ BucketedDdp (ranks as threads) ===================================

TEST(Stage05Bucketed, BucketCountsMatchAssignment) {
  run_ranks(2, [](ProcessGroup& pg) {
    const std::vector<std::pair<const char*, std::vector<size_t>>> expected = {{"toy", {3, 3, 1}}, {"tied", {4, 4, 1}}};
    for (auto& [name, counts] : expected)
      for (size_t c = 0; c < 3; ++c) {
        std::shared_ptr<dp::ToyBase> model;
        {
          std::lock_guard<std::mutex> lock(rng_mutex());
          model = dp::make_toy_model(name);
        }
        BucketedDdp ddp(pg, model, kCsCaps[c]);
        EXPECT_EQ(ddp.bucket_count(), counts[c]) << name << " at " << kCsCaps[c] << " MB\n" << ddp.describe_buckets();
      }
  });
}

TEST(Stage05Bucketed, BadCapThrowsUsageErrorBeforeAnyCollective) {
  dp::ToyModel model;
  run_ranks(1, [&](ProcessGroup& pg) {
    EXPECT_THROW(BucketedDdp(pg, model.ptr(), 0.0), dp::UsageError);
    EXPECT_THROW(BucketedDdp(pg, model.ptr(), std::nan("")), dp::UsageError);
  });
}

// A bucket that completes before an earlier one waits for it: launches go 0, 1, 2, ... always.
TEST(Stage05Bucketed, CompleteBucketWaitsForEarlierOnes) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = make_seeded<OutOfOrderImpl>(pg.rank());
    // Record the order in which gradients become final, with our own hooks on the same nodes.
    std::vector<std::string> ready_order;
    std::vector<dp::compat::NodePtr> nodes;  // AccumulateGrad nodes, kept alive
    for (auto& [name, p] : dp::unique_named_parameters(*model, true)) {
      nodes.push_back(torch::autograd::impl::grad_accumulator(p));
      nodes.back()->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [&ready_order, n = name](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
            ready_order.push_back(n);
            return out;
          }));
    }
    BucketedDdp ddp(pg, model, 0.0001);
    ASSERT_EQ(ddp.bucket_count(), 3u);
    EXPECT_EQ(ddp.parameter_names()[ddp.buckets()[0][0]], "late");
    EXPECT_EQ(ddp.parameter_names()[ddp.buckets()[1][0]], "early");
    EXPECT_EQ(ddp.parameter_names()[ddp.buckets()[2][0]], "unused");
    auto x = torch::ones({2, dp::kToyIn}) * (pg.rank() + 1);
    for (int step = 0; step < 2; ++step) {
      ready_order.clear();
      ddp.on_train_batch_start();
      model->forward(x).pow(2).sum().backward();
      EXPECT_EQ(ready_order, (std::vector<std::string>{"early", "late"}));  // bucket 1 completes first
      auto during = ddp.launches();
      ASSERT_EQ(during.size(), 2u);  // bucket 2 (unused) cannot complete during backward
      EXPECT_EQ(during[0].index, 0u);
      EXPECT_EQ(during[1].index, 1u);
      ddp.finish_gradient_synchronization();
      auto all = ddp.launches();
      ASSERT_EQ(all.size(), 3u);
      EXPECT_EQ(all[2].index, 2u);
      EXPECT_FALSE(all[2].during_backward);  // completed by finish with a zero gradient
      ASSERT_TRUE(model->unused.grad().defined());
      EXPECT_TRUE(torch::equal(model->unused.grad(), torch::zeros({3})));
      EXPECT_TRUE(same_on_all_ranks(pg, model->late.grad()));
      EXPECT_TRUE(same_on_all_ranks(pg, model->early.grad()));
    }
  });
}

}  // namespace
