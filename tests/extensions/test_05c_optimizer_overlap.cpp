// Extension 05c, the optimizer overlapped with communication (OverlappedOptimizer): each bucket's
// parameters are stepped inside finish_gradient_synchronization() as soon as that bucket arrived. It must
// train bit for bit like one optimizer step after finish (SGD with momentum and AdamW, 2 and 4 ranks, CS336's
// toy and tied models and a Transformer, fixed and arrival-order buckets, with and without no_sync()), step
// bucket b before waiting for bucket b+1, and refuse misuse. Ranks are threads.
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/model/data.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "extensions/05c_optimizer_overlap/overlapped_optimizer.hpp"
#include "tests/stages/ddp_variants.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/wrapped_strategy.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using dp::BucketedDdp;
using dp::NoSyncGuard;
using dp::ProcessGroup;
using dp::testing::make_local;
using dp::testing::rng_mutex;
using dp::testing::run_ranks;

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<torch::Tensor> params) {
  if (kind == "adamw")
    return std::make_unique<torch::optim::AdamW>(std::move(params), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(0.1).momentum(0.9));
}

// Two replicas with the same values, and the loss of a model on a batch (rows along dim 0).
struct Problem {
  std::shared_ptr<torch::nn::Module> after, inside;                        // optimizer after finish / inside finish
  std::function<std::pair<torch::Tensor, torch::Tensor>(int step)> batch;  // the global batch of a step
  std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&, const torch::Tensor&)> loss;
};

Problem toy_problem(const std::string& name) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(42);
  Problem p;
  auto a = dp::make_toy_model(name), b = dp::make_toy_model(name);
  dp::copy_parameters(*b, *a);
  p.after = a;
  p.inside = b;
  p.batch = [](int step) {
    auto g = torch::make_generator<at::CPUGeneratorImpl>(100 + step);
    return std::make_pair(torch::rand({16, dp::kToyIn}, g), torch::rand({16, dp::kToyOut}, g));
  };
  p.loss = [](torch::nn::Module& m, const torch::Tensor& x, const torch::Tensor& y) {
    return torch::mse_loss(static_cast<dp::ToyBase&>(m).forward(x), y);
  };
  return p;
}

Problem transformer_problem() {
  const dp::TransformerConfig c = dp::testing::tiny_lm_config();
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(7);
  Problem p;
  auto a = dp::TransformerLM(c), b = dp::TransformerLM(c);
  dp::copy_parameters(*b, *a);
  p.after = a.ptr();
  p.inside = b.ptr();
  p.batch = [c](int step) { return dp::token_batch(8, c.context_length, c.vocab_size, 5, step); };
  p.loss = [](torch::nn::Module& m, const torch::Tensor& x, const torch::Tensor& y) {
    return dp::lm_loss(static_cast<dp::TransformerLMImpl&>(m).forward(x), y);
  };
  return p;
}

// K micro-batches per step (the first K-1 under no_sync()), 3 steps; after every step both replicas must
// be equal bit for bit, and `inside` must not have been stepped by anyone but its BucketedDdp.
template <typename Variant>
void overlapped_equals_step_after_finish(ProcessGroup& pg, Problem p, const std::string& kind, int K) {
  const int W = pg.world_size(), r = pg.rank();
  auto after = Variant::make(pg, p.after), inside = Variant::make(pg, p.inside);
  auto opt = make_optimizer(kind, dp::unique_parameters(*p.after, true));
  dp::OverlappedOptimizer overlapped(
      *inside, [&](std::vector<torch::Tensor> ps) { return make_optimizer(kind, std::move(ps)); });
  for (int s = 0; s < 3; ++s) {
    auto [gx, gy] = p.batch(s);
    const int64_t B = gx.size(0) / (K * W);
    for (auto* ddp : {after.get(), inside.get()}) {
      auto& model = ddp == after.get() ? *p.after : *p.inside;
      ddp->on_train_batch_start();
      model.zero_grad();
      for (int k = 0; k < K; ++k) {
        auto x = gx.narrow(0, (k * W + r) * B, B), y = gy.narrow(0, (k * W + r) * B, B);
        auto loss = p.loss(model, x, y) / K;
        if (k + 1 < K) {
          NoSyncGuard guard(*ddp);
          loss.backward();
          ddp->finish_gradient_synchronization();  // inside the guard: must neither send nor step
        } else {
          loss.backward();
        }
      }
      ddp->finish_gradient_synchronization();
    }
    opt->step();  // `after` only
    const auto a = dp::unique_named_parameters(*p.after), b = dp::unique_named_parameters(*p.inside);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_TRUE(torch::equal(a[i].second, b[i].second))
          << kind << ", " << W << " ranks, K = " << K << ", step " << s << ": " << a[i].first << " differs by "
          << (a[i].second - b[i].second).abs().max().item<double>();
  }
}

template <typename Variant>
class OverlapOptimizerContract : public ::testing::Test {};
// One gradient tensor per bucket, a few buckets, and arrival-order buckets rebuilt after step 1 (the
// optimizers are per parameter, so the rebuild keeps every state).
using Variants = ::testing::Types<Bucketed<100>, Bucketed<10000>, BucketedArrival<100>>;
TYPED_TEST_SUITE(OverlapOptimizerContract, Variants);

TYPED_TEST(OverlapOptimizerContract, Cs336ModelsBitIdentical) {
  for (const char* model : {"toy", "tied"})
    for (const char* opt : {"sgd", "adamw"})
      for (int world : {2, 4})
        for (int K : {1, 2}) {
          SCOPED_TRACE(::testing::Message() << model << ", " << opt << ", " << world << " ranks, K = " << K);
          run_ranks(world, [&](ProcessGroup& pg) {
            overlapped_equals_step_after_finish<TypeParam>(pg, toy_problem(model), opt, K);
          });
        }
}

TYPED_TEST(OverlapOptimizerContract, TransformerBitIdentical) {
  for (const char* opt : {"sgd", "adamw"})
    for (int world : {2, 4}) {
      SCOPED_TRACE(::testing::Message() << opt << ", " << world << " ranks");
      run_ranks(world, [&](ProcessGroup& pg) {
        overlapped_equals_step_after_finish<TypeParam>(pg, transformer_problem(), opt, 1);
      });
    }
}

// As a dp::Strategy (the check gives it its SGD, lr 0.1, to build per parameter), the overlapped optimizer
// trains like one process on the CS336 scenario. Its mutant, the same DDP also stepped once more after
// finish as a plain DDP loop would, is refused: two SGD steps per step are not one.
dp::MakeStrategy overlapped(double cap_mb) {
  return [cap_mb](ProcessGroup& g, std::shared_ptr<torch::nn::Module> m,
                  const dp::MakeOptimizer& opt) -> std::unique_ptr<dp::Strategy> {
    return std::make_unique<dp::OverlappedOptimizerDdp>(std::make_unique<BucketedDdp>(g, std::move(m), cap_mb), opt);
  };
}
struct SteppedTwice : dp::testing::WrappedStrategy {
  SteppedTwice(std::unique_ptr<dp::Strategy> inner, std::unique_ptr<torch::optim::Optimizer> extra)
      : WrappedStrategy(std::move(inner)), extra(std::move(extra)) {}
  void step() override {
    inner_->step();
    extra->step();
  }
  std::unique_ptr<torch::optim::Optimizer> extra;
};

TEST(OverlapOptimizer, Cs336ScenarioEqualsOneProcess) {
  run_ranks(2, [](ProcessGroup& pg) { dp::check_cs336_scenario(pg, "tied", overlapped(0.0001)); });
  EXPECT_THROW(run_ranks(2,
                         [](ProcessGroup& pg) {
                           dp::check_cs336_scenario(pg, "tied",
                                                    [](ProcessGroup& g, std::shared_ptr<torch::nn::Module> m,
                                                       const dp::MakeOptimizer& opt) -> std::unique_ptr<dp::Strategy> {
                                                      auto inner = overlapped(0.0001)(g, m, opt);
                                                      return std::make_unique<SteppedTwice>(
                                                          std::move(inner), opt(dp::unique_parameters(*m)));
                                                    });
                         }),
               dp::CheckFailed);
}

// An SGD that writes "step <parameter>" into a shared log.
struct LoggingSgd : torch::optim::SGD {
  LoggingSgd(std::vector<torch::Tensor> p, std::vector<std::string>* log, std::string name)
      : torch::optim::SGD(std::move(p), torch::optim::SGDOptions(0.1)), log_(log), name_(std::move(name)) {}
  torch::Tensor step(LossClosure closure = nullptr) override {
    log_->push_back("step " + name_);
    return torch::optim::SGD::step(std::move(closure));
  }
  std::vector<std::string>* log_;
  std::string name_;
};

// Bucket b's parameters are stepped after bucket b arrived and before bucket b+1 is waited for: with a
// hook that logs "arrived b" when its collective completed, the log reads arrived 0, steps of bucket 0,
// arrived 1, steps of bucket 1, ...
TEST(OverlapOptimizer, EachBucketStepsBeforeTheNextIsAwaited) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    BucketedDdp ddp(pg, model, 0.0001);  // one gradient per bucket
    ASSERT_GE(ddp.bucket_count(), 3u);
    std::vector<std::string> log;
    dp::CommHook base = dp::allreduce_hook();
    ddp.register_comm_hook([&](ProcessGroup& g, torch::Tensor& bucket, const std::string& label) {
      auto w = base(g, bucket, label);
      w.then = [then = w.then, &log, label] {
        then();
        log.push_back("arrived " + label);
      };
      return w;
    });
    size_t k = 0;
    dp::OverlappedOptimizer overlapped(ddp, [&](std::vector<torch::Tensor> ps) {
      std::string name;
      for (size_t i = 0; i < ddp.parameters().size(); ++i)
        if (ddp.parameters()[i].is_same(ps.front())) name = ddp.parameter_names()[i];
      ++k;
      return std::make_unique<LoggingSgd>(std::move(ps), &log, name);
    });
    EXPECT_EQ(k, ddp.parameters().size());
    model->forward(x).pow(2).mean().backward();
    ddp.finish_gradient_synchronization();
    std::vector<std::string> expected;
    for (size_t b = 0; b < ddp.bucket_count(); ++b) {
      expected.push_back(fmt::format("arrived bucket {}", b));
      for (size_t i : ddp.buckets()[b]) expected.push_back("step " + ddp.parameter_names()[i]);
    }
    EXPECT_EQ(log, expected);
  });
}

TEST(OverlapOptimizer, MisuseIsRefused) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    BucketedDdp ddp(pg, model, 0.0001);
    auto sgd = [](std::vector<torch::Tensor> ps) {
      return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1));
    };
    EXPECT_THROW(dp::OverlappedOptimizer(ddp, nullptr), std::logic_error);
    model->forward(x).pow(2).mean().backward();  // buckets on the wire now
    try {
      dp::OverlappedOptimizer mid_step(ddp, sgd);
      ADD_FAILURE() << "an OverlappedOptimizer attached in the middle of a step was accepted";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("between steps"), std::string::npos) << e.what();
    }
    ddp.finish_gradient_synchronization();
    dp::OverlappedOptimizer overlapped(ddp, sgd);  // between steps: fine
    for (size_t i = 0; i < ddp.parameters().size(); ++i)
      EXPECT_EQ(overlapped.optimizers()[i] != nullptr, ddp.parameters()[i].requires_grad());
  });
}

}  // namespace
