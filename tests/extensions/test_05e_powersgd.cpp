// Extension 05e's PowerSGD hook (extensions/05e_low_byte/powersgd.hpp): exact at full rank; error feedback's
// identity (what was applied plus what is still owed equals what the ranks produced), and the identity broken
// when error feedback is off; warm start converging to the best rank-r approximation; uncompressed parameters
// exact and every rank bit-identical; a real stage-05 DDP; misuse. Ranks are threads over a real Gloo group.
// Each bound is derived beside its check from u = 2^-24 (fp32's unit roundoff) and the magnitudes involved,
// with Higham's normwise product bound ||fl(A B) - A B||_F <= gamma_k ||A||_F ||B||_F (k: inner dimension).
#include "common/base/errors.hpp"
#include "common/comm/comm_hook.hpp"
#include "common/measure/tolerance.hpp"
#include "extensions/05e_low_byte/low_byte_hook.hpp"
#include "extensions/05e_low_byte/powersgd.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "tests/support/ranks.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using dp::BucketShapes;
using dp::PowerSgd;
using dp::PowerSgdOptions;
using dp::ProcessGroup;
using dp::testing::run_ranks;

const double u32 = dp::unit_roundoff(torch::kFloat32);  // 2^-24
const double u64 = dp::unit_roundoff(torch::kFloat64);  // 2^-53

// [numel] standard normal values from a generator of our own, seeded with `seed`: no global RNG to share
// between the threads that are the ranks.
torch::Tensor normal(int64_t numel, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn({numel}, gen, torch::kFloat);
}

int64_t total_numel(const std::vector<std::vector<int64_t>>& shapes) {
  int64_t total = 0;
  for (const auto& shape : shapes) total += c10::multiply_integers(shape);
  return total;
}

// The views of a flat bucket ([numel]) per parameter: [n, m] for a parameter with >= 2 dims (n = shape[0]),
// [numel] for the others.
std::vector<torch::Tensor> split(const torch::Tensor& flat, const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<torch::Tensor> views;
  int64_t offset = 0;
  for (const auto& shape : shapes) {
    const int64_t numel = c10::multiply_integers(shape);
    auto v = flat.narrow(0, offset, numel);
    views.push_back(shape.size() >= 2 ? v.view({shape[0], numel / shape[0]}) : v);
    offset += numel;
  }
  return views;
}

// One bucket through the hook, as stage 05 runs it: launch, then wait until the bucket holds the result.
void reduce(const dp::CommHook& hook, ProcessGroup& pg, torch::Tensor& bucket) {
  dp::BucketWork w = hook(pg, bucket, "test bucket");
  w.wait();
}

// Every rank's `t`, in rank order, stacked as float64 ([W, ...]).
torch::Tensor gathered(ProcessGroup& pg, const torch::Tensor& t) {
  return torch::stack(pg.all_gather(t.contiguous())).to(torch::kFloat64);
}

// How far PowerSGD's result for one compressed [n, m] matrix can be, in Frobenius norm, from P P^T S / W,
// S = sum over ranks of M_k, when P ([n, r]) is what its Gram-Schmidt returned. Sources, in order:
//   - P's columns orthonormal up to phi: ||P^T P - I||_2 <= phi. Two passes of Gram-Schmidt leave each pair of
//     columns a few roundings of an n-term inner product from orthogonal; phi = 2 r gamma_n counts r of them per
//     column, twice. Then P P^T = Pi + F with Pi an orthogonal projector and ||F||_2 <= phi.
//   - Q_k = fl(M_k^T P): gamma_n ||M_k||_F ||P||_F, ||P||_F <= sqrt(r (1 + phi)).
//   - the all-reduce of the Q_k: W - 1 additions, gamma_{W-1} sum_k ||M_k^T P||_F <= gamma_{W-1} sum_k ||M_k||_F
//     (1 + phi); then / W, one rounding u.
//   - fl(P Q^T): gamma_r ||P||_F ||Q||_F, ||Q||_F <= (1 + phi) sum_k ||M_k||_F / W.
// Each error of Q reaches the result through P (||P||_2 <= 1 + phi), and F reaches it as F S / W. Summed:
//   (phi + sqrt(r) (gamma_n + gamma_r) + gamma_{W-1} + u) (1 + phi)^2 sum_k ||M_k||_F / W.
double approximation_bound(int64_t n, int64_t r, int world, double sum_of_norms) {
  const double phi = 2.0 * r * dp::gamma_n(n, u32);
  const double relative = phi + std::sqrt(static_cast<double>(r)) * (dp::gamma_n(n, u32) + dp::gamma_n(r, u32)) +
                          (world > 1 ? dp::gamma_n(world - 1, u32) : 0.0) + u32;
  return relative * (1 + phi) * (1 + phi) * sum_of_norms / world;
}

// ---- Full rank ------------------------------------------------------------------------------------------

// With r = the smaller side n of every matrix (all wide or square here: n <= m), P is [n, n] and, orthonormal,
// spans everything: P P^T = I, so P (S^T P)^T / W = S / W, the exact average, whatever Q was. Tall matrices
// (m < n, r = m) are left out on purpose: there P spans S's columns only as well as fl(S Q) does, an error of
// about u times the condition number of S Q, which depends on the random Q and no bound here could state.
// Compression forced (min_compression_rate 0): at full rank r (n + m) >= n m, so the default test would send
// every matrix whole. Two buckets, 2 and 3 ranks, the 1-D parameters sent whole (bound: the sum's W - 1
// roundings and the division's one).
TEST(PowerSgd, FullRankIsExact) {
  const BucketShapes shapes = {{{4, 6}, {6}}, {{4, 2, 5}, {4, 4}, {5}}};
  for (int world : {2, 3})
    run_ranks(world, [&](ProcessGroup& pg) {
      PowerSgdOptions opts;
      opts.rank = 4;
      opts.min_compression_rate = 0;
      opts.error_feedback = false;
      auto state = std::make_shared<PowerSgd>(shapes, opts);
      auto hook = dp::powersgd_hook(state);
      const int W = pg.world_size();
      for (size_t b = 0; b < shapes.size(); ++b) {
        auto local = normal(total_numel(shapes[b]), 10 * b + pg.rank());
        auto bucket = local.clone();
        reduce(hook, pg, bucket);
        EXPECT_FALSE(state->error(b).defined()) << "no error memory without error feedback";
        const auto all = gathered(pg, local);  // [W, numel]
        const auto average = all.mean(0);
        const auto result = bucket.to(torch::kFloat64);
        const auto views = split(result, shapes[b]), expect = split(average, shapes[b]);
        for (size_t i = 0; i < shapes[b].size(); ++i) {
          double sum_of_norms = 0;
          for (int k = 0; k < W; ++k) sum_of_norms += split(all[k], shapes[b])[i].norm().item<double>();
          const bool matrix = shapes[b][i].size() >= 2;
          EXPECT_EQ(state->compressed(b, i), matrix);
          const double bound =
              matrix ? approximation_bound(views[i].size(0), opts.rank, W, sum_of_norms)
                     : (dp::gamma_n(W - 1, u32) + u32) * sum_of_norms / W;  // W - 1 additions, one division
          const double diff = (views[i] - expect[i]).norm().item<double>();
          EXPECT_LE(diff, bound) << fmt::format("W {} bucket {} parameter {}", W, b, i);
          if (pg.rank() == 0)
            fmt::print("full rank, W {}, bucket {} parameter {}: ||result - average||_F {:.3g} <= {:.3g}\n", W, b, i,
                       diff, bound);
        }
      }
    });
}

// Full rank on an average of lower rank: each of the 2 ranks' [4, 6] gradients has rank 1, so S and P = S Q have
// rank 2 and Gram-Schmidt's columns 3 and 4 cancel to rounding noise. One pass normalizes that noise into unit
// columns pointing anywhere, also along columns 1 and 2: P P^T is then no projector and the result is off by
// about the gradient's size. The second pass makes them orthonormal, P square orthogonal, P P^T = I to
// rounding: the result is the average within the same bound as above.
TEST(PowerSgd, FullRankIsExactForRankDeficientAverage) {
  const BucketShapes shapes = {{{4, 6}}};
  run_ranks(2, [&](ProcessGroup& pg) {
    PowerSgdOptions opts;
    opts.rank = 4;
    opts.min_compression_rate = 0;
    opts.error_feedback = false;
    auto state = std::make_shared<PowerSgd>(shapes, opts);
    auto hook = dp::powersgd_hook(state);
    const auto a = normal(4, 20 + pg.rank()), b = normal(6, 30 + pg.rank());
    auto local = torch::outer(a, b).reshape({-1});  // rank 1
    auto bucket = local.clone();
    reduce(hook, pg, bucket);
    const auto all = gathered(pg, local);
    const double sum_of_norms = all.norm(2, {1}).sum().item<double>();
    const double bound = approximation_bound(4, opts.rank, pg.world_size(), sum_of_norms);
    const double diff = (bucket.to(torch::kFloat64) - all.mean(0)).norm().item<double>();
    if (pg.rank() == 0) fmt::print("full rank, rank-2 average: ||result - average||_F {:.3g} <= {:.3g}\n", diff, bound);
    EXPECT_LE(diff, bound);
  });
}

// ---- Error feedback -------------------------------------------------------------------------------------

// Error feedback's bookkeeping. Rank k at step t sends M = g_t + e_{t-1} and keeps e_t = M - A_t, A_t the
// applied approximation (the same on every rank). Averaged over ranks and summed over t = 1..T it telescopes:
//   sum_t A_t = sum_t mean_k g_t - mean_k e_T   (e_0 = 0).
// In fp32, M = fl(g + e_{t-1}) errs by u |g + e_{t-1}| and e_t = fl(M - A_t) by u |e_t|: both enter the
// identity once, so per entry it holds within u sum_t (G_t + E_{t-1} + E_t) (G_t, E_t: the largest |g|, |e|
// over ranks and entries at step t). Uncompressed entries have e = 0 and A_t = fl(fl(sum_k g) / W): W - 1
// additions and a division, (gamma_{W-1} + u) G_t; so per step (gamma_{W-1} + u) G_t + u (E_{t-1} + E_t)
// covers both. The check's own float64 sums (T W gradients, T results, W errors) add gamma_{T(W+1)+W}(2^-53)
// times their magnitudes.
// Returns the largest |discrepancy| over the identity's entries, divided by that bound.
double identity_ratio(ProcessGroup& pg, bool error_feedback, int steps, double* discrepancy) {
  const BucketShapes shapes = {{{16, 12}, {5}}, {{6, 2, 5}}};  // [16, 12], a bias, [6, 10]: rank 1 compresses both
  PowerSgdOptions opts;
  opts.rank = 1;
  opts.error_feedback = error_feedback;
  auto state = std::make_shared<PowerSgd>(shapes, opts);
  auto hook = dp::powersgd_hook(state);
  const int W = pg.world_size();
  double worst = 0, bound_max = 0;
  for (size_t b = 0; b < shapes.size(); ++b) EXPECT_TRUE(state->compressed(b, 0));
  std::vector<torch::Tensor> applied(shapes.size()), produced(shapes.size());  // float64 sums over steps
  std::vector<double> bound(shapes.size(), 0.0), previous_e(shapes.size(), 0.0), magnitude(shapes.size(), 0.0);
  for (int t = 0; t < steps; ++t)
    for (size_t b = 0; b < shapes.size(); ++b) {
      auto g = normal(total_numel(shapes[b]), 1000 * t + 100 * b + pg.rank());
      auto bucket = g.clone();
      reduce(hook, pg, bucket);
      const auto all = gathered(pg, g);  // [W, numel]
      const double G = all.abs().max().item<double>();
      const auto e = state->error(b);
      const double E = e.defined() ? gathered(pg, e).abs().max().item<double>() : 0.0;
      bound[b] += (dp::gamma_n(W - 1, u32) + u32) * G + u32 * (previous_e[b] + E);
      magnitude[b] += 2 * G + E;
      previous_e[b] = E;
      const auto a = bucket.to(torch::kFloat64), mean = all.mean(0);
      applied[b] = t == 0 ? a : applied[b] + a;
      produced[b] = t == 0 ? mean : produced[b] + mean;
    }
  for (size_t b = 0; b < shapes.size(); ++b) {
    const auto e = state->error(b);
    const auto owed = e.defined() ? gathered(pg, e).mean(0) : torch::zeros_like(applied[b]);  // mean_k e_T
    const double fp64 = dp::gamma_n(steps * (W + 1) + W, u64) * magnitude[b];
    const double diff = (applied[b] - (produced[b] - owed)).abs().max().item<double>();
    worst = std::max(worst, diff / (bound[b] + fp64));
    bound_max = std::max(bound_max, bound[b] + fp64);
    if (discrepancy) *discrepancy = std::max(*discrepancy, diff);
  }
  if (pg.rank() == 0)
    fmt::print("error feedback {}: identity's largest |discrepancy| / bound {:.3g} (bound <= {:.3g})\n",
               error_feedback ? "on" : "off", worst, bound_max);
  return worst;
}

// 8 steps of random per-rank gradients at rank 1 (most of each gradient missed every step), 3 ranks: with error
// feedback the identity holds within its rounding bound.
TEST(PowerSgd, ErrorFeedbackIdentityHolds) {
  run_ranks(3, [](ProcessGroup& pg) {
    double diff = 0;
    EXPECT_LE(identity_ratio(pg, /*error_feedback=*/true, 8, &diff), 1.0);
  });
}

// The planted mistake: error feedback dropped. Nothing is owed (no memory), so the identity says everything
// produced was applied, and it is off by what rank 1 missed in 8 steps: of the order of the gradients
// themselves (about 1 per entry), more than 10^4 times the rounding bound (about 1e-6).
TEST(PowerSgd, ErrorFeedbackDroppedBreaksIdentity) {
  run_ranks(3, [](ProcessGroup& pg) {
    double diff = 0;
    const double ratio = identity_ratio(pg, /*error_feedback=*/false, 8, &diff);
    EXPECT_GT(ratio, 1e4);
    EXPECT_GT(diff, 0.1);
  });
}

// ---- Warm start ---------------------------------------------------------------------------------------

// The same G every step on both ranks, singular values 8, 6, 2, then 0.05 (a gap after the second), rank 2,
// no error feedback: each step is one step of subspace iteration from the last Q, so P's span approaches G's
// top-2 left singular vectors by a factor (2 / 6)^2 per step; after 6 steps (11 multiplications by G or G^T
// since the random start) it is 3^-11 = 5.6e-6 times the start's tangent away, and the error
// ||G - result||_F, whose excess over the best rank-2 error grows with that angle squared, is the best
// (sqrt of the sum of the squared singular values past the second, from float64 SVD) to rounding.
// Rounding: approximation_bound() with M_k = G on each of the W ranks (sum of norms W ||G||_F) bounds how far
// the result is from an exact orthogonal projection of G, whose error is >= the best; so
// best - tol <= error and, converged, error <= best + tol.
// The first step is checked to be measurably worse (> 100 tol above the best): from a random Q one
// multiplication leaves a visible part of the third singular direction in P.
TEST(PowerSgd, WarmStartConvergesToBestRankTwo) {
  run_ranks(2, [](ProcessGroup& pg) {
    const int64_t n = 24, m = 16;
    torch::Tensor G;
    {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(7);  // the same on both ranks
      auto U = std::get<0>(torch::linalg_qr(torch::randn({n, n}, gen, torch::kFloat64)));
      auto V = std::get<0>(torch::linalg_qr(torch::randn({m, m}, gen, torch::kFloat64)));
      auto s = torch::full({m}, 0.05, torch::kFloat64);
      s[0] = 8;
      s[1] = 6;
      s[2] = 2;
      G = torch::matmul(U.narrow(1, 0, m) * s, V.t()).to(torch::kFloat);  // [n, m]
    }
    const auto sv = torch::linalg_svdvals(G.to(torch::kFloat64));
    const double best = sv.narrow(0, 2, m - 2).norm().item<double>();
    PowerSgdOptions opts;
    opts.rank = 2;
    opts.error_feedback = false;
    auto state = std::make_shared<PowerSgd>(BucketShapes{{{n, m}}}, opts);
    auto hook = dp::powersgd_hook(state);
    ASSERT_TRUE(state->compressed(0, 0));
    const double tol = approximation_bound(n, opts.rank, pg.world_size(),
                                           pg.world_size() * G.to(torch::kFloat64).norm().item<double>());
    std::vector<double> errors;
    for (int t = 0; t < 6; ++t) {
      auto bucket = G.reshape({-1}).clone();
      reduce(hook, pg, bucket);
      errors.push_back((G.to(torch::kFloat64) - bucket.view({n, m}).to(torch::kFloat64)).norm().item<double>());
      EXPECT_GE(errors.back(), best - tol) << "step " << t;  // no rank-2 matrix does better
    }
    if (pg.rank() == 0)
      fmt::print("warm start: error per step {:.6g} ... {:.6g}, best rank 2 {:.6g}, tol {:.3g}\n", errors.front(),
                 errors.back(), best, tol);
    EXPECT_GT(errors.front() - best, 100 * tol) << "the first step was already converged: nothing to show";
    EXPECT_LE(errors.back(), best + tol);
  });
}

// A warm-start Q with a zero column is drawn again. A gradient that is zero everywhere (a layer not used in a step)
// makes P = 0, so Q = M^T P = 0: kept as it is, the next P = M Q would be zero too, and the matrix would be sent
// as zeros for good. Here the second step's gradient must come through (not all zeros).
TEST(PowerSgd, WarmStartRecoversFromZeroGradient) {
  run_ranks(2, [](ProcessGroup& pg) {
    PowerSgdOptions opts;
    opts.rank = 2;
    opts.error_feedback = false;
    auto state = std::make_shared<PowerSgd>(BucketShapes{{{16, 8}}}, opts);
    ASSERT_TRUE(state->compressed(0, 0));
    auto hook = dp::powersgd_hook(state);
    auto zero = torch::zeros({128});
    reduce(hook, pg, zero);
    EXPECT_EQ(zero.abs().max().item<float>(), 0.0f);
    auto bucket = normal(128, 40 + pg.rank());
    reduce(hook, pg, bucket);
    EXPECT_GT(bucket.abs().max().item<float>(), 0.0f) << "a zero Q kept the matrix at zero";
  });
}

// ---- Uncompressed parameters -----------------------------------------------------------------------------

// Biases, and a matrix too small to gain ([3, 2]: 6 elements < 2 x 2 x (3 + 2)), are sent whole: the fp32 sum
// over ranks, then / W. At 2 ranks with any values a + b is one rounding whatever the order, so the hook's
// result equals (g0 + g1) / 2 computed here, bit for bit; at 3 ranks the values lie on a grid where every sum
// is exact (multiples of 2^-10 in [-0.5, 0.5]: sums of three need at most 11 significant bits), so only the
// division rounds, as here. Two steps with error feedback on: the memory stays zero there (nothing missed),
// so the second step is exact too. The whole bucket, the compressed [16, 8] included, is bit-identical on
// every rank.
TEST(PowerSgd, UncompressedParametersAreExactAverage) {
  const std::vector<std::vector<int64_t>> shapes = {{10}, {16, 8}, {3, 2}, {7}};
  for (int world : {2, 3})
    run_ranks(world, [&](ProcessGroup& pg) {
      PowerSgdOptions opts;
      opts.rank = 2;
      auto state = std::make_shared<PowerSgd>(BucketShapes{shapes}, opts);
      auto hook = dp::powersgd_hook(state);
      EXPECT_FALSE(state->compressed(0, 0));
      EXPECT_TRUE(state->compressed(0, 1));
      EXPECT_FALSE(state->compressed(0, 2));
      EXPECT_FALSE(state->compressed(0, 3));
      const int W = pg.world_size();
      EXPECT_TRUE(torch::equal(state->error(0), torch::zeros({total_numel(shapes)}))) << "zeros before step 1";
      for (int t = 0; t < 2; ++t) {
        auto g = normal(total_numel(shapes), 100 * t + pg.rank());
        if (W != 2) g = torch::clamp(torch::round(g * 256), -512, 512) / 1024;  // the grid
        auto bucket = g.clone();
        reduce(hook, pg, bucket);
        const auto all = pg.all_gather(g);
        auto sum = all[0].clone();
        for (int k = 1; k < W; ++k) sum += all[k];
        const auto expect = split(sum / W, shapes), got = split(bucket, shapes);
        const auto error = split(state->error(0), shapes);
        for (size_t i : {0, 2, 3}) {
          EXPECT_TRUE(torch::equal(got[i], expect[i])) << fmt::format("W {} step {} parameter {}", W, t, i);
          EXPECT_EQ(error[i].abs().max().item<float>(), 0.0f) << "parameter " << i;
        }
        EXPECT_TRUE(dp::testing::same_on_all_ranks(pg, bucket)) << "W " << W << " step " << t;
      }
    });
}

// ---- With stage 05 ---------------------------------------------------------------------------------------

// A 2-layer MLP 16 -> 32 -> 8 ([32, 16], [32], [8, 32], [8]); 1 kB buckets put the weights in buckets of their
// own.
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// An MlpImpl drawn from `seed` (torch's generator is shared by the rank threads: held while drawing).
std::shared_ptr<MlpImpl> seeded_mlp(uint64_t seed) {
  std::lock_guard<std::mutex> lock(dp::testing::rng_mutex());
  torch::manual_seed(seed);
  return std::make_shared<MlpImpl>();
}

// Registered on a real BucketedDdp at 2 ranks, two steps of backward + finish: every gradient bit-identical on
// both ranks, fewer elements on the wire than the gradient has, and fc1's [32, 16] gradient of rank at most 2
// (the plain average of two ranks' 8 rows would have rank up to 16): PowerSGD's result, not the plain average.
TEST(PowerSgd, RunsUnderBucketedDdp) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = seeded_mlp(3 + pg.rank());  // different on each rank: the DDP broadcasts rank 0's
    dp::BucketedDdp ddp(pg, model, 0.001);   // 1 kB
    EXPECT_GE(ddp.bucket_count(), 2u) << ddp.describe_buckets();
    PowerSgdOptions opts;
    opts.rank = 2;
    auto state = std::make_shared<PowerSgd>(dp::bucket_shapes(ddp), opts);
    ddp.register_comm_hook(dp::powersgd_hook(state));
    int64_t numel = 0;
    for (const auto& p : ddp.parameters()) numel += p.numel();
    EXPECT_LT(state->wire_elements(), numel);
    for (int step = 0; step < 2; ++step) {
      ddp.on_train_batch_start();
      model->zero_grad();
      auto x = normal(8 * 16, 50 + 10 * step + pg.rank()).view({8, 16});
      model->forward(x).pow(2).mean().backward();
      ddp.finish_gradient_synchronization();
      for (size_t i = 0; i < ddp.parameters().size(); ++i) {
        const auto& grad = ddp.parameters()[i].grad();
        EXPECT_TRUE(dp::testing::same_on_all_ranks(pg, grad)) << ddp.parameter_names()[i] << " step " << step;
        EXPECT_TRUE(torch::isfinite(grad).all().item<bool>()) << ddp.parameter_names()[i];
      }
      // A rank-2 matrix's third singular value is rounding (u ||G||-sized), not a share of the first.
      const auto sv = torch::linalg_svdvals(model->fc1->weight.grad().to(torch::kFloat64));
      EXPECT_LE(sv[2].item<double>(), 1e-4 * sv[0].item<double>()) << "step " << step;
    }
    if (pg.rank() == 0)
      fmt::print("stage 05, {} buckets: {} elements on the wire per step for {} gradient elements\n",
                 ddp.bucket_count(), state->wire_elements(), numel);
  });
}

// start_powerSGD_iter (LowByteHookOptions::powersgd_start = 1): the first step is stage 05's fp32 all-reduce (the
// gradient keeps its full rank, and the bytes are a ring all-reduce's of every gradient), the second PowerSGD's
// (rank 2 again, and its own bytes).
TEST(PowerSgd, StartsAfterPlainSteps) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = seeded_mlp(3);
    dp::BucketedDdp ddp(pg, model, 0.001);
    dp::LowByteHookOptions opts;
    opts.powersgd_rank = 2;
    opts.powersgd_start = 1;
    auto hook = dp::make_low_byte_hook("powersgd", pg, ddp, opts);
    ddp.register_comm_hook(hook.hook);
    int64_t fp32_bytes = 0;  // a ring all-reduce of each bucket: 2 (W - 1) / W of its bytes, W = 2
    for (const auto& p : ddp.parameters()) fp32_bytes += 4 * p.numel();
    std::vector<int64_t> sent;
    std::vector<double> third;  // fc1's third singular value over its first, after each step
    for (int step = 0; step < 2; ++step) {
      ddp.on_train_batch_start();
      model->zero_grad();
      auto x = normal(8 * 16, 50 + 10 * step + pg.rank()).view({8, 16});
      model->forward(x).pow(2).mean().backward();
      ddp.finish_gradient_synchronization();
      const auto sv = torch::linalg_svdvals(model->fc1->weight.grad().to(torch::kFloat64));
      third.push_back(sv[2].item<double>() / sv[0].item<double>());
      sent.push_back(hook.sent_bytes());
    }
    EXPECT_GT(third[0], 1e-2) << "step 1 is plain fp32: the average of two ranks' full-rank gradients";
    EXPECT_LE(third[1], 1e-4) << "step 2 is PowerSGD at rank 2";
    EXPECT_EQ(sent[0], fp32_bytes) << "2 (W - 1) / W of each bucket's bytes: all of them at W = 2";
    EXPECT_LT(sent[1] - sent[0], sent[0]);
  });
}

// ---- Misuse ----------------------------------------------------------------------------------------------

// Expects `f` to throw dp::UsageError whose message contains every one of `parts`.
template <typename F>
void expect_usage_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "accepted";
  } catch (const dp::UsageError& e) {
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// Bucket 0: a bias and a [6, 5] matrix (smaller side 5); bucket 1: [4, 3, 3], a [4, 9] matrix (smaller side 4).
TEST(PowerSgd, MisuseIsRefused) {
  const BucketShapes shapes = {{{7}, {6, 5}}, {{4, 3, 3}}};
  PowerSgdOptions opts;
  opts.rank = 0;
  expect_usage_error([&] { PowerSgd s(shapes, opts); }, {"rank 0", "use a rank of at least 1"});
  opts.rank = 5;  // above 4, the smaller side of bucket 1's matrix
  expect_usage_error([&] { PowerSgd s(shapes, opts); },
                     {"rank 5", "bucket 1", "parameter 0", "[4, 3, 3]", "use a rank of at most 4"});
  opts.rank = 4;
  EXPECT_NO_THROW(PowerSgd(shapes, opts));
  opts.min_compression_rate = -1;
  expect_usage_error([&] { PowerSgd s(shapes, opts); }, {"-1"});

  // A bucket of the wrong numel: refused before anything is sent, and the count of calls does not advance
  // (the right bucket 0 still goes through). 1 rank: nothing to pair with.
  run_ranks(1, [&](ProcessGroup& pg) {
    PowerSgdOptions ok;
    ok.rank = 2;
    auto hook = dp::powersgd_hook(std::make_shared<PowerSgd>(shapes, ok));
    auto wrong = torch::zeros({36});  // bucket 0 holds 7 + 30 = 37
    EXPECT_THROW(hook(pg, wrong, "wrong"), std::logic_error);
    auto right = normal(37, 1);
    EXPECT_NO_THROW(reduce(hook, pg, right));
    auto second = torch::zeros({37});  // now bucket 1's turn: 36 elements
    EXPECT_THROW(hook(pg, second, "wrong"), std::logic_error);
  });
}

}  // namespace
