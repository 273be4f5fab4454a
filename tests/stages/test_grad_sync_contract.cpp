// The GradSync contract (common/contract/grad_sync.hpp), one test body for every DDP variant: with 2 and 4 ranks
// (threads), training the toy MLP, CS336's ToyModel and its tied-weights model equals single-process
// training on the whole batch after every step, frozen parameters never move, and all ranks end equal
// (dp::check_toy_mlp_experiment and dp::check_cs336_scenario make the comparisons). Ranks that built
// different models are refused at construction. Last, the checks themselves must be able to fail.
#include "common/contract/grad_sync.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "tests/stages/ddp_variants.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using dp::GradSync;
using dp::ProcessGroup;
using dp::testing::rng_mutex;
using dp::testing::run_ranks;

constexpr int kRepeats = 5;  // the CS336 handout: run the DDP tests several times to catch flakiness

template <typename Variant>
class GradSyncContract : public ::testing::Test {
 protected:
  // The body every variant runs: `model` is "mlp" (the toy-MLP experiment) or a CS336 model ("toy",
  // "tied"); each check throws dp::CheckFailed, naming the step and the parameter, when DDP training
  // differs from single-process training, a frozen parameter moved, or the ranks disagree.
  static void trains_like_one_process(int world, const std::string& model) {
    for (int rep = 0; rep < kRepeats; ++rep) {
      SCOPED_TRACE(::testing::Message() << model << " model, " << world << " ranks, repeat " << rep);
      run_ranks(world, [&](ProcessGroup& pg) {
        if (model == "mlp")
          dp::check_toy_mlp_experiment(pg, Variant::make);
        else
          dp::check_cs336_scenario(pg, model, Variant::make);
      });
    }
  }
};

// Every DDP variant of stages 02-05; stage 05 at the three bucket caps of CS336's tests (0.0016, 0.0001
// and 0.01 MB: 3, 3 and 1 buckets for ToyModel, 4, 4 and 1 for the tied model), and at 0.0005 MB, where
// the MLP's tensors fill 4 buckets of 1 to 3 tensors.
// BucketedArrival<500>: the same, rebuilt in arrival order after the first of the 5 steps.
using Variants = ::testing::Types<Naive, Flat, Overlap, Bucketed<1600>, Bucketed<100>, Bucketed<10000>, Bucketed<500>,
                                  BucketedArrival<500>>;
TYPED_TEST_SUITE(GradSyncContract, Variants);

// World 4 splits CS336's 20 rows into 5 per rank and the MLP's 100 into 25 (the checks refuse a world
// size that does not divide them).
TYPED_TEST(GradSyncContract, ToyMlpWorld2) { TestFixture::trains_like_one_process(2, "mlp"); }
TYPED_TEST(GradSyncContract, ToyMlpWorld4) { TestFixture::trains_like_one_process(4, "mlp"); }
TYPED_TEST(GradSyncContract, Cs336ToyWorld2) { TestFixture::trains_like_one_process(2, "toy"); }
TYPED_TEST(GradSyncContract, Cs336ToyWorld4) { TestFixture::trains_like_one_process(4, "toy"); }
TYPED_TEST(GradSyncContract, Cs336TiedWorld2) { TestFixture::trains_like_one_process(2, "tied"); }
TYPED_TEST(GradSyncContract, Cs336TiedWorld4) { TestFixture::trains_like_one_process(4, "tied"); }

// Ranks that built different models are refused at construction (by broadcast_parameters), on every
// rank, naming the first mismatch, instead of pairing unrelated tensors in a collective.
TYPED_TEST(GradSyncContract, RefusesRanksWithDifferentModels) {
  std::vector<std::string> messages(2);
  run_ranks(2, [&](ProcessGroup& pg) {
    std::shared_ptr<torch::nn::Module> m;
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      m = dp::make_toy_model(pg.rank() == 0 ? "toy" : "mlp");
    }
    try {
      TypeParam::make(pg, m);
      ADD_FAILURE() << "construction succeeded on rank " << pg.rank();
    } catch (const dp::UsageError& e) {
      messages[pg.rank()] = e.what();
    }
  });
  for (auto& msg : messages) EXPECT_NE(msg.find("different models"), std::string::npos) << msg;
}

// --- The checks can fail: a "DDP" that breaks the contract is caught --------------------------------

// What the mutants below share with a correct DDP: rank 0's weights broadcast at construction, the group and
// the module kept; each gets its own after_backward() wrong.
struct Broadcasting : GradSync {
  Broadcasting(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) : pg(pg), module(std::move(m)) {
    dp::broadcast_parameters(pg, *module);
  }
  int64_t calls_per_step() const override { return 0; }
  ProcessGroup& pg;
  std::shared_ptr<torch::nn::Module> module;
};

// All-reduces every gradient, then scales it by scale(W): the average is 1 / W.
struct ScaledAllReduce : Broadcasting {
  using Broadcasting::Broadcasting;
  virtual double scale(int world_size) const = 0;
  void after_backward() override {
    for (auto& p : module->parameters())
      if (p.grad().defined()) {
        auto g = p.mutable_grad();
        pg.all_reduce(g);
        g.mul_(scale(pg.world_size()));
      }
  }
};

// Forgets to divide by the world size.
struct SumOnly : ScaledAllReduce {
  using ScaledAllReduce::ScaledAllReduce;
  double scale(int) const override { return 1; }
};

// Divides by the world size twice (once in the loss, once after the all-reduce, say).
struct AveragedTwice : ScaledAllReduce {
  using ScaledAllReduce::ScaledAllReduce;
  double scale(int world_size) const override { return 1.0 / (world_size * world_size); }
};

// Averages a flat copy of the gradients and never copies the averages back: every rank steps with its own.
struct NotCopiedBack : Broadcasting {
  using Broadcasting::Broadcasting;
  int64_t calls_per_step() const override { return 1; }
  void after_backward() override {
    std::vector<torch::Tensor> grads;
    for (auto& p : dp::unique_parameters(*module, true)) grads.push_back(p.grad().reshape(-1));
    auto flat = torch::cat(grads);
    pg.all_reduce(flat);
    flat.div_(pg.world_size());  // ...and the loop that copies `flat` back into each .grad() is missing
  }
};

// A bucket launched before its last gradient arrived: the first parameter's slot still held zeros when it
// was sent, so its averaged gradient is zero on every rank.
struct SentBeforeReady : Broadcasting {
  using Broadcasting::Broadcasting;
  void after_backward() override {
    auto params = dp::unique_parameters(*module, true);
    for (size_t i = 0; i < params.size(); ++i) {
      auto g = params[i].mutable_grad();
      if (i == 0) g.zero_();  // what the early launch sent for it
      pg.all_reduce(g);
      g.div_(pg.world_size());
    }
  }
};

// Launches every gradient's all-reduce, then waits on one handle only (the first) and divides: a wait on one
// handle does not wait for another. Rank 1 launches its last all-reduce 200 ms late, as a slower rank would,
// so on rank 0 that collective is certainly still running when the step begins (on an idle machine it might
// finish first, and the mistake would hide until a busy day).
struct WaitsOnWrongHandle : Broadcasting {
  using Broadcasting::Broadcasting;
  void after_backward() override {
    auto params = dp::unique_parameters(*module, true);
    std::vector<dp::Work> handles;
    std::vector<torch::Tensor> grads;
    for (size_t i = 0; i < params.size(); ++i) {
      if (pg.rank() == 1 && i + 1 == params.size()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      grads.push_back(params[i].mutable_grad());
      handles.push_back(pg.all_reduce_async(grads.back(), "gradient " + std::to_string(i)));
    }
    handles.front().wait();  // should be: every handle
    for (auto& g : grads) g.div_(pg.world_size());
  }
};

// Averages, but with a relative error of 1e-4 (a float16 division, a stale scale): 1,700 times fp32's u,
// and more than the derived bound (ddp_check.cpp) allows for sums in another order.
struct SlightlyOffAverage : ScaledAllReduce {
  using ScaledAllReduce::ScaledAllReduce;
  double scale(int world_size) const override { return (1 + 1e-4) / world_size; }
};

// Forgets the broadcast (and the averaging).
struct NoBroadcast : GradSync {
  NoBroadcast(ProcessGroup&, std::shared_ptr<torch::nn::Module>) {}
  void after_backward() override {}
  int64_t calls_per_step() const override { return 0; }
};

// Averages correctly but broadcasts only the trainable parameters: ranks keep their own frozen ones.
struct FrozenNotBroadcast : GradSync {
  FrozenNotBroadcast(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m)
      : pg(pg), params(dp::unique_parameters(*m, /*trainable_only=*/true)) {
    for (auto& p : params) {
      auto t = p.detach();
      pg.broadcast(t, 0);
    }
  }
  int64_t calls_per_step() const override { return static_cast<int64_t>(params.size()); }
  void after_backward() override {
    for (auto& p : params)
      if (p.grad().defined()) {
        auto g = p.mutable_grad();
        pg.all_reduce(g);
        g.div_(pg.world_size());
      }
  }
  ProcessGroup& pg;
  std::vector<torch::Tensor> params;
};

template <typename Sync>
const dp::MakeGradSync make = dp::make_grad_sync<Sync>();

// Each rank's dp::CheckFailed message from the CS336 check of `make` on `model` (every rank throws, together).
std::vector<std::string> failures(const dp::MakeGradSync& make, const char* model = "toy", int world = 2) {
  std::vector<std::string> messages(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    try {
      dp::check_cs336_scenario(pg, model, make);
      ADD_FAILURE() << "the mutant passed on rank " << pg.rank();
    } catch (const dp::CheckFailed& e) {
      messages[pg.rank()] = e.what();
    }
  });
  return messages;
}

// The workbook's named hints: the rank that found the fault names the mistake ("[summed-not-averaged]").
void expect_hint(const std::vector<std::string>& messages, const std::string& name) {
  std::string all;
  for (const auto& m : messages) all += m + " | ";
  EXPECT_NE(all.find(name), std::string::npos) << "no rank named " << name << ": " << all;
}

TEST(CheckCanFail, MissingDivisionIsCaught) {
  for (int world : {2, 4}) expect_hint(failures(make<SumOnly>, "toy", world), "hint [summed-not-averaged]");
}
TEST(CheckCanFail, DividingTwiceIsCaught) {
  for (int world : {2, 4}) expect_hint(failures(make<AveragedTwice>, "toy", world), "hint [averaged-twice]");
}
TEST(CheckCanFail, AveragesNotCopiedBackAreCaught) {
  expect_hint(failures(make<NotCopiedBack>), "hint [ranks-differ]");
}
TEST(CheckCanFail, BucketSentBeforeItsLastGradientIsCaught) {
  expect_hint(failures(make<SentBeforeReady>), "hint [gradient-never-arrived]");
}
TEST(CheckCanFail, WaitOnTheWrongHandleIsCaught) {
  expect_hint(failures(make<WaitsOnWrongHandle>), "hint [not-waited]");
}
TEST(CheckCanFail, AverageOffBy1e4IsCaught) {
  for (const char* model : {"toy", "tied"})
    EXPECT_THROW(run_ranks(2, [&](ProcessGroup& pg) { dp::check_cs336_scenario(pg, model, make<SlightlyOffAverage>); }),
                 dp::CheckFailed)
        << model;
  EXPECT_THROW(run_ranks(2, [&](ProcessGroup& pg) { dp::check_toy_mlp_experiment(pg, make<SlightlyOffAverage>); }),
               dp::CheckFailed);
}
TEST(CheckCanFail, MissingBroadcastIsCaught) { expect_hint(failures(make<NoBroadcast>), "hint [not-broadcast]"); }

// ToyModel's frozen fc2.fc.bias is drawn from the RNG, so it differs across ranks until broadcast: the check
// names it. (Its other frozen parameter, no_grad_fixed_param, is the constant {2, 2} on every rank and
// cannot show a missing broadcast; the check finds that out by itself.)
TEST(CheckCanFail, FrozenParameterLeftUnbroadcastIsCaught) {
  std::vector<std::string> messages(2);
  run_ranks(2, [&](ProcessGroup& pg) {
    try {
      dp::check_cs336_scenario(pg, "toy", make<FrozenNotBroadcast>);
    } catch (const dp::CheckFailed& e) {  // every rank throws, together: safe to catch here
      messages[pg.rank()] = e.what();
    }
  });
  EXPECT_NE(messages[0].find("another rank"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("fc2.fc.bias was not broadcast"), std::string::npos) << messages[1];
}

}  // namespace
