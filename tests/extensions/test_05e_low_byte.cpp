// Extension 05e's low-byte transport (common/comm/wire_format.hpp, common/comm/low_byte.hpp and the hook of
// extensions/05e_low_byte/low_byte_hook.hpp): each wire format rounds within the bound it derives; the all-reduce
// over 2, 3 and 4 ranks equals its one-process model bit for bit, lies within low_byte_bound() of the exact
// average, and sends the bytes its layout says; the planted mistakes break the bounds: one int8 scale over a whole
// chunk instead of a block, and sums in 16 bits instead of fp32 (whose error then grows with the ranks). Ranks are
// threads over a real Gloo group.
#include "common/base/errors.hpp"
#include "common/comm/low_byte.hpp"
#include "common/comm/wire_format.hpp"
#include "extensions/05e_low_byte/low_byte_hook.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "tests/support/ranks.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

namespace {

using dp::LowByteOptions;
using dp::SumIn;
using dp::WireFormat;
using dp::WireSpec;
using dp::testing::rng_mutex;
using dp::testing::run_ranks;

WireSpec spec(const std::string& name, int64_t block = 64) { return dp::parse_wire_format(name, block); }

// Values whose magnitudes span six decades, block by block (so that one int8 scale per block matters): element i
// is N(0, 1) times 10^(3 - (i / 64) % 7).
torch::Tensor spread_values(int64_t n, uint64_t seed) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  auto decade = (torch::arange(n, torch::kLong).div(64, "floor").remainder(7)).to(torch::kFloat);
  return torch::randn({n}) * torch::pow(10.0, 3.0 - decade);
}

// How many values of `got` lie further from `want` than `bound` allows.
int64_t outside(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& bound) {
  return ((got.to(torch::kDouble) - want.to(torch::kDouble)).abs() > bound.to(torch::kDouble)).sum().item<int64_t>();
}

TEST(WireFormat, BytesPerValueAndPackedScales) {
  EXPECT_EQ(spec("fp32").bytes(1024), 4096);
  EXPECT_EQ(spec("bf16").bytes(1024), 2048);
  EXPECT_EQ(spec("fp16").bytes(1024), 2048);
  EXPECT_EQ(spec("int8", 256).bytes(1024), 1024 + 4 * 4);  // the payload and 4 fp32 scales in one buffer
  EXPECT_EQ(spec("int8", 256).name(), "int8/256");
}

TEST(WireFormat, EachRoundTripWithinItsBound) {
  auto x = spread_values(64 * 21, 7);
  for (const char* name : {"fp32", "bf16", "fp16", "int8"}) {
    const auto s = spec(name);
    auto y = dp::round_trip(s, x);
    EXPECT_EQ(outside(y, x, dp::rounding_bound(s, x)), 0) << name;
    if (s.format == WireFormat::fp32) EXPECT_TRUE(torch::equal(y, x));
  }
  // The bounds are not loose: bf16 moves some value by more than a quarter of its bound.
  const auto b = spec("bf16");
  auto ratio = (dp::round_trip(b, x) - x).abs() / dp::rounding_bound(b, x).clamp_min(1e-30);
  EXPECT_GT(ratio.max().item<double>(), 0.25);
}

TEST(WireFormat, Int8ZeroBlockAndExtremes) {
  auto x = torch::zeros({128});
  x.narrow(0, 64, 64).copy_(torch::linspace(-3, 5, 64));
  const auto s = spec("int8", 64);
  auto bytes = torch::empty({s.bytes(128)}, torch::kUInt8);
  dp::encode(s, x, bytes);
  auto scales = torch::empty({2}, torch::kFloat);
  scales.view(torch::kUInt8).copy_(bytes.narrow(0, 0, 8));
  EXPECT_EQ(scales[0].item<float>(), 0.0f);                 // a block of zeros: scale 0, decoded as zeros
  EXPECT_FLOAT_EQ(scales[1].item<float>(), 5.0f / 127.0f);  // the block's largest |x| maps to 127
  auto y = torch::empty({128});
  dp::decode(s, bytes, y);
  EXPECT_TRUE(torch::equal(y.narrow(0, 0, 64), torch::zeros({64})));
  EXPECT_NEAR(y[127].item<float>(), 5.0f, 5e-6);
}

// The planted mistake: one int8 scale over the whole buffer instead of one per block. The small blocks round to
// zero and the per-block bound catches it.
TEST(WireFormat, OneScaleOverTheWrongSpanIsCaught) {
  auto x = spread_values(64 * 14, 8);
  const auto right = spec("int8", 64);
  const auto wrong = spec("int8", x.numel());
  EXPECT_EQ(outside(dp::round_trip(right, x), x, dp::rounding_bound(right, x)), 0);
  EXPECT_GT(outside(dp::round_trip(wrong, x), x, dp::rounding_bound(right, x)), 64);
}

TEST(WireFormat, BadNamesAndBlocks) {
  try {
    dp::parse_wire_format("int4");
    FAIL() << "int4 accepted";
  } catch (const dp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown wire format 'int4': use fp32, bf16, fp16 or int8"),
              std::string::npos);
  }
  EXPECT_THROW(dp::parse_wire_format("int8", 0), dp::UsageError);
  auto out = torch::empty({spec("int8", 64).bytes(128)}, torch::kUInt8);
  EXPECT_THROW(dp::encode(spec("int8", 64), torch::zeros({100}), out), std::invalid_argument);  // not whole blocks
}

// Every rank's buffer, as each thread can rebuild it: rank k's values drawn from seed 100 + k.
std::vector<torch::Tensor> all_ranks(int world, int64_t n) {
  std::vector<torch::Tensor> out;
  for (int k = 0; k < world; ++k) out.push_back(spread_values(n, 100 + k));
  return out;
}

torch::Tensor exact_average(const std::vector<torch::Tensor>& xs) {
  auto sum = torch::zeros_like(xs[0], torch::kDouble);
  for (const auto& x : xs) sum += x.to(torch::kDouble);
  return sum / static_cast<double>(xs.size());
}

class LowByteAllReduceTest : public ::testing::TestWithParam<int> {};

// The collective equals its one-process model bit for bit, on every rank alike, within the derived bound of the
// exact average, and sends 2 (W - 1) chunks of encoded bytes. 1000 + 7 values: padding on every W.
TEST_P(LowByteAllReduceTest, EqualsModelWithinBoundAndCountsBytes) {
  const int W = GetParam();
  const int64_t n = 1007;
  for (const char* name : {"fp32", "bf16", "fp16", "int8"}) {
    const LowByteOptions opts{spec(name), SumIn::fp32};
    run_ranks(W, [&](dp::ProcessGroup& pg) {
      auto inputs = all_ranks(W, n);
      auto mine = inputs[pg.rank()].clone();
      dp::LowByteAllReduce reduce(pg, opts);
      reduce.run(mine, "test");
      EXPECT_TRUE(torch::equal(mine, dp::low_byte_average(inputs, opts))) << name << " on rank " << pg.rank();
      EXPECT_TRUE(dp::testing::same_on_all_ranks(pg, mine)) << name;
      EXPECT_EQ(outside(mine, exact_average(inputs), dp::low_byte_bound(inputs, opts.wire)), 0) << name;
      const auto L = dp::LowByteLayout::of(n, W, opts.wire);
      EXPECT_EQ(reduce.sent_bytes(), 2 * (W - 1) * opts.wire.bytes(L.chunk)) << name;
      EXPECT_EQ(L.chunk % opts.wire.granule(), 0) << name;  // a block never spans two ranks' chunks
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, LowByteAllReduceTest, ::testing::Values(2, 3, 4));

// The planted mistake: the same wire, the pieces added in fp16 instead of fp32. Rank 0 holds 2048, the others 0.9
// each: in fp16 (steps of 2 at 2048) every 0.9 added to 2048 is lost, while fp32 keeps them and rounds the
// average once. The bound derived for fp32 sums is broken, on the real collective as in the model.
TEST(LowByteAllReduce, SumsInSixteenBitsBreakTheBound) {
  const int W = 4;
  std::vector<torch::Tensor> inputs{torch::full({64}, 2048.0f)};
  for (int k = 1; k < W; ++k) inputs.push_back(torch::full({64}, 0.9f));
  const auto bound = dp::low_byte_bound(inputs, spec("fp16"));
  const auto exact = exact_average(inputs);
  EXPECT_EQ(outside(dp::low_byte_average(inputs, {spec("fp16"), SumIn::fp32}), exact, bound), 0);
  EXPECT_EQ(outside(dp::low_byte_average(inputs, {spec("fp16"), SumIn::wire}), exact, bound), 64);
  run_ranks(W, [&](dp::ProcessGroup& pg) {
    auto mine = inputs[pg.rank()].clone();
    dp::LowByteAllReduce(pg, {spec("fp16"), SumIn::wire}).run(mine, "mistake");
    EXPECT_EQ(outside(mine, exact, bound), 64);
  });
  EXPECT_THROW(dp::low_byte_average(inputs, {spec("int8"), SumIn::wire}), std::invalid_argument);
}

// Why the sums are in fp32: over random N(0, 1) values, the fp32 sums' error stays flat from 2 to 32 ranks (two
// roundings, whatever W), while 16-bit sums add one rounding per rank and their error grows with W.
TEST(LowByteAllReduce, SixteenBitSumsErrorGrowsWithRanksFp32SumsDoNot) {
  auto rms_error = [](int W, SumIn sum) {
    std::vector<torch::Tensor> xs;
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(5);
      for (int k = 0; k < W; ++k) xs.push_back(torch::randn({20000}));
    }
    auto exact = exact_average(xs);
    auto got = dp::low_byte_average(xs, {spec("bf16"), sum}).to(torch::kDouble);
    return ((got - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item<double>();
  };
  const double fp32_growth = rms_error(32, SumIn::fp32) / rms_error(2, SumIn::fp32);
  const double wire_growth = rms_error(32, SumIn::wire) / rms_error(2, SumIn::wire);
  EXPECT_LT(fp32_growth, 1.5) << "fp32 sums: relative error at 32 ranks over that at 2";
  EXPECT_GT(wire_growth, 2.0) << "bf16 sums: relative error at 32 ranks over that at 2";
}

// Two parameters whose gradients are chosen: loss = <a, ga> + <b, gb>.
struct ChosenGradsImpl : torch::nn::Module {
  ChosenGradsImpl() {
    a = register_parameter("a", torch::zeros({300}));
    b = register_parameter("b", torch::zeros({50}));
  }
  torch::Tensor a, b;
};

// Through stage 05's DDP: the bucket's average is the model's, for every hook that rounds (one bucket).
TEST(LowByteHook, StageFiveBucketEqualsTheModel) {
  for (const char* name : {"bf16", "fp16", "int8"}) {
    run_ranks(3, [&](dp::ProcessGroup& pg) {
      auto m = std::make_shared<ChosenGradsImpl>();
      dp::BucketedDdp ddp(pg, m, 25.0);
      dp::LowByteHookOptions o;
      o.block = 32;
      auto h = dp::make_low_byte_hook(name, pg, ddp, o);
      ddp.register_comm_hook(h.hook);
      std::vector<torch::Tensor> per_rank;  // each rank's bucket: its gradients back to back, in bucket order
      for (int k = 0; k < 3; ++k) per_rank.push_back(spread_values(350, 300 + k));
      auto g = per_rank[pg.rank()];
      ((m->a * g.narrow(0, 0, 300)).sum() + (m->b * g.narrow(0, 300, 50)).sum()).backward();
      ddp.finish_gradient_synchronization();
      ASSERT_EQ(ddp.bucket_count(), 1u);
      const LowByteOptions opts{spec(name, 32), SumIn::fp32};
      // The bucket holds the parameters in buckets()[0]'s order; the model sees the same order.
      std::vector<torch::Tensor> in_bucket_order;
      for (const auto& x : per_rank) {
        std::vector<torch::Tensor> parts;
        for (size_t i : ddp.buckets()[0]) parts.push_back(i == 0 ? x.narrow(0, 0, 300) : x.narrow(0, 300, 50));
        in_bucket_order.push_back(torch::cat(parts));
      }
      auto want = dp::low_byte_average(in_bucket_order, opts);
      std::vector<torch::Tensor> got;
      for (size_t i : ddp.buckets()[0]) got.push_back(i == 0 ? m->a.grad() : m->b.grad());
      EXPECT_TRUE(torch::equal(torch::cat(got), want)) << name;
      EXPECT_EQ(h.sent_bytes(), dp::LowByteLayout::of(350, 3, opts.wire).sent_bytes(opts.wire)) << name;
    });
  }
}

TEST(LowByteHook, UnknownNameNamesTheChoices) {
  run_ranks(2, [&](dp::ProcessGroup& pg) {
    auto m = std::make_shared<ChosenGradsImpl>();
    dp::BucketedDdp ddp(pg, m, 25.0);
    try {
      dp::make_low_byte_hook("int4", pg, ddp, {});
      FAIL() << "int4 accepted";
    } catch (const dp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("unknown communication hook 'int4': use fp32, fp16-allreduce, bf16"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
