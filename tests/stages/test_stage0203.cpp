// Stages 02 and 03 against single-process training (ranks as threads).
#include "common/ddp_check.hpp"
#include "common/runtime.hpp"
#include "common/models.hpp"
#include "stages/02_naive_ddp/naive_ddp.hpp"
#include "stages/03_flat/flat_ddp.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

using namespace dp;

template <typename Sync>
std::unique_ptr<GradSync> make(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) {
  return std::make_unique<Sync>(pg, std::move(m));
}

struct Case {
  const char* stage;
  MakeGradSync make;
};

class DdpMatchesSingleProcess : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  MakeGradSync make_sync() const { return std::get<0>(GetParam()) == 2 ? MakeGradSync(make<NaiveDdp>) : MakeGradSync(make<FlatDdp>); }
  int world() const { return std::get<1>(GetParam()); }
};

TEST_P(DdpMatchesSingleProcess, Cs336ToyModel) {
  dp::testing::run_ranks(world(), [&](ProcessGroup& pg) { check_cs336_scenario(pg, "toy", make_sync()); });
}
TEST_P(DdpMatchesSingleProcess, Cs336TiedWeights) {
  dp::testing::run_ranks(world(), [&](ProcessGroup& pg) { check_cs336_scenario(pg, "tied", make_sync()); });
}
TEST_P(DdpMatchesSingleProcess, ToyMlpTenEpochs) {
  dp::testing::run_ranks(world(), [&](ProcessGroup& pg) { check_toy_mlp_experiment(pg, make_sync()); });
}

INSTANTIATE_TEST_SUITE_P(Stages, DdpMatchesSingleProcess,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(2, 4)),
                         [](const auto& info) {
                           return "stage0" + std::to_string(std::get<0>(info.param)) + "_world" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The check itself must be able to fail: a "DDP" that forgets to average is caught.
struct SumOnly : GradSync {
  SumOnly(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) : pg(pg) {
    broadcast_parameters(pg, *m);
    module = std::move(m);
  }
  int64_t calls_per_step() const override { return 0; }
  void after_backward() override {
    for (auto& p : module->parameters())
      if (p.grad().defined()) {
        auto g = p.mutable_grad();
        pg.all_reduce(g);  // no division by the world size
      }
  }
  ProcessGroup& pg;
  std::shared_ptr<torch::nn::Module> module;
};

struct NoBroadcast : GradSync {
  NoBroadcast(ProcessGroup&, std::shared_ptr<torch::nn::Module>) {}
  void after_backward() override {}
  int64_t calls_per_step() const override { return 0; }
};

TEST(CheckCanFail, MissingDivisionIsCaught) {
  EXPECT_THROW(dp::testing::run_ranks(2, [&](ProcessGroup& pg) { check_cs336_scenario(pg, "toy", make<SumOnly>); }),
               dp::CheckFailed);
}
TEST(CheckCanFail, MissingBroadcastIsCaught) {
  EXPECT_THROW(dp::testing::run_ranks(2, [&](ProcessGroup& pg) { check_cs336_scenario(pg, "toy", make<NoBroadcast>); }),
               dp::CheckFailed);
}

// Ranks that built different models are refused at construction, naming the first mismatch.
TEST(Construction, DifferentModelsAreRefused) {
  std::vector<std::string> messages(2);
  dp::testing::run_ranks(2, [&](ProcessGroup& pg) {
    std::shared_ptr<torch::nn::Module> m;
    {
      std::lock_guard<std::mutex> lock(model_init_mutex());
      m = pg.rank() == 0 ? std::shared_ptr<torch::nn::Module>(make_toy_model("toy"))
                         : std::shared_ptr<torch::nn::Module>(make_toy_model("mlp"));
    }
    try {
      NaiveDdp ddp(pg, m);
      ADD_FAILURE() << "construction succeeded on rank " << pg.rank();
    } catch (const UsageError& e) {
      messages[pg.rank()] = e.what();
    }
  });
  for (auto& msg : messages) EXPECT_NE(msg.find("different models"), std::string::npos) << msg;
}
