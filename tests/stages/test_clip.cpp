// Stage 10: gradient-norm clipping (Strategy::set_max_grad_norm(), common/contract/clip.hpp) for DDP, ZeRO-1, FSDP
// and HSDP equal to one process's clip_grad_norm_ on a 2x2 mesh of ranks as threads; the two classic mistakes
// planted and caught by name; the schemes that cannot clip refuse before any step.
#include "common/base/errors.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/model/models.hpp"
#include "extensions/05c_optimizer_overlap/overlapped_optimizer.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/06_sharded_opt/strategies.hpp"
#include "stages/07_fsdp/strategies.hpp"
#include "stages/10_hierarchy/strategies.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/wrapped_strategy.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

namespace {

using dp::MakeStrategy;
using dp::ProcessGroup;
using dp::testing::run_ranks;

// ToyFSDPModel's gradient norms in the check are about 1-3: a limit of 0.2 clips every step.
constexpr double kLimit = 0.2;

dp::StrategyCheck clipping(int accumulate = 1) {
  dp::StrategyCheck c;
  c.max_grad_norm = kLimit;
  c.accumulate = accumulate;
  return c;
}

struct Scheme {
  std::string name;
  MakeStrategy make;
};
std::vector<Scheme> schemes() {
  return {{"DDP (stage 05)", dp::bucketed_ddp_strategy(0.01)},
          {"ZeRO-1 (stage 06)", dp::zero1_strategy()},
          {"FSDP (stage 07)", dp::fsdp_strategy({})},
          {"HSDP 2x2", dp::hsdp_strategy(2)},
          {"HSDP 2x2, nothing until the last", dp::hsdp_strategy(2, {}, dp::HsdpSync::none_until_last)}};
}

// Every scheme clips like one process: the same norm before clipping (within its bound), the same weights after
// 3 steps of SGD with momentum, and every step really clipped.
TEST(Clip, EverySchemeClipsLikeOneProcess) {
  for (const auto& s : schemes())
    for (int k : {1, 2}) {
      SCOPED_TRACE(s.name + ", " + std::to_string(k) + " micro-batches");
      run_ranks(4, [&](ProcessGroup& pg) {
        const dp::Margin m = dp::check_strategy(pg, s.make, clipping(k));
        EXPECT_LE(m.ratio(), 0.5) << "within the bound, but with less than a factor 2 of margin";
      });
    }
}

// The mistakes, planted in a wrapper that clips on the inner scheme's gradient spread, changed.
enum class Slip { local_shard, summed_over_all_ranks };
class Planted : public dp::testing::WrappedStrategy {
 public:
  Planted(std::unique_ptr<dp::Strategy> inner, ProcessGroup& world, Slip slip)
      : WrappedStrategy(std::move(inner)), world_(world), slip_(slip) {}
  dp::GradientSpread gradient_spread() override {
    dp::GradientSpread g = inner_->gradient_spread();
    if (slip_ == Slip::local_shard) {
      g.group = nullptr;  // each rank's norm of its own shard
    } else {
      // Every square summed over every rank: the whole tensors too, and the shards once per node.
      g.sharded.insert(g.sharded.end(), g.whole.begin(), g.whole.end());
      g.whole.clear();
      g.group = &world_;
    }
    return g;
  }

 private:
  ProcessGroup& world_;
  Slip slip_;
};
MakeStrategy planted(MakeStrategy make, Slip slip) {
  return [make, slip](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const dp::MakeOptimizer& opt) {
    return std::unique_ptr<dp::Strategy>(std::make_unique<Planted>(make(pg, std::move(model), opt), pg, slip));
  };
}
std::string message_of(const MakeStrategy& make) {
  std::vector<std::string> messages(4);
  run_ranks(4, [&](ProcessGroup& pg) {
    try {
      dp::check_strategy(pg, make, clipping());
      ADD_FAILURE() << "the mutant passed on rank " << pg.rank();
    } catch (const dp::CheckFailed& e) {
      messages[pg.rank()] = e.what();
    }
  });
  return messages[0] + " | " + messages[1] + " | " + messages[2] + " | " + messages[3];
}

TEST(ClipCanFail, TheLocalShardsNormIsCaughtByName) {
  for (const auto& make : {dp::fsdp_strategy({}), dp::hsdp_strategy(2)}) {
    const std::string m = message_of(planted(make, Slip::local_shard));
    EXPECT_NE(m.find("hint [clip-local-shard]"), std::string::npos) << m;
  }
}
TEST(ClipCanFail, SummingOverReplicasIsCaughtByName) {
  // DDP: every rank's whole gradient counted 4 times; HSDP: each shard counted once per node.
  for (const auto& make : {dp::bucketed_ddp_strategy(0.01), dp::hsdp_strategy(2)}) {
    const std::string m = message_of(planted(make, Slip::summed_over_all_ranks));
    EXPECT_NE(m.find("hint [clip-summed-over-replicas]"), std::string::npos) << m;
  }
}

// A bad limit, and a scheme whose optimizers step during backward (extension 05c: no moment holds the whole
// gradient), are refused when the limit is set, before any step.
TEST(ClipBadInput, BadLimitsAndSchemesThatCannotClipAreRefused) {
  run_ranks(2, [](ProcessGroup& pg) {
    dp::ToyFSDPModel a{nullptr}, b{nullptr};
    {
      std::lock_guard<std::mutex> lock(dp::testing::rng_mutex());
      a = dp::ToyFSDPModel();
      b = dp::ToyFSDPModel();
    }
    const dp::MakeOptimizer sgd = [](std::vector<torch::Tensor> p) {
      return std::unique_ptr<torch::optim::Optimizer>(
          std::make_unique<torch::optim::SGD>(std::move(p), torch::optim::SGDOptions(0.01)));
    };
    auto fsdp = dp::fsdp_strategy({})(pg, a.ptr(), sgd);
    EXPECT_THROW(fsdp->set_max_grad_norm(-1), dp::UsageError);
    EXPECT_THROW(fsdp->set_max_grad_norm(std::nan("")), dp::UsageError);
    fsdp->set_max_grad_norm(0);  // off
    auto overlapped =
        std::make_unique<dp::OverlappedOptimizerDdp>(std::make_unique<dp::BucketedDdp>(pg, b.ptr(), 0.01), sgd);
    try {
      overlapped->set_max_grad_norm(1.0);
      ADD_FAILURE() << "extension 05c accepted a gradient-norm limit";
    } catch (const dp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot clip gradients"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
