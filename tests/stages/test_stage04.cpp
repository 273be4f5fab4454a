// Stage 04 (DdpOverlap): equals single-process training, launches all-reduces during backward,
// refuses a second backward before finish, and leaves no hooks behind. Ranks are threads.
#include "common/ddp_check.hpp"
#include "common/models.hpp"
#include "stages/04_overlap/ddp_overlap.hpp"
#include "tests/support/ranks.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace {

using dp::DdpOverlap;
using dp::GradSync;
using dp::ProcessGroup;
using dp::testing::rng_mutex;
using dp::testing::run_ranks;

constexpr int kRepeats = 5;  // the CS336 handout: run the DDP tests several times to catch flakiness

std::unique_ptr<GradSync> make_overlap(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) {
  return std::make_unique<DdpOverlap>(pg, std::move(m));
}

// A ToyMLP and an input batch, different on every rank (the constructor's broadcast fixes the weights).
struct Local {
  std::shared_ptr<dp::ToyMLPImpl> model;
  torch::Tensor x;
};
Local make_local(int rank) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(100 + rank);
  return {std::make_shared<dp::ToyMLPImpl>(), torch::randn({8, dp::kToyIn})};
}

// A fresh ToyMLP with the same parameter values (not hooked by anyone).
std::shared_ptr<dp::ToyMLPImpl> copy_of(dp::ToyMLPImpl& src) {
  std::shared_ptr<dp::ToyMLPImpl> dst;
  {
    std::lock_guard<std::mutex> lock(rng_mutex());
    dst = std::make_shared<dp::ToyMLPImpl>();
  }
  torch::NoGradGuard no_grad;
  auto d = dp::unique_parameters(*dst), s = dp::unique_parameters(src);
  for (size_t i = 0; i < d.size(); ++i) d[i].copy_(s[i]);
  return dst;
}

// True when `t` is bit-identical on every rank.
bool same_on_all_ranks(ProcessGroup& pg, const torch::Tensor& t) {
  bool same = true;
  for (auto& other : pg.all_gather(t.contiguous())) same = same && torch::equal(other, t);
  return same;
}

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

// --- Equivalence with single-process training ------------------------------------------------------

void scenario(int world, const char* model) {
  for (int rep = 0; rep < kRepeats; ++rep) {
    SCOPED_TRACE(::testing::Message() << "repeat " << rep);
    run_ranks(world, [&](ProcessGroup& pg) { dp::check_cs336_scenario(pg, model, make_overlap); });
  }
}

TEST(Stage04Overlap, Cs336ToyWorld2) { scenario(2, "toy"); }
TEST(Stage04Overlap, Cs336TiedWorld2) { scenario(2, "tied"); }
TEST(Stage04Overlap, Cs336ToyWorld4) { scenario(4, "toy"); }
TEST(Stage04Overlap, Cs336TiedWorld4) { scenario(4, "tied"); }

TEST(Stage04Overlap, ToyMlpExperimentWorld2) {
  run_ranks(2, [](ProcessGroup& pg) { dp::check_toy_mlp_experiment(pg, make_overlap); });
}

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
      DdpOverlap ddp(pg, model);
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

// --- Overlap: an all-reduce starts while backward still has work to do ----------------------------

TEST(Stage04Overlap, AllReduceLaunchedBeforeBackwardFinishes) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    DdpOverlap ddp(pg, model);
    ASSERT_EQ(ddp.parameters().size(), 6u);  // fc1..fc3, weight and bias each
    for (int step = 0; step < 3; ++step) {
      ddp.on_train_batch_start();
      model->zero_grad();
      const int64_t before = ddp.launched_count();
      int64_t launched_when_fc1_reached = -1;
      // The gradient of fc1's activation is computed late in backward, before fc1's own weight
      // gradients. By then the all-reduces of fc3's and fc2's gradients must already be running.
      auto h1 = torch::relu(model->fc1(x));
      h1.register_hook([&](torch::Tensor) { launched_when_fc1_reached = ddp.launched_count() - before; });
      auto loss = model->fc3(torch::relu(model->fc2(h1))).pow(2).mean();
      loss.backward();
      const auto backward_returned = std::chrono::steady_clock::now();
      EXPECT_GT(launched_when_fc1_reached, 0) << "no all-reduce was launched before backward reached fc1";
      EXPECT_LT(launched_when_fc1_reached, 6) << "fc1's gradients cannot be launched before fc1's backward";
      EXPECT_EQ(ddp.launched_count() - before, 6);  // all launched by the time backward returned
      auto launches = ddp.launches();
      ASSERT_EQ(launches.size(), 6u);
      EXPECT_LT(launches.front().time, backward_returned);
      ddp.finish_gradient_synchronization();
      for (auto& p : ddp.parameters()) EXPECT_TRUE(same_on_all_ranks(pg, p.grad()));
    }
  });
}

// The same launch order on every rank (Gloo pairs the k-th collectives of all ranks).
TEST(Stage04Overlap, LaunchOrderIsTheSameOnEveryRankAndLastLayerFirst) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    DdpOverlap ddp(pg, model);
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
    std::shared_ptr<WithUnusedImpl> model;
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(pg.rank());
      model = std::make_shared<WithUnusedImpl>();
    }
    DdpOverlap ddp(pg, model);
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

// --- Misuse: a second backward before finish ------------------------------------------------------

TEST(Stage04Overlap, SecondBackwardBeforeFinishThrowsWithMessage) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    DdpOverlap ddp(pg, model);
    // This rank's local gradient, computed on a copy (reading .grad() while its all-reduce is in flight
    // would race with Gloo).
    auto copy = copy_of(*model);
    copy->forward(x).pow(2).mean().backward();
    auto first = copy->fc3->weight.grad();
    ddp.on_train_batch_start();
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
    EXPECT_THROW(ddp.on_train_batch_start(), std::logic_error);
    // The error stopped backward before it added into any .grad(): finishing still gives the average
    // of the first backward, identical on every rank.
    ddp.finish_gradient_synchronization();
    auto averaged = model->fc3->weight.grad();
    auto locals = pg.all_gather(first);
    EXPECT_TRUE(torch::allclose(averaged, (locals[0] + locals[1]) / 2));
    EXPECT_NO_THROW(ddp.on_train_batch_start());
  });
}

// --- Hooks are removed by the destructor ----------------------------------------------------------

TEST(Stage04Overlap, DestructorRemovesItsHooksOnly) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    auto params = dp::unique_parameters(*model, true);
    // Hold the AccumulateGrad nodes ourselves so that we look at the very nodes the wrapper hooked.
    std::vector<std::shared_ptr<torch::autograd::Node>> nodes;
    for (auto& p : params) nodes.push_back(torch::autograd::impl::grad_accumulator(p));
    int foreign_calls = 0;  // somebody else's hook on the same node must survive
    nodes[0]->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [&](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
          ++foreign_calls;
          return out;
        }));
    int64_t launched = 0;
    {
      DdpOverlap ddp(pg, model);
      for (size_t i = 0; i < nodes.size(); ++i) {
        EXPECT_EQ(nodes[i]->post_hooks().size(), i == 0 ? 2u : 1u);
        EXPECT_EQ(nodes[i]->pre_hooks().size(), 1u);
      }
      ddp.on_train_batch_start();
      model->forward(x).pow(2).mean().backward();
      ddp.finish_gradient_synchronization();
      launched = ddp.launched_count();
    }
    EXPECT_EQ(launched, 6);
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
