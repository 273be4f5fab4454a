// Stage 06, both designs of optimizer-state sharding against unsharded training: the CS336 design
// (ShardedOptimizer: all-reduce, step the owned tensors, broadcast) and true ZeRO-1 (Zero1Optimizer:
// reduce-scatter, step a flat chunk, all-gather). One typed suite runs the same bodies on both; ranks
// are threads (run_ranks). What only Zero1Optimizer has (flat buffers, views) is tested at the end.
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "tests/stages/sharded_opt_support.hpp"
#include "tests/support/expect.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <limits>

namespace {

using namespace dp::testing;
using dp::ProcessGroup;

// The gradients of the trainable parameters (tied weights once).
std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : dp::unique_parameters(m, true))
    if (p.grad().defined()) out.push_back(p.grad());
  return out;
}

// What "equal" means: bit-identical after every step, for both designs at every world size, against the
// unsharded optimizer whose gradients were averaged by Design::replicated_average / ddp_average, i.e.
// with the same sum over ranks as the design. For the CS336 design that is the plain gradient (replicated)
// and Gloo's all-reduce (DDP). For ZeRO-1 it is the plain gradient at N <= 2 too (a + b, halved: exact),
// so there ZeRO-1 equals the unsharded optimizer on the raw gradients bit for bit; at N = 3 and 4 its
// sum in rank order can differ from the raw gradient and from Gloo's ring by a rounding in the
// gradient, and the test Zero1VsGlooAllReduce below bounds that. The update itself is element-wise:
// running it over one flat chunk instead of tensor by tensor changes no bit (measured; hence no ulps).
template <typename Design>
class ShardedDesign : public ::testing::Test {};
using Designs = ::testing::Types<Cs336Design, Zero1Design, BucketedZero1Design>;
struct DesignNames {
  template <typename T>
  static std::string GetName(int) {
    return T::name;
  }
};
TYPED_TEST_SUITE(ShardedDesign, Designs, DesignNames);

// CS336's test for both designs: every rank seeds 42 and sees the same data (no DDP); after every one of
// 10 steps the sharded model equals the unsharded optimizer's within tolerance<Design>; frozen
// parameters never move; all ranks agree bit for bit.
template <typename Design>
void cs336_models(const std::string& model, const std::string& kind, int world) {
  run_ranks(world, [&](ProcessGroup& pg) {
    auto p = build_pair(model, 10);
    std::vector<torch::Tensor> frozen_before;
    for (auto& t : dp::unique_parameters(*p.shd))
      if (!t.requires_grad()) frozen_before.push_back(t.detach().clone());
    auto ref = plain_optimizer(kind, {optim::OptimizerParamGroup(dp::unique_parameters(*p.ref))});
    Design shd(pg, p.shd->parameters(), kind, 0.1);  // the raw list: tied weights appear twice
    require(shd.kind() == kind, "kind() is " + shd.kind());
    for (int step = 0; step < 10; ++step) {
      ref->zero_grad();
      shd.zero_grad();
      loss_of(*p.ref, p.batches[step]).backward();
      loss_of(*p.shd, p.batches[step]).backward();
      Design::replicated_average(pg, grads_of(*p.ref));
      ref->step();
      shd.step_replicated();
      require_within_ulps(
          *p.ref, *p.shd, 0,
          fmt::format("{} {} {} W={} rank {} step {}", Design::name, model, kind, world, pg.rank(), step + 1));
    }
    size_t k = 0;
    for (auto& t : dp::unique_parameters(*p.shd))
      if (!t.requires_grad()) require(torch::equal(t, frozen_before[k++]), "a frozen parameter changed");
    require(dp::parameters_identical_across_ranks(pg, *p.shd), "ranks disagree");
  });
}

TYPED_TEST(ShardedDesign, Cs336ToyModelEqualsUnsharded) {
  for (const std::string kind : {"adamw", "adam", "sgd"})
    for (int world = 1; world <= 4; ++world) cs336_models<TypeParam>("toy", kind, world);
}
TYPED_TEST(ShardedDesign, Cs336TiedModelEqualsUnsharded) {
  for (const std::string kind : {"adamw", "adam", "sgd"})
    for (int world = 1; world <= 4; ++world) cs336_models<TypeParam>("tied", kind, world);
}

// The Transformer, data parallel: each rank its own rows. The reference is the unsharded optimizer after
// DDP's averaging by hand (all-reduce, divide by N), the state of the art the designs must reproduce.
template <typename Design>
void transformer_ddp(const std::string& kind, int world) {
  constexpr int kSteps = 3, kPerRank = 2, kT = 16;
  run_ranks(world, [&](ProcessGroup& pg) {
    // 2 blocks of d_model 64 (4 heads of 16, d_ff 256) and 1,000 tokens: 21 tensors of every kind the
    // presets have, 259 k parameters. Bit identity does not depend on the width; what is tested is every
    // kind of tensor, padding (no size here divides by 3) and, for zero1_buckets' 4 kB cap, buckets of one
    // tensor (a 16 kB projection) and of several (256 B gains). At tiny's width these 9 tests took 81 s.
    auto cfg = dp::TransformerConfig::preset("tiny", kT);
    cfg.num_layers = 2;
    cfg.vocab_size = 1000;
    cfg.d_model = 64;
    cfg.d_ff = 256;
    auto twins = twin_transformers(cfg, 42, {kSteps, world * kPerRank, kT + 1});
    auto &ref = twins.ref, &shd = twins.shd;
    const torch::Tensor& tokens = twins.tokens;
    const double lr = kind == "sgd" ? 0.1 : 1e-3;
    auto plain = plain_optimizer(kind, {optim::OptimizerParamGroup(dp::unique_parameters(*ref))}, lr);
    Design sharded(pg, dp::unique_parameters(*shd), kind, lr);
    auto backward = [&](dp::TransformerLM& m, const torch::Tensor& batch) {
      auto rows = batch.narrow(0, pg.rank() * kPerRank, kPerRank);
      dp::lm_loss(m->forward(rows.narrow(1, 0, kT)), rows.narrow(1, 1, kT)).backward();
    };
    for (int step = 0; step < kSteps; ++step) {
      plain->zero_grad();
      backward(ref, tokens[step]);
      Design::ddp_average(pg, grads_of(*ref));
      plain->step();
      sharded.zero_grad();
      backward(shd, tokens[step]);
      sharded.step_ddp();
      require_within_ulps(
          *ref, *shd, 0,
          fmt::format("{} transformer {} W={} rank {} step {}", Design::name, kind, world, pg.rank(), step + 1));
    }
    require(dp::parameters_identical_across_ranks(pg, *shd), "ranks disagree");
  });
}

TYPED_TEST(ShardedDesign, TransformerDdpEqualsUnshardedAdamW) {
  for (int world = 1; world <= 4; ++world) transformer_ddp<TypeParam>("adamw", world);
}
TYPED_TEST(ShardedDesign, TransformerDdpEqualsUnshardedAdam) {
  for (int world = 1; world <= 4; ++world) transformer_ddp<TypeParam>("adam", world);
}
TYPED_TEST(ShardedDesign, TransformerDdpEqualsUnshardedSgdMomentum) {
  for (int world = 1; world <= 4; ++world) transformer_ddp<TypeParam>("sgd", world);
}

// ---------------------------------------------------------------------------------------------------
// ZeRO-1 against DDP with Gloo's own all-reduce, where the sums' orders differ (N = 3, 4)
// ---------------------------------------------------------------------------------------------------

// One step of SGD (the first, so momentum is the gradient): p - lr * avg(g). Two sums of the same N terms
// in different orders each lie within (N-1) u sum_k |g_k| of the exact sum (u = 2^-24, float32's unit
// roundoff), so the averages differ by at most 2 (N-1)/N u S + u |avg| < 2 u S with S = sum_k |g_k|; the
// product with lr and the subtraction from p add a rounding of |p| each. Hence, per element,
//   |p_zero1 - p_ddp| <= lr * 2 eps S + 2 eps |p|,  eps = 2^-23 = 2u (a factor 2 of slack throughout).
TEST(Zero1VsGlooAllReduce, OneSgdStepWithinTheSummationBound) {
  for (int world : {3, 4}) {
    run_ranks(world, [&](ProcessGroup& pg) {
      auto cfg = dp::TransformerConfig::preset("tiny", 16);
      auto twins = twin_transformers(cfg, 7, {world * 2, 17});
      auto &ref = twins.ref, &shd = twins.shd;
      const torch::Tensor& tokens = twins.tokens;
      const double lr = 0.1;
      auto rows = tokens.narrow(0, pg.rank() * 2, 2);
      auto plain = plain_optimizer("sgd", {optim::OptimizerParamGroup(dp::unique_parameters(*ref))}, lr);
      dp::Zero1Optimizer zero1(pg, dp::unique_parameters(*shd), local_factory("sgd", lr));
      dp::lm_loss(ref->forward(rows.narrow(1, 0, 16)), rows.narrow(1, 1, 16)).backward();
      dp::lm_loss(shd->forward(rows.narrow(1, 0, 16)), rows.narrow(1, 1, 16)).backward();
      std::vector<torch::Tensor> abs_sum;  // S = sum over ranks of |g_k|, element by element
      for (auto& g : grads_of(*ref)) abs_sum.push_back(g.abs());
      for (auto& a : abs_sum) pg.all_reduce(a);
      Cs336Design::ddp_average(pg, grads_of(*ref));  // Gloo's all-reduce, / N
      plain->step();
      zero1.step();
      const double eps = std::numeric_limits<float>::epsilon();
      auto a = dp::unique_parameters(*ref, true), b = dp::unique_parameters(*shd, true);
      for (size_t i = 0; i < a.size(); ++i) {
        auto bound = lr * 2 * eps * abs_sum[i] + 2 * eps * a[i].abs();
        require(torch::all((a[i] - b[i]).abs() <= bound).item<bool>(),
                fmt::format("W={} tensor {}: a difference beyond the summation bound", world, i));
      }
    });
  }
}

// ---------------------------------------------------------------------------------------------------
// Zero1Optimizer's own: flat buffers, padding, gradients that backward did not write, bad parameters
// ---------------------------------------------------------------------------------------------------

TEST(Zero1Optimizer, FlatLayoutHoldsOnlyTrainableTensorsOnce) {
  run_ranks(3, [](ProcessGroup& pg) {
    auto p = build_pair("tied", 1);  // the tied weight is listed twice by LibTorch
    dp::Zero1Optimizer opt(pg, p.shd->parameters(), local_factory("adamw"));
    require(opt.parameters().size() == 4, "4 distinct tensors");
    const int64_t n = dp::count_elements(dp::unique_parameters(*p.shd, true));
    require(opt.layout().numel == n && opt.layout().padded % 3 == 0 && opt.layout().padded - n < 3, "layout");
    require(opt.shard().numel() == opt.layout().chunk && opt.shard().is_leaf() && opt.shard().requires_grad(),
            "the shard is a leaf the optimizer can step");
    require(opt.describe().find("all-to-all + local sum") != std::string::npos, opt.describe());
    // The model's tensors are views of the flat buffer: writing this rank's chunk changes the model.
    {
      torch::NoGradGuard g;
      opt.shard().fill_(0.5f);
    }
    const auto after = dp::unique_parameters(*p.shd, true);
    int64_t halves = 0;
    for (auto& t : after) halves += (t == 0.5f).sum().item<int64_t>();
    require(halves == opt.layout().data_in(pg.rank()), fmt::format("{} model elements changed", halves));
  });
}

TEST(Zero1Optimizer, StateIsOneChunkAndBuffersAreCounted) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto p = build_pair("toy", 1);
    dp::Zero1Optimizer opt(pg, p.shd->parameters(), local_factory("adamw"));
    loss_of(*p.shd, p.batches[0]).backward();
    opt.step();
    const int64_t chunk = opt.layout().chunk;  // 850 trainable elements over 2 ranks: 425 each
    require(chunk == 425, "chunk");
    require(dp::optimizer_state_bytes(opt.local()) == 8 * chunk, "AdamW state is two moments of one chunk");
    require(opt.buffer_bytes() == 4 * chunk + 4 * 850, "the shard's gradient and the all-to-all's receive buffer");
    auto bytes = dp::count_training_bytes(*p.shd, opt.local());
    require(bytes.grads == 4 * 850, "gradients: views of the flat buffer, each counted once");
  });
}

TEST(Zero1Optimizer, GradientsReplacedOrDroppedAreStillUsed) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto p = build_pair("toy", 3);
    auto ref = plain_optimizer("sgd", {optim::OptimizerParamGroup(dp::unique_parameters(*p.ref))});
    dp::Zero1Optimizer opt(pg, p.shd->parameters(), local_factory("sgd"));
    for (int step = 0; step < 3; ++step) {
      ref->zero_grad();
      for (auto& t : dp::unique_parameters(*p.shd)) t.mutable_grad().reset();  // set_to_none by hand
      loss_of(*p.ref, p.batches[step]).backward();
      loss_of(*p.shd, p.batches[step]).backward();  // fresh gradients, outside the flat buffer
      ref->step();
      opt.step();
      require_same(*p.ref, *p.shd, fmt::format("step {}", step + 1));
    }
  });
}

// More ranks than elements: the padding is most of the buffer, a rank may own only padding.
TEST(Zero1Optimizer, MoreRanksThanElements) {
  for (int world : {3, 4}) {
    run_ranks(world, [&](ProcessGroup& pg) {
      auto a = torch::tensor({1.0f, -2.0f}).requires_grad_(), b = a.detach().clone().requires_grad_();
      auto ref = plain_optimizer("adam", {optim::OptimizerParamGroup({a})});
      dp::Zero1Optimizer opt(pg, {b}, local_factory("adam"));
      require(opt.layout().padded == world && opt.layout().chunk == 1, "one element per rank");
      for (int step = 0; step < 5; ++step) {
        ref->zero_grad();
        opt.zero_grad();
        (a * a * 3).sum().backward();
        (b * b * 3).sum().backward();
        ref->step();
        opt.step();
        require(torch::equal(a, b), fmt::format("W={} step {}", world, step + 1));
      }
    });
  }
}

TEST(Zero1Optimizer, RefusesParametersItCannotFlatten) {
  run_ranks(1, [](ProcessGroup& pg) {
    auto d = torch::zeros({3}, torch::dtype(torch::kFloat64).requires_grad(true));
    expect_usage_error([&] { dp::Zero1Optimizer(pg, {d}, local_factory("sgd")); }, {"not a float32 leaf"});
    auto leaf = torch::zeros({3}, torch::requires_grad());
    auto non_leaf = leaf * 2;
    expect_usage_error([&] { dp::Zero1Optimizer(pg, {non_leaf}, local_factory("sgd")); }, {"not a float32 leaf"});
  });
}

}  // namespace
