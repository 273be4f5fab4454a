// The communication hooks (common/comm/comm_hook.hpp) and extension 05a's low-precision hooks: the default hook is
// bit-identical to stage 05 without hooks; the fp16 hook equals the fp16-rounded closed form and sends half the bytes;
// training with it stays within a stated tolerance of fp32 training; which 16-bit types this backend sums; bad names.
// Ranks are threads over a real Gloo group.
#include "common/comm/comm_hook.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/tolerance.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "extensions/05a_comm_hooks/low_precision_hooks.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/ranks.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using dp::BucketedDdp;
using dp::ProcessGroup;
using dp::testing::rng_mutex;
using dp::testing::run_ranks;

// Two parameters whose gradients are whatever we choose: loss = <a, ga> + <b, gb> gives a.grad() = ga,
// b.grad() = gb exactly. At a 500 B cap: b (50 floats, 200 B) is bucket 0, a (300 floats) bucket 1.
struct ChosenGradsImpl : torch::nn::Module {
  ChosenGradsImpl() {
    a = register_parameter("a", torch::zeros({300}));
    b = register_parameter("b", torch::zeros({50}));
  }
  void backward_with(const torch::Tensor& ga, const torch::Tensor& gb) { ((a * ga).sum() + (b * gb).sum()).backward(); }
  torch::Tensor a, b;
};

// Gradients of this rank for `a` and `b`, from `draw(n)` seeded with 1000 + rank.
template <typename Draw>
std::pair<torch::Tensor, torch::Tensor> rank_grads(int rank, Draw draw) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(1000 + rank);
  auto ga = draw(300);
  return {ga, draw(50)};
}

// `hook`, adding what it hands to the collective (BucketWork::wire_bytes, per rank) to *bytes.
dp::CommHook counting(dp::CommHook hook, std::shared_ptr<int64_t> bytes) {
  return [hook, bytes](ProcessGroup& pg, torch::Tensor& bucket, const std::string& label) {
    auto w = hook(pg, bucket, label);
    *bytes += w.wire_bytes;
    return w;
  };
}

// Wide range of magnitudes, 1e-3 .. 1e2, both signs: fp16 rounds every one of them.
torch::Tensor wide(int64_t n) { return torch::randn({n}) * torch::pow(10.0, torch::rand({n}) * 5 - 3); }

// ---- The default hook -------------------------------------------------------------------------------------

// Registering allreduce_hook() explicitly changes nothing, and with two ranks the result is the closed form
// (g0 + g1) / 2, bit for bit: stage 05's all-reduce and one division, as before hooks existed.
TEST(CommHooks, DefaultHookIsBitIdenticalToPlainAverage) {
  for (int world : {2, 4})
    run_ranks(world, [](ProcessGroup& pg) {
      auto [ga, gb] = rank_grads(pg.rank(), wide);
      auto plain = std::make_shared<ChosenGradsImpl>(), hooked = std::make_shared<ChosenGradsImpl>();
      BucketedDdp ddp_plain(pg, plain, 0.0005), ddp_hooked(pg, hooked, 0.0005);
      auto sent = std::make_shared<int64_t>(0);
      ddp_hooked.register_comm_hook(counting(dp::allreduce_hook(), sent));
      ASSERT_EQ(ddp_plain.bucket_count(), 2u);
      for (auto* m : {plain.get(), hooked.get()}) m->backward_with(ga, gb);
      ddp_plain.finish_gradient_synchronization();
      ddp_hooked.finish_gradient_synchronization();
      EXPECT_TRUE(torch::equal(plain->a.grad(), hooked->a.grad()));
      EXPECT_TRUE(torch::equal(plain->b.grad(), hooked->b.grad()));
      EXPECT_EQ(*sent, 350 * 4);
      if (pg.world_size() == 2) {  // a + b is the same whatever order Gloo adds in
        auto as = pg.all_gather(ga), bs = pg.all_gather(gb);
        EXPECT_TRUE(torch::equal(hooked->a.grad(), (as[0] + as[1]) / 2));
        EXPECT_TRUE(torch::equal(hooked->b.grad(), (bs[0] + bs[1]) / 2));
      }
    });
}

// ---- fp16 compression -------------------------------------------------------------------------------------

// fp16 rounding of a float tensor, back in float.
torch::Tensor r16(const torch::Tensor& t) { return t.to(torch::kHalf).to(torch::kFloat); }

// Two ranks: Gloo adds the two fp16 values (in float) and rounds the sum to fp16 once; the hook widens it
// and divides by 2 in fp32 (exact). So the result is r16(r16(g0) + r16(g1)) / 2, bit for bit. Half the bytes.
TEST(CommHooks, Fp16HookEqualsRoundedClosedForm) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto [ga, gb] = rank_grads(pg.rank(), wide);
    auto m = std::make_shared<ChosenGradsImpl>();
    BucketedDdp ddp(pg, m, 0.0005);
    auto sent = std::make_shared<int64_t>(0);
    ddp.register_comm_hook(counting(dp::make_comm_hook("fp16", pg), sent));
    m->backward_with(ga, gb);
    ddp.finish_gradient_synchronization();
    EXPECT_EQ(*sent, 350 * 2);  // fp16: 2 bytes per gradient, not 4
    auto as = pg.all_gather(ga), bs = pg.all_gather(gb);
    auto expect_a = r16(r16(as[0]) + r16(as[1])) / 2, expect_b = r16(r16(bs[0]) + r16(bs[1])) / 2;
    EXPECT_TRUE(torch::equal(m->a.grad(), expect_a)) << (m->a.grad() - expect_a).abs().max().item<double>();
    EXPECT_TRUE(torch::equal(m->b.grad(), expect_b));
    // And it is not the fp32 average: the test can tell the hooks apart.
    EXPECT_FALSE(torch::equal(m->a.grad(), (as[0] + as[1]) / 2));
  });
}

// Four ranks on a grid where fp16 is exact (multiples of 2^-10 up to 0.5, sums of four up to 2 need at most
// 11 significant bits): whatever order Gloo adds in, the result is the exact mean.
TEST(CommHooks, Fp16HookFourRanksExactOnFp16Grid) {
  run_ranks(4, [](ProcessGroup& pg) {
    auto grid = [](int64_t n) { return torch::randint(-512, 513, {n}).to(torch::kFloat) / 1024; };
    auto [ga, gb] = rank_grads(pg.rank(), grid);
    auto m = std::make_shared<ChosenGradsImpl>();
    BucketedDdp ddp(pg, m, 0.0005);
    ddp.register_comm_hook(dp::make_comm_hook("fp16", pg));
    m->backward_with(ga, gb);
    ddp.finish_gradient_synchronization();
    auto as = pg.all_gather(ga), bs = pg.all_gather(gb);
    EXPECT_TRUE(torch::equal(m->a.grad(), (as[0] + as[1] + as[2] + as[3]) / 4));
    EXPECT_TRUE(torch::equal(m->b.grad(), (bs[0] + bs[1] + bs[2] + bs[3]) / 4));
  });
}

// Training with the fp16 hook stays close to fp32 training: the Transformer below, 2 ranks, AdamW (lr 1e-3),
// 20 steps of 8 sequences of 8 tokens. The bound (common/measure/tolerance.hpp): the hook rounds each rank's
// gradient to fp16 and their sum once more (3 roundings of u(fp16) = 2^-11 against the largest gradient
// entry; below 2^-14 fp16 is subnormal and a cast errs by up to 2^-25 absolute, W of them); AdamW turns
// that, entry by entry, into a weight difference (AdamWeightBound), and the final loss can differ by at
// most the sum of |dL/dw| times those (first order). A hook that forgot to divide, or sent garbage, fails
// both by far.
TEST(CommHooks, Fp16TrainingStaysCloseToFp32) {
  run_ranks(2, [](ProcessGroup& pg) {
    const dp::TransformerConfig cfg = dp::testing::tiny_lm_config();
    dp::TransformerLM m32{nullptr}, m16{nullptr};
    torch::Tensor tokens;
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(11);
      m32 = dp::TransformerLM(cfg);
      m16 = dp::TransformerLM(cfg);
      dp::copy_parameters(*m16, *m32);
      tokens = torch::randint(0, cfg.vocab_size, {20, 8, 9}, torch::kInt64);  // [step, global batch, T + 1]
    }
    BucketedDdp d32(pg, m32.ptr(), 0.002), d16(pg, m16.ptr(), 0.002);
    d16.register_comm_hook(dp::make_comm_hook("fp16", pg));
    const auto adamw = torch::optim::AdamWOptions(1e-3);
    torch::optim::AdamW o32(dp::unique_parameters(*m32), adamw), o16(dp::unique_parameters(*m16), adamw);
    dp::AdamWeightBound bound(adamw.lr(), std::get<1>(adamw.betas()), adamw.eps());
    const double u16 = dp::unit_roundoff(torch::kFloat16), subnormal_error = std::ldexp(1.0, -25);
    double l32 = 0, l16 = 0;
    for (int64_t s = 0; s < tokens.size(0); ++s) {
      auto mine = tokens[s].narrow(0, 4 * pg.rank(), 4);  // 4 sequences per rank
      auto x = mine.narrow(1, 0, 8), y = mine.narrow(1, 1, 8);
      auto train = [&](dp::TransformerLM& m, BucketedDdp& d, torch::optim::AdamW& o) {
        o.zero_grad();
        auto loss = dp::lm_loss(m->forward(x), y);
        loss.backward();
        d.finish_gradient_synchronization();
        if (&m == &m32) {
          const auto params = dp::unique_parameters(*m32);
          bound.add_step(params, 3 * u16 * dp::max_abs_grad(params) + pg.world_size() * subnormal_error);
        }
        o.step();
        return loss.item<double>();
      };
      l32 = train(m32, d32, o32);
      l16 = train(m16, d16, o16);
    }
    // The last step's gradients of the fp32 run (still in .grad()) weigh each weight's bound into the loss's.
    const auto a = dp::unique_named_parameters(*m32), b = dp::unique_named_parameters(*m16);
    double worst = 0, changed = 0;
    std::string where;
    for (size_t i = 0; i < a.size(); ++i) {
      const double ratio = bound.worst_ratio({b[i].second}, {a[i].second}, i);
      changed = std::max(changed, (a[i].second - b[i].second).abs().max().item<double>());
      if (ratio > worst) {
        worst = ratio;
        where = a[i].first;
      }
    }
    const double loss_bound = bound.first_order_change(dp::unique_parameters(*m32));
    if (pg.rank() == 0)
      fmt::print(
          "fp16 vs fp32 after 20 steps: worst parameter difference / bound {:.3g} ({}), loss {:.6f} vs {:.6f} "
          "(|diff| {:.3g} <= {:.3g})\n",
          worst, where, l16, l32, std::abs(l16 - l32), loss_bound);
    EXPECT_GT(changed, 0.0) << "the fp16 hook changed nothing: was it used?";
    EXPECT_LE(worst, 1.0) << where;
    EXPECT_LE(std::abs(l16 - l32), loss_bound);
  });
}

// ---- Which 16-bit types this backend sums, and bad names ---------------------------------------------

// Gloo sums fp16 in LibTorch 1.13 and 2.x; bf16 only from 2.x on (checked with 2.15). The probe runs it.
TEST(CommHooks, BackendSumsFp16AndBf16OnlyWhereItCan) {
  run_ranks(2, [](ProcessGroup& pg) {
    EXPECT_TRUE(dp::backend_sums(pg, torch::kHalf));
    const bool bf16 = dp::backend_sums(pg, torch::kBFloat16);
    EXPECT_EQ(bf16, TORCH_VERSION_MAJOR >= 2);
    if (bf16) {
      EXPECT_NO_THROW(dp::make_comm_hook("bf16", pg));
    } else {
      try {
        dp::make_comm_hook("bf16", pg);
        ADD_FAILURE() << "bf16 hook accepted on a backend that cannot sum bf16";
      } catch (const dp::UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("cannot all-reduce bf16"), std::string::npos) << e.what();
      }
    }
    // The probes left the ranks' collectives aligned: an ordinary all-reduce still pairs up.
    auto t = torch::ones({3});
    pg.all_reduce(t);
    EXPECT_TRUE(torch::equal(t, torch::full({3}, 2.0f)));
  });
}

TEST(CommHooks, UnknownNameNamesValueAndChoices) {
  run_ranks(1, [](ProcessGroup& pg) {
    try {
      dp::make_comm_hook("int8", pg);
      ADD_FAILURE() << "unknown hook accepted";
    } catch (const dp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("'int8': use allreduce, fp16 or bf16"), std::string::npos) << e.what();
    }
  });
}

TEST(CommHooks, RegisterMidStepIsRefused) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto m = std::make_shared<ChosenGradsImpl>();
    BucketedDdp ddp(pg, m, 0.0005);
    m->backward_with(torch::ones({300}), torch::ones({50}));  // buckets in flight
    EXPECT_THROW(ddp.register_comm_hook(dp::allreduce_hook()), std::logic_error);
    ddp.finish_gradient_synchronization();
    EXPECT_NO_THROW(ddp.register_comm_hook(dp::allreduce_hook()));
  });
}

}  // namespace
