// What every hook-driven DDP variant (stages 04 and 05, AccumulateGradHooks) must do, one test body for
// each: launch its all-reduces while backward still runs, refuse a second backward before
// finish_gradient_synchronization() with a std::logic_error that says so, and remove exactly its own
// hooks when destroyed. Ranks are threads; the model is the toy MLP (fc1, fc2, fc3, weight and bias each).
#include "common/base/c10d_compat.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "tests/stages/ddp_variants.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/ranks.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using dp::ProcessGroup;
using dp::testing::copy_of;
using dp::testing::make_local;
using dp::testing::run_ranks;
using dp::testing::same_on_all_ranks;

template <typename Variant>
class HookContract : public ::testing::Test {};

// Stage 04, and stage 05 with one tensor per bucket (100 B) and with several (500 B).
using HookedVariants = ::testing::Types<Overlap, Bucketed<100>, Bucketed<500>>;
TYPED_TEST_SUITE(HookContract, HookedVariants);

// Collectives per step on the toy MLP, whose tensors are, last registered first: fc3.bias 20 B, fc3.weight
// 400 B, fc2.bias 80 B, fc2.weight 1600 B, fc1.bias 80 B, fc1.weight 800 B.
template <typename Variant>
constexpr int64_t kMlpCalls = 6;  // one per tensor
// At 500 B: {fc3.bias, fc3.weight, fc2.bias}, {fc2.weight}, {fc1.bias}, {fc1.weight}.
template <>
constexpr int64_t kMlpCalls<Bucketed<500>> = 4;

// --- Overlap: all-reduces start while backward still has work to do ----------------------------------

TYPED_TEST(HookContract, LaunchesAllReducesBeforeBackwardEnds) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    auto ddp = TypeParam::make(pg, model);
    const int64_t calls = kMlpCalls<TypeParam>;
    ASSERT_EQ(ddp->calls_per_step(), calls);
    for (int step = 0; step < 3; ++step) {
      ddp->on_train_batch_start();
      model->zero_grad();
      const int64_t before = ddp->launched_count();
      int64_t launched_when_fc1_reached = -1;
      // The gradient of fc1's activation is computed late in backward, before fc1's own weight
      // gradients. By then the all-reduces of fc3's and fc2's gradients must already be running.
      auto h1 = torch::relu(model->fc1(x));
      h1.register_hook([&](torch::Tensor) { launched_when_fc1_reached = ddp->launched_count() - before; });
      model->fc3(torch::relu(model->fc2(h1))).pow(2).mean().backward();
      const auto backward_returned = std::chrono::steady_clock::now();
      EXPECT_GT(launched_when_fc1_reached, 0) << "no all-reduce was launched before backward reached fc1";
      EXPECT_LT(launched_when_fc1_reached, calls) << "fc1's gradients cannot be launched before fc1's backward";
      EXPECT_EQ(ddp->launched_count() - before, calls);  // every tensor has a gradient: all launched from backward
      auto launches = ddp->launches();
      ASSERT_EQ(static_cast<int64_t>(launches.size()), calls);
      for (auto& l : launches) EXPECT_TRUE(l.during_backward);
      EXPECT_LT(launches.front().time, backward_returned);
      ddp->finish_gradient_synchronization();
      for (auto& p : dp::unique_parameters(*model)) EXPECT_TRUE(same_on_all_ranks(pg, p.grad()));
    }
  });
}

// --- Misuse: a second backward before finish -----------------------------------------------------------

TYPED_TEST(HookContract, SecondBackwardBeforeFinishThrowsWithMessage) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    auto ddp = TypeParam::make(pg, model);
    // This rank's local gradient, computed on a copy (reading .grad() while its all-reduce is in flight
    // would race with Gloo).
    auto copy = copy_of(*model);
    copy->forward(x).pow(2).mean().backward();
    auto first = copy->fc3->weight.grad();
    ddp->on_train_batch_start();
    model->forward(x).pow(2).mean().backward();
    std::string message, kind;
    try {
      model->forward(x).pow(2).mean().backward();
    } catch (const std::logic_error& e) {  // the engine rethrows the hook's own exception
      message = e.what();
      kind = "std::logic_error";
    } catch (const std::exception& e) {
      message = e.what();
      kind = "other";
    }
    EXPECT_EQ(kind, "std::logic_error");
    EXPECT_NE(message.find("backward ran twice before finish_gradient_synchronization(): call it after every "
                           "backward"),
              std::string::npos)
        << "message was: " << message;
    // on_train_batch_start() refuses to start a new step over the unfinished one.
    EXPECT_THROW(ddp->on_train_batch_start(), std::logic_error);
    // The error stopped backward before it added into any .grad(): finishing still gives the average
    // of the first backward, identical on every rank.
    ddp->finish_gradient_synchronization();
    auto locals = pg.all_gather(first);
    EXPECT_TRUE(torch::allclose(model->fc3->weight.grad(), (locals[0] + locals[1]) / 2));
    EXPECT_NO_THROW(ddp->on_train_batch_start());
  });
}

// --- Hooks are removed by the destructor ---------------------------------------------------------------

TYPED_TEST(HookContract, DestructorRemovesItsHooksOnly) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    // Hold the AccumulateGrad nodes ourselves so that we look at the very nodes the wrapper hooked.
    std::vector<dp::compat::NodePtr> nodes;  // AccumulateGrad nodes, kept alive
    for (auto& p : dp::unique_parameters(*model, true)) nodes.push_back(torch::autograd::impl::grad_accumulator(p));
    int foreign_calls = 0;  // somebody else's hook on the same node must survive
    nodes[0]->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [&](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
          ++foreign_calls;
          return out;
        }));
    int64_t launched = 0;
    {
      auto ddp = TypeParam::make(pg, model);
      for (size_t i = 0; i < nodes.size(); ++i) {
        EXPECT_EQ(nodes[i]->post_hooks().size(), i == 0 ? 2u : 1u);
        EXPECT_EQ(nodes[i]->pre_hooks().size(), 1u);
      }
      ddp->on_train_batch_start();
      model->forward(x).pow(2).mean().backward();
      ddp->finish_gradient_synchronization();
      launched = ddp->launched_count();
    }
    EXPECT_EQ(launched, kMlpCalls<TypeParam>);
    for (size_t i = 0; i < nodes.size(); ++i) {
      EXPECT_EQ(nodes[i]->post_hooks().size(), i == 0 ? 1u : 0u);
      EXPECT_TRUE(nodes[i]->pre_hooks().empty());
    }
    // Another backward after the wrapper is gone: nothing is all-reduced, so every rank keeps its own
    // (different) local gradient, and nothing touches the destroyed object.
    model->zero_grad();
    model->forward(x).pow(2).mean().backward();
    EXPECT_FALSE(same_on_all_ranks(pg, model->fc1->weight.grad()));
    EXPECT_EQ(foreign_calls, 2);
  });
}

}  // namespace
