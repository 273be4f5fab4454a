// Stage 05's gradient accumulation (BucketedDdp::set_requires_gradient_sync(), set for a scope by
// dp::NoSyncGuard: PyTorch's no_sync()). K micro-batches of B rows per rank, the first K-1 backward passes
// inside the guard, each mean loss divided by K, must train exactly like one process
// stepping on all K * B * W rows at once: SGD and AdamW, 2 and 4 ranks, K = 1, 2, 4, on CS336's toy and
// tied models and on a small Transformer. Then what the guard does and refuses. Ranks are threads.
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/tolerance.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "tests/stages/ddp_variants.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/ranks.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
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
using dp::testing::same_on_all_ranks;

constexpr int kSteps = 3;
constexpr double kAdamLr = 1e-2, kAdamBeta2 = 0.999, kAdamEps = 1e-8, kSgdLr = 0.1, kMomentum = 0.9;

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<torch::Tensor> params) {
  if (kind == "adamw")
    return std::make_unique<torch::optim::AdamW>(
        std::move(params),
        torch::optim::AdamWOptions(kAdamLr).betas({0.9, kAdamBeta2}).eps(kAdamEps).weight_decay(0.1));
  return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(kSgdLr).momentum(kMomentum));
}

// One training problem: a reference model, a replica with the same values, the global batches of every
// step (rows along dim 0) and the mean loss of a model on some rows.
struct Problem {
  std::shared_ptr<torch::nn::Module> ref, ddp;
  std::vector<torch::Tensor> inputs, targets;  // per step: [N, ...]
  std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&, const torch::Tensor&)> loss;
  double terms_per_row = 1;  // loss terms per row (tokens), summed into every weight gradient
  int depth = 3;             // ops between a weight and the loss (layers, plus the loss)
};

// The bound (common/measure/tolerance.hpp): a gradient entry sums N rows x terms_per_row products in another
// grouping (micro-batches, ranks), then K W partials, and 2 roundings per op on the way to the loss when
// the loss's scale differs by more than a power of two: roundings x u(fp32) x max|g| per entry. SGD with
// momentum turns that into lr (1 + 0.9 + ...) per step; AdamW, entry by entry, into up to 2 lr dg /
// (sqrt(v) + eps): tiny where the gradient is large, up to lr where it is near zero (an embedding row of
// a rare token). SGD is also the optimizer that would notice a wrong 1/K, which AdamW's scale invariance
// hides.
double roundings(const Problem& p, int64_t rows, int K, int W) {
  return double(rows) * p.terms_per_row + K * W + 2.0 * p.depth;
}

// CS336's models: N = 32 rows of rand(10) -> rand(5) per step, MSE averaged over rows and outputs.
Problem toy_problem(const std::string& name) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(42);
  Problem p;
  auto ref = dp::make_toy_model(name);
  auto ddp = dp::make_toy_model(name);
  dp::copy_parameters(*ddp, *ref);
  p.ref = ref;
  p.ddp = ddp;
  for (int s = 0; s < kSteps; ++s) {
    p.inputs.push_back(torch::rand({32, dp::kToyIn}));
    p.targets.push_back(torch::rand({32, dp::kToyOut}));
  }
  p.loss = [](torch::nn::Module& m, const torch::Tensor& x, const torch::Tensor& y) {
    return torch::mse_loss(static_cast<dp::ToyBase&>(m).forward(x), y);
  };
  return p;
}

// A 2-layer Transformer (d_model 16, vocabulary 64): N = 16 sequences of 8 tokens per step, the mean
// cross-entropy over every token (each micro-batch has the same number of tokens, so means of means are
// the mean).
Problem transformer_problem() {
  const dp::TransformerConfig cfg = dp::testing::tiny_lm_config();
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(7);
  Problem p;
  auto ref = dp::TransformerLM(cfg);
  auto ddp = dp::TransformerLM(cfg);
  dp::copy_parameters(*ddp, *ref);
  p.ref = ref.ptr();
  p.ddp = ddp.ptr();
  for (int s = 0; s < kSteps; ++s) {
    auto tokens = torch::randint(0, cfg.vocab_size, {16, 9}, torch::kInt64);
    p.inputs.push_back(tokens.narrow(1, 0, 8).contiguous());
    p.targets.push_back(tokens.narrow(1, 1, 8).contiguous());
  }
  p.loss = [](torch::nn::Module& m, const torch::Tensor& x, const torch::Tensor& y) {
    return dp::lm_loss(static_cast<dp::TransformerLMImpl&>(m).forward(x), y);
  };
  p.terms_per_row = 8;
  p.depth = 1 + 10 * int(cfg.num_layers) + 3;  // embedding, 10 ops a layer, final norm, lm_head, loss
  return p;
}

// Every rank: K micro-batches of B = N / (K W) rows per step; micro-batch k of rank r is rows
// [(k W + r) B, (k W + r + 1) B). Throws CheckFailed unless the replica equals the reference after every
// step, and unless the guarded backward passes launched nothing.
template <typename Variant>
void accumulation_equals_one_process(ProcessGroup& pg, Problem p, const std::string& opt_kind, int K) {
  const int W = pg.world_size(), r = pg.rank();
  auto ddp = Variant::make(pg, p.ddp);
  auto ref_opt = make_optimizer(opt_kind, dp::unique_parameters(*p.ref, true));
  auto ddp_opt = make_optimizer(opt_kind, dp::unique_parameters(*p.ddp, true));
  dp::AdamWeightBound adam_bound(kAdamLr, kAdamBeta2, kAdamEps);
  double G = 0;  // the largest gradient entry so far: the scale of SGD's bound
  for (int s = 0; s < kSteps; ++s) {
    // [accumulate]
    const int64_t B = p.inputs[s].size(0) / (K * W);
    auto rows = [&](const torch::Tensor& t, int k) { return t.narrow(0, (k * W + r) * B, B); };
    ddp->on_train_batch_start();
    ddp_opt->zero_grad();
    const int64_t launched_before = ddp->launched_count();
    {
      NoSyncGuard guard(*ddp);  // micro-batches 0 .. K-2: local accumulation only
      for (int k = 0; k + 1 < K; ++k) (p.loss(*p.ddp, rows(p.inputs[s], k), rows(p.targets[s], k)) / K).backward();
    }
    if (ddp->launched_count() != launched_before) throw dp::CheckFailed("a backward inside no_sync() communicated");
    (p.loss(*p.ddp, rows(p.inputs[s], K - 1), rows(p.targets[s], K - 1)) / K).backward();  // synchronizes
    ddp->finish_gradient_synchronization();
    ddp_opt->step();
    // [accumulate]
    if (ddp->launched_count() - launched_before != ddp->calls_per_step())
      throw dp::CheckFailed("the backward after the guard did not launch every bucket once");

    ref_opt->zero_grad();
    p.loss(*p.ref, p.inputs[s], p.targets[s]).backward();
    const auto ref_params = dp::unique_parameters(*p.ref, true);
    const double dg =
        roundings(p, p.inputs[s].size(0), K, W) * dp::unit_roundoff(torch::kFloat32) * dp::max_abs_grad(ref_params);
    adam_bound.add_step(ref_params, dg);
    G = std::max(G, dp::max_abs_grad(ref_params));
    ref_opt->step();
    // Trainable tensors, in the order adam_bound saw them (frozen ones do not move in either run).
    const auto a = dp::unique_named_parameters(*p.ref, true), b = dp::unique_named_parameters(*p.ddp, true);
    const double sgd_bound = dp::sgd_weight_bound(
        kSgdLr, kMomentum, s + 1, roundings(p, p.inputs[s].size(0), K, W) * dp::unit_roundoff(torch::kFloat32) * G,
        dp::max_abs(dp::unique_parameters(*p.ref, true)));
    for (size_t i = 0; i < a.size(); ++i) {
      const double diff = (a[i].second - b[i].second).abs().max().item<double>();
      const double ratio =
          opt_kind == "adamw" ? adam_bound.worst_ratio({b[i].second}, {a[i].second}, i) : diff / sgd_bound;
      if (ratio > 1)
        throw dp::CheckFailed(
            fmt::format("{}, {} ranks, K = {}, step {}: {} differs from one process by {:.3g}, {:.3g} "
                        "times its rounding bound (largest value {:.3g})",
                        opt_kind, W, K, s, a[i].first, diff, ratio, a[i].second.abs().max().item<double>()));
    }
    if (!dp::parameters_identical_across_ranks(pg, *p.ddp)) throw dp::CheckFailed("ranks disagree");
  }
}

template <typename Variant>
class AccumulationContract : public ::testing::Test {};
// One gradient tensor per bucket (100 B) and everything in few buckets (10 kB).
using AccumulatingVariants = ::testing::Types<Bucketed<100>, Bucketed<10000>>;
TYPED_TEST_SUITE(AccumulationContract, AccumulatingVariants);

TYPED_TEST(AccumulationContract, Cs336ModelsEqualOneProcess) {
  for (const char* model : {"toy", "tied"})
    for (const char* opt : {"sgd", "adamw"})
      for (int world : {2, 4})
        for (int K : {1, 2, 4}) {
          SCOPED_TRACE(::testing::Message() << model << ", " << opt << ", " << world << " ranks, K = " << K);
          run_ranks(world, [&](ProcessGroup& pg) {
            accumulation_equals_one_process<TypeParam>(pg, toy_problem(model), opt, K);
          });
        }
}

TYPED_TEST(AccumulationContract, TransformerEqualsOneProcess) {
  for (const char* opt : {"sgd", "adamw"})
    for (int world : {2, 4})
      for (int K : {1, 2, 4}) {
        SCOPED_TRACE(::testing::Message() << opt << ", " << world << " ranks, K = " << K);
        run_ranks(world, [&](ProcessGroup& pg) {
          accumulation_equals_one_process<TypeParam>(pg, transformer_problem(), opt, K);
        });
      }
}

// ---- What the guard does and refuses (toy MLP, different on every rank) --------------------------------

// Inside the guard: no launch, finish does nothing, .grad() stays each rank's own. After it, finish alone
// (no backward outside the guard) still sends the accumulated sum.
TEST(NoSync, GradientsStayLocalThenFinishSendsTheSum) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    BucketedDdp ddp(pg, model, 0.0005);
    {
      NoSyncGuard guard(ddp);
      EXPECT_FALSE(ddp.requires_gradient_sync());
      model->forward(x).pow(2).mean().backward();
      model->forward(2 * x).pow(2).mean().backward();
      ddp.finish_gradient_synchronization();  // inside the guard: nothing to do
      EXPECT_EQ(ddp.launched_count(), 0);
    }
    EXPECT_TRUE(ddp.requires_gradient_sync());
    auto local = model->fc1->weight.grad().clone();  // the sum of both backward passes, this rank's own
    EXPECT_FALSE(same_on_all_ranks(pg, local));
    ddp.finish_gradient_synchronization();
    EXPECT_EQ(ddp.launched_count(), ddp.calls_per_step());
    auto locals = pg.all_gather(local);
    EXPECT_TRUE(torch::equal(model->fc1->weight.grad(), (locals[0] + locals[1]) / 2));
    ddp.finish_gradient_synchronization();  // nothing left: a second call sends nothing
    EXPECT_EQ(ddp.launched_count(), ddp.calls_per_step());
  });
}

// A guard while buckets of an unfinished step may be on the wire is refused; a second backward outside
// the guard still fails with the stage 04 message; guards nest and move.
TEST(NoSync, MisuseIsRefused) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [model, x] = make_local(pg.rank());
    BucketedDdp ddp(pg, model, 0.0005);
    model->forward(x).pow(2).mean().backward();  // outside any guard: buckets launched
    try {
      NoSyncGuard guard(ddp);
      ADD_FAILURE() << "a NoSyncGuard was accepted on an unfinished step";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("no_sync() while a synchronization is unfinished"), std::string::npos)
          << e.what();
    }
    ddp.finish_gradient_synchronization();
    {
      NoSyncGuard outer(ddp);
      {
        NoSyncGuard inner(ddp);
        auto moved = std::move(inner);
      }
      EXPECT_FALSE(ddp.requires_gradient_sync());  // the outer guard still lives
      model->forward(x).pow(2).mean().backward();
    }
    model->forward(x).pow(2).mean().backward();  // synchronizes the accumulated sum
    try {
      model->forward(x).pow(2).mean().backward();
      ADD_FAILURE() << "a second backward outside the guard was accepted";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find(dp::kBackwardTwiceMessage), std::string::npos) << e.what();
    }
    ddp.finish_gradient_synchronization();
    EXPECT_TRUE(same_on_all_ranks(pg, model->fc1->weight.grad()));
  });
}

}  // namespace
