// Extension 05b (ArrivalOrderDdp): buckets rebuilt after the first step in the order gradients became
// ready, rank 0's order for every rank, the first bucket capped at 1 MiB. The pure function first (no
// ranks), then BucketedDdp on models whose readiness order differs from registration order. Training still
// equals one process: GradSyncContract runs BucketedArrival too. Ranks are threads.
#include "common/base/c10d_compat.hpp"
#include "common/dist/runtime.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "extensions/05b_arrival_order/arrival_order_ddp.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/ranks.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

using namespace dp::testing;  // run_ranks, make_seeded, same_on_all_ranks, OutOfOrderImpl
using dp::ArrivalOrderDdp;
using dp::assign_buckets_in_order;
using dp::BucketedDdp;
using dp::ProcessGroup;
using Buckets = std::vector<std::vector<size_t>>;

// Names of the parameters of each bucket of `ddp`.
std::vector<std::vector<std::string>> bucket_names(const BucketedDdp& ddp) {
  std::vector<std::vector<std::string>> out;
  for (auto& b : ddp.buckets()) {
    out.emplace_back();
    for (size_t i : b) out.back().push_back(ddp.parameter_names()[i]);
  }
  return out;
}
using Names = std::vector<std::vector<std::string>>;

// Calls `fn(name)` whenever a trainable parameter's gradient is final, through our own hook on its
// AccumulateGrad node. Hooks added before a BucketedDdp's run before its own on the same node.
struct ReadyRecorder {
  std::vector<dp::compat::NodePtr> nodes;  // kept alive, so that the hooked nodes are the ones backward uses
  ReadyRecorder(torch::nn::Module& m, std::function<void(const std::string&)> fn) {
    for (auto& [name, p] : dp::unique_named_parameters(m, true)) {
      nodes.push_back(torch::autograd::impl::grad_accumulator(p));
      nodes.back()->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [fn, n = name](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
            fn(n);
            return out;
          }));
    }
  }
};

// ================================ assign_buckets_in_order (no ranks) ===============================

TEST(AssignInOrder, KeepsOrderAndCapsFirstBucket) {
  EXPECT_EQ(assign_buckets_in_order({2, 0, 1}, {100, 200, 300}, 1.0, 250), (Buckets{{2}, {0, 1}}));
  EXPECT_EQ(assign_buckets_in_order({0, 1, 2}, {100, 100, 100}, 1.0, 250), (Buckets{{0, 1}, {2}}));
  // The first cap never exceeds the bucket cap: at 100 B every parameter is alone.
  EXPECT_EQ(assign_buckets_in_order({0, 1, 2}, {100, 100, 100}, 0.0001), (Buckets{{0}, {1}, {2}}));
  // 1 MiB = 1,048,576 bytes, even when the cap is 25 MB.
  EXPECT_EQ(assign_buckets_in_order({0, 1, 2}, {600000, 448576, 10}, 25.0), (Buckets{{0, 1}, {2}}));
  EXPECT_EQ(assign_buckets_in_order({0, 1, 2}, {600000, 448577, 10}, 25.0), (Buckets{{0}, {1, 2}}));
  // Parameters not listed (frozen) get no bucket.
  EXPECT_EQ(assign_buckets_in_order({1}, {10, 20}, 1.0), (Buckets{{1}}));
}

TEST(AssignInOrder, BadInputThrows) {
  EXPECT_THROW(assign_buckets_in_order({0, 0}, {10}, 1.0), std::invalid_argument);
  EXPECT_THROW(assign_buckets_in_order({1}, {10}, 1.0), std::invalid_argument);
  EXPECT_THROW(assign_buckets_in_order({0}, {10}, 0.0), dp::UsageError);
}

// ================================ BucketedDdp (ranks as threads) ===================================

// Reverse registration puts `late` in bucket 0, but its gradient is ready after `early`'s, so bucket 0
// waits and holds bucket 1 back. After the first step the buckets follow arrival: early, late, then
// unused (no gradient: filled in by finish). In the second step, early's bucket is on the wire before
// late's gradient is even ready.
TEST(BucketOrderArrival, RebuiltAfterFirstStepSoTheFirstBucketLeavesFirst) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = make_seeded<OutOfOrderImpl>(pg.rank());
    int64_t launched_when_late_ready = -1, before = 0;
    BucketedDdp* seen = nullptr;
    ReadyRecorder rec(*model, [&](const std::string& n) {
      if (n == "late") launched_when_late_ready = seen->launched_count() - before;
    });
    ArrivalOrderDdp ddp(pg, model, 0.0001);
    seen = &ddp;
    EXPECT_EQ(bucket_names(ddp), (Names{{"late"}, {"early"}, {"unused"}}));
    auto x = torch::ones({2, dp::kToyIn}) * (pg.rank() + 1);
    for (int step = 0; step < 3; ++step) {
      before = ddp.launched_count();
      ddp.on_train_batch_start();
      model->forward(x).pow(2).sum().backward();
      ddp.finish_gradient_synchronization();
      // Step 0 ran on the reverse-registration buckets: nothing could leave before late was ready.
      EXPECT_EQ(launched_when_late_ready, step == 0 ? 0 : 1) << "step " << step;
      EXPECT_TRUE(ddp.buckets_rebuilt());
      EXPECT_EQ(bucket_names(ddp), (Names{{"early"}, {"late"}, {"unused"}}));
      EXPECT_TRUE(same_on_all_ranks(pg, model->late.grad()));
      EXPECT_TRUE(same_on_all_ranks(pg, model->early.grad()));
    }
  });
}

// Two square weights used in opposite orders on the two ranks: each rank sees its own readiness order,
// and both must end with rank 0's, or their bucket k would pair different tensors.
struct OrderByRankImpl : torch::nn::Module {
  explicit OrderByRankImpl(bool swap) : swap(swap) {
    a = register_parameter("a", torch::eye(dp::kToyIn) * 0.5);
    b = register_parameter("b", torch::eye(dp::kToyIn) * 2.0);
  }
  torch::Tensor forward(torch::Tensor x) {
    return swap ? torch::matmul(torch::matmul(x, b), a) : torch::matmul(torch::matmul(x, a), b);
  }
  bool swap;
  torch::Tensor a, b;
};

TEST(BucketOrderArrival, EveryRankTakesRankZerosOrder) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = std::make_shared<OrderByRankImpl>(pg.rank() == 1);
    std::vector<std::string> order;
    ReadyRecorder rec(*model, [&](const std::string& n) { order.push_back(n); });
    ArrivalOrderDdp ddp(pg, model, 0.0001);  // 400 B each: one per bucket
    auto x = torch::ones({2, dp::kToyIn});
    for (int step = 0; step < 2; ++step) {
      order.clear();
      model->forward(x).sum().backward();
      ddp.finish_gradient_synchronization();
      // Rank 0 uses a then b: b is ready first. Rank 1 the other way round.
      EXPECT_EQ(order, pg.rank() == 0 ? (std::vector<std::string>{"b", "a"}) : (std::vector<std::string>{"a", "b"}));
      EXPECT_EQ(bucket_names(ddp), (Names{{"b"}, {"a"}})) << "rank " << pg.rank();
      EXPECT_TRUE(same_on_all_ranks(pg, model->a.grad()));
    }
  });
}

// CS336's tied model: fc2.weight (also fc4's) is ready only once both uses were differentiated, so the
// readiness order fc5, fc3, fc2, fc1 is not the registration order fc1, fc2, fc3, fc5. The rebuilt
// buckets follow the order our own hooks saw, with every gradient counted once.
TEST(BucketOrderArrival, TiedModelFollowsReadinessOrder) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::shared_ptr<dp::ToyBase> model;
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(3);
      model = dp::make_toy_model("tied");
    }
    std::vector<std::string> order;
    ReadyRecorder rec(*model, [&](const std::string& n) { order.push_back(n); });
    ArrivalOrderDdp ddp(pg, model, 0.0016);
    model->forward(torch::rand({4, dp::kToyIn})).pow(2).sum().backward();
    ddp.finish_gradient_synchronization();
    EXPECT_EQ(order, (std::vector<std::string>{"fc5.weight", "fc3.weight", "fc2.weight", "fc1.weight"}));
    std::vector<std::string> flat;
    for (auto& b : bucket_names(ddp)) flat.insert(flat.end(), b.begin(), b.end());
    if (pg.rank() == 0) {
      EXPECT_EQ(flat, order);
    }
    EXPECT_EQ(bucket_names(ddp).size(), 4u);  // 1000, 2000, 2000, 400 B at a 1600 B cap: one each
  });
}

// ================================ stage 05's seam reassign() ========================================
// What an extension may hand to reassign(): every trainable parameter once, between steps; anything else is
// refused, and a valid assignment takes effect (one bucket: one collective, the same averages).
struct Reassigning : dp::BucketedDdp {
  using BucketedDdp::BucketedDdp;
  using BucketedDdp::reassign;
};

TEST(StageFiveSeams, ReassignTakesOnlyACompleteAssignmentBetweenSteps) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = dp::testing::make_local(pg.rank());
    Reassigning ddp(pg, model, 0.0001);
    std::vector<size_t> all;
    for (size_t i = 0; i < ddp.parameters().size(); ++i)
      if (ddp.parameters()[i].requires_grad()) all.push_back(i);
    ASSERT_GE(all.size(), 2u);
    EXPECT_THROW(ddp.reassign({{all[0]}}), std::logic_error);                        // the others have no bucket
    EXPECT_THROW(ddp.reassign({all, {all[0]}}), std::logic_error);                   // listed twice
    EXPECT_THROW(ddp.reassign({all, {ddp.parameters().size()}}), std::logic_error);  // out of range
    EXPECT_THROW(ddp.reassign({all, {}}), std::logic_error);                         // an empty bucket
    ddp.reassign({all});
    EXPECT_EQ(ddp.bucket_count(), 1u);
    model->forward(x).pow(2).mean().backward();
    EXPECT_THROW(ddp.reassign({all}), std::logic_error);  // buckets in flight
    EXPECT_THROW(ddp.on_bucket_averaged([](size_t) {}), std::logic_error);
    ddp.finish_gradient_synchronization();
    EXPECT_EQ(ddp.launched_count(), 1);
    for (size_t i : all) EXPECT_TRUE(same_on_all_ranks(pg, ddp.parameters()[i].grad()));
  });
}

}  // namespace
