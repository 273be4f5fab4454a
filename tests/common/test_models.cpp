// Unit tests for common/models, common/transformer, common/accounting and common/data (single process, CPU).
#include "common/dist/runtime.hpp"
#include "common/measure/accounting.hpp"
#include "common/measure/tolerance.hpp"
#include "common/model/data.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/expect.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using dp::UsageError;

// Expects `fn` to throw dp::UsageError whose message contains every string in `needles`.
using dp::testing::expect_usage_error;

// --- Toy models ---------------------------------------------------------------------------------

TEST(ToyModel, ParameterNamesShapesAndRequiresGradInOrder) {
  dp::ToyModel model;
  struct Row {
    std::string name;
    std::vector<int64_t> shape;
    bool requires_grad;
  };
  // LibTorch (like PyTorch) lists a module's own parameters before its children's.
  const std::vector<Row> expected = {{"no_grad_fixed_param", {2}, false},
                                     {"fc1.weight", {10, 10}, true},
                                     {"fc2.fc.weight", {50, 10}, true},
                                     {"fc2.fc.bias", {50}, false},
                                     {"fc3.weight", {5, 50}, true}};
  auto named = model->named_parameters();
  ASSERT_EQ(named.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(named[i].key(), expected[i].name);
    EXPECT_EQ(named[i].value().sizes().vec(), expected[i].shape) << expected[i].name;
    EXPECT_EQ(named[i].value().requires_grad(), expected[i].requires_grad) << expected[i].name;
  }
  EXPECT_TRUE(torch::equal(model->no_grad_fixed_param, torch::tensor({2.0f, 2.0f})));
  EXPECT_EQ(dp::count_elements(dp::unique_parameters(*model, /*trainable_only=*/true)), 850);
}

TEST(ToyModel, FrozenAndUnusedParametersGetNoGradient) {
  dp::ToyModel model;
  auto [x, y] = dp::regression_batch(20, dp::kToyIn, dp::kToyOut, 1);
  torch::mse_loss(model(x), y).backward();
  for (const auto& [name, p] : dp::unique_named_parameters(*model)) {
    EXPECT_EQ(p.grad().defined(), p.requires_grad()) << name;
  }
}

TEST(ToyMLP, ShapesAndCount) {
  dp::ToyMLP mlp;
  EXPECT_EQ(mlp->parameters().size(), 6u);
  EXPECT_EQ(dp::count_elements(dp::unique_parameters(*mlp)), 10 * 20 + 20 + 20 * 20 + 20 + 20 * 5 + 5);
  EXPECT_EQ(mlp(torch::randn({7, 10})).sizes().vec(), (std::vector<int64_t>{7, 5}));
}

TEST(TiedModel, LibTorchListsTheSharedWeightTwiceUniqueParametersOnce) {
  dp::ToyModelWithTiedWeights model;
  EXPECT_EQ(model->named_parameters().size(), 5u);
  auto unique = dp::unique_named_parameters(*model);
  ASSERT_EQ(unique.size(), 4u);
  EXPECT_EQ(unique[0].first, "fc1.weight");
  EXPECT_EQ(unique[1].first, "fc2.weight");
  EXPECT_EQ(unique[2].first, "fc3.weight");
  EXPECT_EQ(unique[3].first, "fc5.weight");
  EXPECT_EQ(dp::count_elements(dp::unique_parameters(*model)), 1350);
  // One tensor, not two tensors with equal values: same TensorImpl, same storage.
  EXPECT_EQ(model->fc4->weight.unsafeGetTensorImpl(), model->fc2->weight.unsafeGetTensorImpl());
  EXPECT_EQ(model->fc4->weight.data_ptr(), model->fc2->weight.data_ptr());
}

TEST(TiedModel, SharedGradientIsTheSumOfBothUses) {
  dp::ToyModelWithTiedWeights model;
  auto [x, y] = dp::regression_batch(20, dp::kToyIn, dp::kToyOut, 2);
  torch::mse_loss(model(x), y).backward();

  // The same network with the shared weight replaced by two independent leaf copies.
  auto leaf = [](const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); };
  auto w1 = leaf(model->fc1->weight), w2a = leaf(model->fc2->weight), w3 = leaf(model->fc3->weight);
  auto w2b = leaf(model->fc2->weight), w5 = leaf(model->fc5->weight);
  namespace F = torch::nn::functional;
  auto h = torch::relu(F::linear(x, w1));
  h = torch::relu(F::linear(h, w2a));
  h = torch::relu(F::linear(h, w3));
  h = torch::relu(F::linear(h, w2b));
  torch::mse_loss(F::linear(h, w5), y).backward();

  ASSERT_TRUE(model->fc2->weight.grad().defined());
  EXPECT_GT(w2a.grad().abs().sum().item<double>(), 0);
  EXPECT_GT(w2b.grad().abs().sum().item<double>(), 0);
  // The same ops on the same numbers: the tied weight's gradient is the sum of its two uses, added once
  // more by autograd (one rounding: u(fp32) |a + b| <= u (|a| + |b|)); fc1's is the same computation.
  const double u = dp::unit_roundoff(torch::kFloat32);
  auto sum = w2a.grad() + w2b.grad();
  EXPECT_TRUE(
      ((model->fc2->weight.grad() - sum).abs() <= u * (w2a.grad().abs() + w2b.grad().abs())).all().item<bool>());
  EXPECT_TRUE(((model->fc1->weight.grad() - w1.grad()).abs() <= u * w1.grad().abs()).all().item<bool>());
}

TEST(ToyModels, SameSeedSameValuesAndUnknownNameThrows) {
  for (const auto& name : dp::toy_model_names()) {
    torch::manual_seed(7);
    auto a = dp::make_toy_model(name);
    torch::manual_seed(7);
    auto b = dp::make_toy_model(name);
    auto pa = dp::unique_parameters(*a), pb = dp::unique_parameters(*b);
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << name << " " << i;
    EXPECT_EQ(a->forward(torch::randn({3, dp::kToyIn})).sizes().vec(), (std::vector<int64_t>{3, dp::kToyOut}));
  }
  expect_usage_error([] { dp::make_toy_model("resnet"); }, {"resnet", "mlp", "toy", "tied"});
}

// --- Transformer ----------------------------------------------------------------------------------

TEST(TransformerConfig, ClosedFormCountMatchesBuiltModels) {
  for (const char* name : {"nano", "tiny", "small"}) {
    auto cfg = dp::TransformerConfig::preset(name, 64);
    dp::TransformerLM lm(cfg);
    auto params = dp::unique_parameters(*lm);
    EXPECT_EQ(dp::count_elements(params), cfg.num_parameters()) << name;
    EXPECT_EQ(int64_t(params.size()), cfg.num_parameter_tensors()) << name;
  }
  auto nano = dp::TransformerConfig::preset("nano", 32);  // the end-to-end tests' model, on bytes (vocabulary 256)
  nano.vocab_size = 256;
  EXPECT_EQ(nano.num_parameters(), 164160);
  EXPECT_EQ(dp::TransformerConfig::preset("small").num_parameters(), 128625408);
  EXPECT_EQ(dp::TransformerConfig::preset("xl").num_parameters(), 1998235200);
  EXPECT_EQ(dp::TransformerConfig::preset("2.7b").num_parameters(), 3406809600);
  EXPECT_EQ(dp::TransformerConfig::preset("xl").d_head(), 64);
  EXPECT_EQ(dp::fp32_training_bytes(1000).total(), 16000);
}

// common/measure/accounting.cpp and scripts/pages/accounting.py (which docs/accounting.md quotes) are two writings of
// the same formulas: for every preset at 1, 2, 3, 4 and 8 ranks, both give the same parameter count,
// memory per device and bytes sent per step. The values are sums of products of integers below 2^53 with
// (N-1)/N, so they agree to a few ulps (relative 1e-12 leaves room for the order of operations).
TEST(Accounting, MatchesScript) {
  const std::string cmd = std::string("python3 ") + DP_SOURCE_DIR + "/scripts/pages/accounting.py --json";
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    ASSERT_EQ(pclose(f), 0) << cmd;
  }
  const auto rows = nlohmann::json::parse(out);
  ASSERT_EQ(rows.size(), 30u) << "6 presets x 5 world sizes";
  auto near = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(b)); };
  for (const auto& r : rows) {
    const auto cfg = dp::TransformerConfig::preset(r["preset"].get<std::string>());
    const int64_t P = cfg.num_parameters();
    const int N = r["world"].get<int>();
    const auto& s = r["rows"];
    const std::string at = fmt::format("{} at N = {}", cfg.name, N);
    EXPECT_EQ(P, r["params"].get<int64_t>()) << at;
    EXPECT_TRUE(near(dp::fp32_training_bytes(P).total(), s["DDP"][0])) << at;
    EXPECT_TRUE(near(dp::ddp_bytes_per_step(P, N), s["DDP"][1])) << at;
    EXPECT_TRUE(near(dp::zero1_expected_bytes(P, N).total(), s["ZeRO-1"][0])) << at;
    EXPECT_TRUE(near(dp::zero1_bytes_per_step(P, N), s["ZeRO-1"][1])) << at;
    EXPECT_TRUE(near(dp::zero1_expected_bytes(P, N).total(), s["ZeRO-1 (CS336 design)"][0])) << at;
    EXPECT_TRUE(near(dp::cs336_bytes_per_step(P, N), s["ZeRO-1 (CS336 design)"][1])) << at;
    EXPECT_TRUE(near(dp::fsdp_expected_bytes(P, N).total(), s["ZeRO-3 / FSDP"][0])) << at;
    EXPECT_TRUE(near(dp::fsdp_bytes_per_step(P, N), s["ZeRO-3 / FSDP"][1])) << at;
    EXPECT_TRUE(near(dp::fsdp_bytes_per_step(P, N, 2), s["ZeRO-3 / FSDP, bf16 gathers"][1])) << at;
    if (N % 2 == 0) {  // two tiers: 2 nodes of N/2 ranks, 3 micro-batches
      ASSERT_EQ(r["uplink"].size(), 6u) << at;
      for (const auto& [scheme, bytes] : r["uplink"].items())
        EXPECT_TRUE(near(dp::uplink_bytes_per_step(scheme, P, 2, N / 2, 3), bytes.get<double>()))
            << at << ", " << scheme;
    }
  }
  // Two tiers at one point: 2 nodes x 2 ranks, 1000 parameters (4000 bytes), 3 micro-batches.
  EXPECT_DOUBLE_EQ(dp::uplink_bytes_per_step("DDP, flat ring", 1000, 2, 2, 3), 1.5 * 4000);
  EXPECT_DOUBLE_EQ(dp::uplink_bytes_per_step("HSDP", 1000, 2, 2, 3), 4000);
  EXPECT_DOUBLE_EQ(dp::uplink_bytes_per_step("HSDP, every micro-batch", 1000, 2, 2, 3), 3 * 4000);
  EXPECT_DOUBLE_EQ(dp::uplink_bytes_per_step("FSDP, flat", 1000, 2, 2, 3), 9 * 4000);
  // Closed forms at one point, so that a formula changed in both places at once is still caught.
  EXPECT_EQ(dp::zero1_expected_bytes(1000, 4).total(), 4000 + 4000 + 2000);
  EXPECT_EQ(dp::fsdp_expected_bytes(1000, 4).total(), 4000);
  EXPECT_DOUBLE_EQ(dp::ddp_bytes_per_step(1000, 4), 2 * 0.75 * 4000);
  EXPECT_DOUBLE_EQ(dp::cs336_bytes_per_step(1000, 4), 3 * 0.75 * 4000);
  EXPECT_DOUBLE_EQ(dp::fsdp_bytes_per_step(1000, 4, 2), 0.75 * (4000 + 4000));
}

// The estimate behind the memory refusals (stage 08, stage 09, extension 07a): its closed forms at one point,
// and the order of the designs that the refusals' remedies rely on (sharding more needs less).
TEST(Accounting, PeakTrainingBytes) {
  auto m = dp::TransformerConfig::preset("small", 128);
  m.vocab_size = 256;
  const double P = static_cast<double>(m.num_parameters()), act = dp::activation_bytes(m, 8, 128);
  EXPECT_DOUBLE_EQ(dp::peak_training_bytes(m, "ddp", 4, 8), 20 * P + act);
  EXPECT_DOUBLE_EQ(dp::peak_training_bytes(m, "zero1", 4, 8), 12 * P + 3 * P + act);
  EXPECT_DOUBLE_EQ(dp::peak_training_bytes(m, "ddp", 4, 8, 2), 20 * P + dp::activation_bytes(m, 8, 128, 2));
  const double ddp = dp::peak_training_bytes(m, "ddp", 4, 8), zero1 = dp::peak_training_bytes(m, "zero1", 4, 8);
  const double keep = dp::peak_training_bytes(m, "fsdp-keep", 4, 8), fsdp = dp::peak_training_bytes(m, "fsdp", 4, 8);
  EXPECT_GT(ddp, zero1);
  EXPECT_GT(zero1, keep);
  EXPECT_GT(keep, fsdp);
  EXPECT_GT(fsdp, 4 * P + act);  // 16P/4 of shards, and the gathered units beside them
  EXPECT_LT(dp::peak_training_bytes(m, "fsdp", 8, 8), fsdp);
  EXPECT_THROW(dp::peak_training_bytes(m, "zero3", 4, 8), std::invalid_argument);
}

TEST(TransformerConfig, UnknownPresetThrowsUsageError) {
  expect_usage_error([] { dp::TransformerConfig::preset("huge"); }, {"huge", "tiny", "small", "xl", "2.7b"});
  auto desc = dp::describe(dp::TransformerConfig::preset("xl"));
  EXPECT_NE(desc.find("xl"), std::string::npos) << desc;
  EXPECT_NE(desc.find("1,998,235,200"), std::string::npos) << desc;
}

TEST(TransformerLM, LogitsShapeAndParameterOrder) {
  auto cfg = dp::TransformerConfig::preset("tiny", 32);
  dp::TransformerLM lm(cfg);
  auto [x, y] = dp::token_batch(2, 32, cfg.vocab_size, 0, 0);
  auto logits = lm(x);
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 32, cfg.vocab_size}));
  auto named = dp::unique_named_parameters(*lm);
  EXPECT_EQ(named.front().first, "token_embeddings.weight");
  EXPECT_EQ(named[1].first, "layers.0.attn.q_proj.weight");
  EXPECT_EQ(named[9].first, "layers.0.ln2.weight");
  EXPECT_EQ(named.back().first, "lm_head.weight");
  expect_usage_error([&] { lm(torch::zeros({1, 33}, torch::kLong)); }, {"32"});
}

TEST(TransformerLM, LaterTokensDoNotChangeEarlierLogits) {
  torch::NoGradGuard no_grad;
  auto cfg = dp::TransformerConfig::preset("tiny", 16);
  cfg.vocab_size = 97;
  dp::TransformerLM lm(cfg);
  auto [x, y] = dp::token_batch(1, 16, cfg.vocab_size, 3, 0);
  const int64_t t = 9;
  auto x2 = x.clone();
  x2[0][t] = (x[0][t].item<int64_t>() + 1) % cfg.vocab_size;
  auto a = lm(x), b = lm(x2);
  // Earlier positions see the later tokens only through attention weights that the mask makes exactly 0:
  // the same shapes, the same kernels, zeros added: bit for bit.
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, t), b.narrow(1, 0, t)));
  // Position t's own logits move by far more than rounding (1,000 ulps of the largest logit).
  const double u = dp::unit_roundoff(torch::kFloat32);
  EXPECT_GT((a.narrow(1, t, 1) - b.narrow(1, t, 1)).abs().max().item<double>(),
            1000 * u * a.abs().max().item<double>());
}

TEST(Rope, RotatesInterleavedPairsAndDependsOnlyOnRelativePosition) {
  const int64_t dh = 8;
  // Position 0 is the identity; position p turns pair (0, 1) by p radians (its frequency is theta^0).
  auto e0 = torch::zeros({1, 1, 1, dh});
  e0[0][0][0][0] = 1.0;
  EXPECT_TRUE(torch::allclose(dp::apply_rope(e0, torch::tensor({0L})), e0));
  auto r = dp::apply_rope(e0, torch::tensor({3L})).flatten();
  // fp32 cos and sin of an angle p * theta^0: the angle rounds (error <= u p, and |d cos / d angle| <= 1),
  // the library's result is within an ulp (2u), and the rotation's products and sums round twice more.
  const double u = dp::unit_roundoff(torch::kFloat32);
  const double trig = (3.0 + 2 + 2) * u;
  EXPECT_NEAR(r[0].item<double>(), std::cos(3.0), trig);
  EXPECT_NEAR(r[1].item<double>(), std::sin(3.0), trig);
  EXPECT_EQ(r.narrow(0, 2, dh - 2).abs().sum().item<double>(), 0.0);  // zeros rotate to zeros, exactly

  torch::manual_seed(0);
  auto q = torch::randn({1, 1, 1, dh}), k = torch::randn({1, 1, 1, dh});
  auto score = [&](int64_t m, int64_t n) {
    auto qm = dp::apply_rope(q, torch::tensor({m})), kn = dp::apply_rope(k, torch::tensor({n}));
    return (qm * kn).sum().item<double>();
  };
  // A score depends on m - n alone, up to rounding: each angle p theta^i rounds (u p, at most 49 here) and
  // its cos and sin round (2u); the rotation rounds twice; the dot product of dh terms rounds (gamma_dh). All
  // relative to |q| |k|, the largest a score can be: (2 (49 + 2 + 2) + dh) u |q| |k|.
  const double qk = (q.norm() * k.norm()).item<double>();
  const double shift_bound = (2.0 * (49 + 2 + 2) + dh) * u * qk;
  for (int64_t shift : {1, 5, 40}) {
    EXPECT_NEAR(score(7, 3), score(7 + shift, 3 + shift), shift_bound);
    EXPECT_NEAR(score(2, 9), score(2 + shift, 9 + shift), shift_bound);
  }
  EXPECT_GT(std::abs(score(7, 3) - score(7, 4)), 100 * shift_bound);  // another distance: another score
  // A rotation keeps the norm: rounding of the angles (11 u), cos and sin (2u), the rotation (2u) and the
  // norm's sum of dh squares (gamma_dh) is all that can move it.
  EXPECT_NEAR(dp::apply_rope(q, torch::tensor({11L})).norm().item<double>(), q.norm().item<double>(),
              (11 + 2 + 2 + dh) * u * q.norm().item<double>());
}

TEST(TransformerLM, LossDecreasesWithAdam) {
  torch::manual_seed(0);
  auto cfg = dp::TransformerConfig::preset("tiny", 16);
  cfg.vocab_size = 1000;  // the tiny shape with a smaller vocabulary keeps the test fast
  dp::TransformerLM lm(cfg);
  auto [x, y] = dp::token_batch(4, 16, cfg.vocab_size, 5, 0);
  torch::optim::Adam opt(dp::unique_parameters(*lm), torch::optim::AdamOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    auto loss = dp::lm_loss(lm(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  // Small initial logits: the first loss is close to ln(V), the loss of a uniform guess.
  EXPECT_NEAR(first, std::log(double(cfg.vocab_size)), 1.0);
  // Twenty steps on one fixed batch: memorising it should at least halve the loss.
  EXPECT_LT(last, 0.5 * first);
}

// --- Data -----------------------------------------------------------------------------------------

TEST(Data, TokenBatchIsDeterministicShiftedAndLeavesGlobalRngAlone) {
  auto [x, y] = dp::token_batch(3, 10, 50, 42, 7);
  auto [x2, y2] = dp::token_batch(3, 10, 50, 42, 7);
  auto [x3, y3] = dp::token_batch(3, 10, 50, 42, 8);
  EXPECT_EQ(x.sizes().vec(), (std::vector<int64_t>{3, 10}));
  EXPECT_EQ(x.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(x, x2) && torch::equal(y, y2));
  EXPECT_FALSE(torch::equal(x, x3));
  EXPECT_TRUE(torch::equal(x.narrow(1, 1, 9), y.narrow(1, 0, 9)));
  EXPECT_GE(x.min().item<int64_t>(), 0);
  EXPECT_LT(x.max().item<int64_t>(), 50);

  torch::manual_seed(1);
  auto before = torch::rand({4});
  torch::manual_seed(1);
  dp::token_batch(3, 10, 50, 42, 7);
  EXPECT_TRUE(torch::equal(before, torch::rand({4})));
}

TEST(Data, ShardRowsIsDisjointAndCovering) {
  auto global = torch::arange(24).reshape({12, 2});
  std::vector<torch::Tensor> shards;
  for (int r = 0; r < 3; ++r) shards.push_back(dp::shard_rows(global, r, 3));
  EXPECT_TRUE(torch::equal(torch::cat(shards), global));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(shards[r].size(0), 4);
    EXPECT_EQ(shards[r][0][0].item<int64_t>(), r * 8);  // rank r starts at row 4r
  }
  expect_usage_error([&] { dp::shard_rows(torch::zeros({10, 2}), 0, 3); }, {"10", "3"});
  expect_usage_error([&] { dp::shard_rows(global, 3, 3); }, {"rank 3"});
}

TEST(Data, RegressionBatchIsDeterministic) {
  auto [x, y] = dp::regression_batch(20, 10, 5, 9);
  auto [x2, y2] = dp::regression_batch(20, 10, 5, 9);
  auto [x3, y3] = dp::regression_batch(20, 10, 5, 10);
  EXPECT_EQ(y.sizes().vec(), (std::vector<int64_t>{20, 5}));
  EXPECT_TRUE(torch::equal(x, x2) && torch::equal(y, y2));
  EXPECT_FALSE(torch::equal(x, x3));
}

}  // namespace
