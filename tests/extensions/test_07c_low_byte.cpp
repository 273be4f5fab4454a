// Extension 07c's sharded collectives in fewer bytes (common/comm/low_byte.hpp) and the FSDP that uses them
// (extensions/07c_low_byte/low_byte_fsdp.hpp): the reduce-scatter and the all-gather over 2, 3 and 4 ranks equal
// their one-process models bit for bit, lie within their derived bounds and send the bytes they say; through
// stage 07's seams a unit's shard gradient is the model's average of what every rank reduce-scattered, and its
// forward sees the model's rounding of the master weights; the planted mistakes break the bounds: 16-bit sums, and
// one int8 scale over a span that crosses two ranks' shards. Ranks are threads over a real Gloo group.
#include "common/base/errors.hpp"
#include "common/comm/low_byte.hpp"
#include "common/comm/shard_comm.hpp"
#include "common/model/models.hpp"
#include "extensions/07c_low_byte/low_byte_fsdp.hpp"
#include "stages/06_sharded_opt/zero1_optimizer.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

using dp::LowByteOptions;
using dp::SumIn;
using dp::WireSpec;
using dp::testing::rng_mutex;
using dp::testing::run_ranks;

WireSpec spec(const std::string& name, int64_t block = 64) { return dp::parse_wire_format(name, block); }

// W buffers of W x n values, N(0, 1) times (k + 1) for rank k, block b of each times 10^(2 - b % 5): magnitudes
// that differ block by block, so that where a scale's block ends matters.
std::vector<torch::Tensor> buffers(int W, int64_t n, uint64_t seed) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  auto decade = torch::arange(W * n, torch::kLong).div(64, "floor").remainder(5).to(torch::kFloat);
  std::vector<torch::Tensor> out;
  for (int k = 0; k < W; ++k) out.push_back(torch::randn({W * n}) * (k + 1) * torch::pow(10.0, 2.0 - decade));
  return out;
}

torch::Tensor exact_average(const std::vector<torch::Tensor>& xs) {
  auto acc = torch::zeros_like(xs[0], torch::kDouble);
  for (const auto& x : xs) acc += x.to(torch::kDouble) / static_cast<double>(xs.size());
  return acc;
}

int64_t outside(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& bound) {
  return ((got.to(torch::kDouble) - want.to(torch::kDouble)).abs() > bound.to(torch::kDouble)).sum().item<int64_t>();
}

// A chunk of 100 values is not a multiple of the block (64): each chunk is encoded in two blocks, the second padded.
TEST(LowByteReduceScatter, EqualsTheModelWithinTheBoundAndSendsItsBytes) {
  const int64_t n = 100;
  for (int W : {2, 3, 4})
    for (const char* f : {"bf16", "fp16", "int8"}) {
      const LowByteOptions opts{spec(f), SumIn::fp32};
      const auto xs = buffers(W, n, 10 + W);
      const auto model = dp::low_byte_scatter_average(xs, opts);
      const auto bound = dp::low_byte_scatter_bound(xs, opts.wire);
      EXPECT_EQ(outside(model, exact_average(xs), bound), 0) << f << " at " << W;
      run_ranks(W, [&](dp::ProcessGroup& pg) {
        const int r = pg.rank();
        auto out = torch::empty({n});
        auto flat = xs[r].clone();
        auto work = dp::low_byte_reduce_scatter_async(pg, flat, out, opts, "test");
        flat.fill_(1e30);  // encoded already: the buffer is free once the call returns
        work.wait();
        out.div_(W);
        EXPECT_TRUE(torch::equal(out, model.narrow(0, r * n, n))) << f << " at " << W << ", rank " << r;
      });
    }
  EXPECT_EQ(dp::chunk_wire_bytes(spec("int8"), 100), 128 + 2 * 4);  // two blocks, the second padded, two scales
  EXPECT_EQ(dp::chunk_wire_bytes(spec("bf16"), 100), 200);
}

// The design's fp32 sums against the mistake: fp16 pieces summed in fp16, 2048 + 0.9 + 0.9 + 0.9, where fp16's
// step at 2048 is 2: each 0.9 is lost. The fp32 sums hold the bound; the fp16 sums miss it on every value.
TEST(LowByteReduceScatter, SumsInSixteenBitsBreakTheBound) {
  const int W = 4;
  const int64_t n = 16;
  std::vector<torch::Tensor> xs{torch::full({W * n}, 2048.0f)};
  for (int k = 1; k < W; ++k) xs.push_back(torch::full({W * n}, 0.9f));
  const auto bound = dp::low_byte_scatter_bound(xs, spec("fp16"));
  const auto exact = exact_average(xs);
  EXPECT_EQ(outside(dp::low_byte_scatter_average(xs, {spec("fp16"), SumIn::fp32}), exact, bound), 0);
  EXPECT_EQ(outside(dp::low_byte_scatter_average(xs, {spec("fp16"), SumIn::wire}), exact, bound), W * n);
  run_ranks(W, [&](dp::ProcessGroup& pg) {
    auto out = torch::empty({n});
    auto flat = xs[pg.rank()].clone();
    dp::low_byte_reduce_scatter_async(pg, flat, out, {spec("fp16"), SumIn::wire}, "mistake").wait();
    out.div_(W);
    EXPECT_EQ(outside(out, exact.narrow(0, pg.rank() * n, n), bound.narrow(0, pg.rank() * n, n)), n);
  });
  EXPECT_THROW(dp::low_byte_scatter_average(xs, {spec("int8"), SumIn::wire}), std::invalid_argument);
}

// Every rank ends with the same values: its own chunk decoded from the same encoding as the others'. In bf16 the
// decoded fp32 values are then cast, as a unit gathered for bf16 compute is.
TEST(LowByteAllGather, EqualsTheModelOnEveryRankWithinOneRounding) {
  const int64_t n = 100;
  for (int W : {2, 3})
    for (const char* f : {"bf16", "fp16", "int8"}) {
      const auto whole = buffers(W, n, 3)[1];
      const auto model = dp::low_byte_gathered(whole, W, spec(f));
      EXPECT_EQ(outside(model, whole, dp::low_byte_gather_bound(whole, W, spec(f))), 0) << f;
      run_ranks(W, [&](dp::ProcessGroup& pg) {
        auto full = torch::empty({W * n});
        dp::low_byte_all_gather_async(pg, whole.narrow(0, pg.rank() * n, n), full, spec(f), "test").wait();
        EXPECT_TRUE(torch::equal(full, model)) << f << " at " << W;
        auto half = torch::empty({W * n}, torch::kBFloat16);
        dp::low_byte_all_gather_async(pg, whole.narrow(0, pg.rank() * n, n), half, spec(f), "test").wait();
        EXPECT_TRUE(torch::equal(half, model.to(torch::kBFloat16))) << f << " at " << W;
      });
    }
}

// The planted mistake: the int8 blocks laid over the whole buffer instead of each shard, so that the block at
// [64, 128) takes rank 0's values (about 1000) and rank 1's (about 0.001) under one scale. Rank 1's values then
// round to 0, far outside the bound of their own shard's blocks, which the design keeps.
TEST(LowByteAllGather, OneScaleAcrossTwoShardsIsCaught) {
  const int64_t n = 100;
  auto whole = torch::cat({torch::full({n}, 1000.0f), torch::full({n}, 0.001f)});
  const auto bound = dp::low_byte_gather_bound(whole, 2, spec("int8"));
  EXPECT_EQ(outside(dp::low_byte_gathered(whole, 2, spec("int8")), whole, bound), 0);
  auto padded = torch::zeros({256});
  padded.narrow(0, 0, 2 * n).copy_(whole);
  const auto spanning = dp::round_trip(spec("int8"), padded).narrow(0, 0, 2 * n);
  EXPECT_EQ(outside(spanning, whole, bound), 128 - n);  // rank 1's values in the block shared with rank 0
}

// Stage 07's seams, spied on: what every rank handed its reduce-scatter, per unit, and the weights each unit's
// forward saw.
struct SpyFsdp : dp::LowByteFsdp {
  using LowByteFsdp::LowByteFsdp;
  std::map<size_t, torch::Tensor> sent;
  dp::ReduceScatterWork reduce_scatter_unit(size_t u, torch::Tensor& flat, torch::Tensor& out) override {
    sent[u] = flat.clone();
    return LowByteFsdp::reduce_scatter_unit(u, flat, out);
  }
};

// Through FSDP, ToyFSDPModel at 3 ranks (every unit padded, chunks not multiples of the block): each unit's forward
// sees the model's rounding of the master weights (the gather), and after the step each shard's gradient is the
// model's average of what the ranks reduce-scattered, bit for bit; the bytes counted are the formula's.
TEST(LowByteFsdp, ShardGradientsAndGatheredWeightsEqualTheModels) {
  for (const char* variant : {"int8/int8", "bf16/bf16-lowsum", "fp16/fp16"})
    run_ranks(3, [&](dp::ProcessGroup& pg) {
      const int W = pg.world_size(), r = pg.rank();
      dp::ToyFSDPModel model = nullptr;
      {
        std::lock_guard<std::mutex> lock(rng_mutex());
        torch::manual_seed(4);
        model = dp::ToyFSDPModel();
      }
      const auto low = dp::parse_low_byte_variant(variant, 64);
      SpyFsdp fsdp(pg, model.ptr(), model->units(), {}, low);
      const dp::ShardedParams held = fsdp.sharding();
      std::vector<torch::Tensor> exact;  // each unit's master weights, gathered exactly
      for (const auto& g : held.groups) {
        auto full = torch::empty({g.layout.padded});
        auto shard = g.chunk.detach();
        dp::all_gather_flat(pg, shard, full);
        exact.push_back(full);
      }
      auto run = fsdp.runner();
      bool weights_ok = true;
      dp::UnitRunner spy = [&](size_t u, const std::function<torch::Tensor()>& body) {
        return run(u, [&] {
          std::vector<torch::Tensor> seen;
          for (const auto& t : held.groups[u].tensors) seen.push_back(t.detach().reshape({-1}));
          const auto want = dp::low_byte_gathered(exact[u], W, low.gather);
          weights_ok = weights_ok && torch::equal(torch::cat(seen), want.narrow(0, 0, held.groups[u].layout.numel));
          return body();
        });
      };
      torch::Tensor tokens;
      {
        std::lock_guard<std::mutex> lock(rng_mutex());
        torch::manual_seed(100 + r);
        tokens = torch::randint(0, 100, {2, 8});
      }
      model->forward_units(tokens, spy).to(torch::kFloat32).square().mean().backward();
      fsdp.finish_gradient_synchronization();
      EXPECT_TRUE(weights_ok) << variant;
      double formula = 0;
      for (size_t u = 0; u < held.groups.size(); ++u) {
        const auto& L = held.groups[u].layout;
        auto all = torch::empty({W * L.padded});
        dp::all_gather_flat(pg, fsdp.sent.at(u), all);
        std::vector<torch::Tensor> per_rank;
        for (int k = 0; k < W; ++k) per_rank.push_back(all.narrow(0, k * L.padded, L.padded));
        const auto want = dp::low_byte_scatter_average(per_rank, low.scatter).narrow(0, L.offset(r), L.chunk);
        EXPECT_TRUE(torch::equal(held.groups[u].chunk.grad(), want)) << variant << ", unit " << u;
        const double gathers = u + 1 == held.groups.size() ? 1 : 2;
        formula += (W - 1) * (gathers * dp::chunk_wire_bytes(low.gather, L.chunk) +
                              dp::chunk_wire_bytes(low.scatter.wire, L.chunk));
      }
      formula += 2.0 * (W - 1) / W * 4 * (fsdp.num_parameters() - fsdp.sharded_parameters());  // the norms' gains
      EXPECT_NEAR(fsdp.sent_bytes(), formula, 1e-6 * formula) << variant;
    });
}

// fp32 for both is stage 07 itself: the same gradients and weights as Fsdp, bit for bit, after a step.
TEST(LowByteFsdp, Fp32IsStageSeven) {
  run_ranks(2, [&](dp::ProcessGroup& pg) {
    std::vector<torch::Tensor> grads[2];
    for (int which = 0; which < 2; ++which) {
      dp::ToyFSDPModel model = nullptr;
      {
        std::lock_guard<std::mutex> lock(rng_mutex());
        torch::manual_seed(4);
        model = dp::ToyFSDPModel();
      }
      std::unique_ptr<dp::Fsdp> fsdp =
          which == 0 ? std::make_unique<dp::Fsdp>(pg, model.ptr(), model->units(), dp::FsdpOptions{})
                     : std::make_unique<dp::LowByteFsdp>(pg, model.ptr(), model->units(), dp::FsdpOptions{},
                                                         dp::parse_low_byte_variant("fp32/fp32", 64));
      auto tokens = torch::arange(16).reshape({2, 8}) + pg.rank();
      model->forward_units(tokens, fsdp->runner()).square().mean().backward();
      fsdp->finish_gradient_synchronization();
      for (const auto& p : fsdp->parameters()) grads[which].push_back(p.grad().clone());
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i])) << i;
  });
}

// Stage 06's ZeRO-1 with its flat gradient buffer reduce-scattered in int8 (low_byte_reduce_scatter_how()): after a
// step at learning rate 0, this rank's chunk of the gradient is the model's average of every rank's buffer, bit for
// bit, and the strategy's bytes are the all-gather's fp32 half plus the int8 reduce-scatter's.
TEST(LowByteZero1, ChunkGradientEqualsTheModel) {
  const int64_t n = 100;  // values per rank's chunk: not a multiple of the block (64)
  run_ranks(3, [&](dp::ProcessGroup& pg) {
    const int W = pg.world_size(), r = pg.rank();
    const LowByteOptions opts{spec("int8"), SumIn::fp32};
    const auto xs = buffers(W, n, 21);  // every rank's gradient, drawn alike on every rank
    auto p = torch::zeros({W * n}).requires_grad_(true);
    p.mutable_grad() = xs[r].clone();
    dp::Zero1Optimizer z(
        pg, {p},
        [](std::vector<torch::Tensor> chunk) {
          return std::unique_ptr<torch::optim::Optimizer>(
              std::make_unique<torch::optim::SGD>(std::move(chunk), torch::optim::SGDOptions(0.0)));
        },
        dp::low_byte_reduce_scatter_how(opts));
    z.step();
    EXPECT_TRUE(torch::equal(z.shard().grad(), dp::low_byte_scatter_average(xs, opts).narrow(0, r * n, n)));
    EXPECT_NE(z.describe().find("int8/64 wire, fp32 sums"), std::string::npos) << z.describe();
    const auto how = dp::low_byte_reduce_scatter_how(opts);
    EXPECT_EQ(how.bytes(W * n, W), (W - 1) * dp::chunk_wire_bytes(spec("int8"), n));
  });
}

TEST(LowByteFsdp, VariantNamesAndRefusals) {
  const auto o = dp::parse_low_byte_variant("int8/bf16-lowsum", 128);
  EXPECT_EQ(o.gather.name(), "int8/128");
  EXPECT_EQ(o.scatter.wire.name(), "bf16");
  EXPECT_EQ(o.scatter.sum, SumIn::wire);
  EXPECT_EQ(o.name(), "weights int8/128, gradients bf16 wire, bf16 sums");
  for (const char* bad : {"int4/fp32", "fp32", "fp32/int8-lowsum", "bf16-lowsum/fp32", "fp32/", "fp32/zero1"}) try {
      dp::parse_low_byte_variant(bad, 64);
      ADD_FAILURE() << bad << " was taken";
    } catch (const dp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("variant '") + bad + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fp32, bf16, fp16, int8, zero1"), std::string::npos) << e.what();
    }
  EXPECT_THROW(dp::parse_low_byte_variant("int8/int8", 0), dp::UsageError);
  const auto z = dp::parse_low_byte_variant("zero1/int8", 64);
  EXPECT_TRUE(z.zero1);
  EXPECT_EQ(z.gather.name(), "fp32");
  EXPECT_EQ(z.name(), "ZeRO-1, weights fp32, gradients int8/64 wire, fp32 sums");
}

}  // namespace
