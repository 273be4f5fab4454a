// Tolerances from first principles (common/measure/tolerance.hpp): the unit roundoffs are what rounding does,
// the bounds hold for perturbations of the size they promise, and they fail for larger ones.
#include "common/measure/tolerance.hpp"

#include "common/harness/ddp_check.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>

namespace {

// u is the largest relative error of rounding to nearest: 1 + u ties to 1 (even), 1 + 2u is the next number.
TEST(UnitRoundoff, IsHalfTheGapAboveOne) {
  for (auto dtype : {torch::kFloat64, torch::kFloat32, torch::kFloat16, torch::kBFloat16}) {
    const double u = dp::unit_roundoff(dtype);
    auto one = torch::ones({1}, torch::TensorOptions().dtype(dtype));
    EXPECT_TRUE(torch::equal(one + u, one)) << c10::toString(dtype);
    EXPECT_FALSE(torch::equal(one + 2 * u, one)) << c10::toString(dtype);
    EXPECT_TRUE(torch::equal((one + 2 * u) - 2 * u, one)) << c10::toString(dtype);
  }
  EXPECT_EQ(dp::unit_roundoff(torch::kFloat32), std::ldexp(1.0, -24));
  EXPECT_EQ(dp::unit_roundoff(torch::kBFloat16), 1.0 / 256);
  EXPECT_THROW(dp::unit_roundoff(torch::kInt32), std::invalid_argument);
}

TEST(UnitRoundoff, GammaBoundsASumInAnyOrder) {
  EXPECT_DOUBLE_EQ(dp::gamma_n(10, 0.01), 0.1 / 0.9);
  EXPECT_THROW(dp::gamma_n(100, 0.01), std::invalid_argument);
  // 10,000 float32 numbers summed forwards, backwards and pairwise stay within gamma_n sum |x| of the
  // float64 sum.
  auto x = torch::randn({10000}, torch::kFloat64);
  const double exact = x.sum().item<double>(), abs_sum = x.abs().sum().item<double>();
  auto f = x.to(torch::kFloat32);
  float forward = 0, backward = 0;
  auto a = f.accessor<float, 1>();
  for (int64_t i = 0; i < f.numel(); ++i) forward += a[i];
  for (int64_t i = f.numel() - 1; i >= 0; --i) backward += a[i];
  // The float64 values rounded to float32 first: one more rounding per term (n + 1).
  const double bound = dp::gamma_n(f.numel() + 1, dp::unit_roundoff(torch::kFloat32)) * abs_sum;
  for (double s : {double(forward), double(backward), f.sum().item<double>()}) EXPECT_LE(std::abs(s - exact), bound);
}

TEST(SgdWeightBound, ClosedForms) {
  // Plain SGD, 3 steps: the differences add up, 3 lr dg, plus 3 ulps of the weight.
  EXPECT_DOUBLE_EQ(dp::sgd_weight_bound(0.1, 0, 3, 1e-3, 0), 3 * 0.1 * 1e-3);
  // Momentum 0.5, 2 steps: velocities 1 and 1.5: without resync 2.5 lr dg, with resync 1.5 lr dg.
  EXPECT_DOUBLE_EQ(dp::sgd_weight_bound(1, 0.5, 2, 1, 0), 2.5);
  EXPECT_DOUBLE_EQ(dp::sgd_weight_bound(1, 0.5, 2, 1, 0, true), 1.5);
  EXPECT_DOUBLE_EQ(dp::sgd_weight_bound(0, 0, 2, 0, 1), 2 * 2 * dp::unit_roundoff(torch::kFloat32));
}

// Two AdamW runs whose gradients differ by at most dg per entry end within AdamWeightBound of each other;
// a perturbation 30 times larger does not (the bound is no blanket).
TEST(AdamWeightBound, HoldsForItsPerturbationAndNotForALargerOne) {
  torch::manual_seed(1);
  const double lr = 1e-2, dg = 1e-4;
  auto run = [&](double scale, dp::AdamWeightBound* bound) {
    torch::manual_seed(2);
    auto w = torch::randn({1000}).requires_grad_(true);
    torch::optim::AdamW opt({w}, torch::optim::AdamWOptions(lr).weight_decay(0.1));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    for (int s = 0; s < 5; ++s) {
      opt.zero_grad();
      auto g = torch::randn({1000}, gen) * 1e-2;
      auto noise = (torch::rand({1000}, gen) * 2 - 1) * dg * scale;
      w.mutable_grad() = g + noise;
      if (bound) {
        w.mutable_grad() = g;  // the reference's own gradient
        bound->add_step({w}, dg);
        w.mutable_grad() = g + noise;
      }
      opt.step();
    }
    return w.detach().clone();
  };
  dp::AdamWeightBound bound(lr, 0.999, 1e-8);
  auto reference = run(0, &bound);
  EXPECT_LE(bound.worst_ratio({run(1, nullptr)}, {reference}), 1.0);
  EXPECT_GT(bound.worst_ratio({run(30, nullptr)}, {reference}), 1.0);
}

// The verdict line every check prints (dp::report_margin()): the one form scripts/checks/margins.py reads, FAIL
// when the difference is over its bound, the derivation inside the parentheses when there is one.
TEST(MarginReport, WritesTheVerdictLineMarginsPyReads) {
  ::testing::internal::CaptureStdout();
  EXPECT_TRUE(dp::report_margin(dp::Margin(5e-8, 1e-7, "lr 0.1 x 3 steps x u(fp32)"), "toy check"));
  EXPECT_FALSE(dp::report_margin(dp::Margin(2e-7, 1e-7), "tied check"));
  EXPECT_EQ(::testing::internal::GetCapturedStdout(),
            "PASS toy check: max |diff| 5e-08 <= 1e-07 (ratio 0.50; bound = lr 0.1 x 3 steps x u(fp32))\n"
            "FAIL tied check: max |diff| 2e-07 <= 1e-07 (ratio 2.00)\n");
}

// max_param_diff() compares two models parameter by parameter: the largest |a - b|, and an error, not a
// number, for models that do not match (before, a [3] against a [1] broadcast, and fewer parameters on
// one side read past its end).
TEST(MaxParamDiff, IsTheLargestDifferenceAndRefusesModelsThatDoNotMatch) {
  torch::nn::Linear a(3, 2), b(3, 2);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : a->parameters()) p.fill_(0.5);
    for (auto& p : b->parameters()) p.fill_(0.5);
    b->bias[1].fill_(0.75);  // |0.5 - 0.75| is exact in fp32
  }
  EXPECT_DOUBLE_EQ(dp::max_param_diff(*a, *b), 0.25);
  torch::nn::Linear wider(3, 4), no_bias(torch::nn::LinearOptions(3, 2).bias(false));
  EXPECT_THROW(dp::max_param_diff(*a, *wider), dp::CheckFailed);
  EXPECT_THROW(dp::max_param_diff(*a, *no_bias), dp::CheckFailed);
  EXPECT_THROW(dp::max_param_diff(*no_bias, *a), dp::CheckFailed);
}

}  // namespace
