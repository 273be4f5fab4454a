// Flat-buffer collectives (common/comm/shard_comm.hpp) against closed forms, 1 to 4 ranks, sizes that do not
// divide by the world size (padding), threads as ranks.
#include "common/comm/shard_comm.hpp"
#include "common/dist/runtime.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

using dp::FlatLayout;
using dp::ProcessGroup;
using dp::ReduceScatterAlgo;
using dp::testing::expect_usage_error;
using dp::testing::run_ranks;

TEST(FlatLayout, PadsToAMultipleOfTheWorldSize) {
  auto l = FlatLayout::of(10, 4);
  EXPECT_EQ(l.chunk, 3);
  EXPECT_EQ(l.padded, 12);
  EXPECT_EQ(l.offset(3), 9);
  EXPECT_EQ(l.data_in(0), 3);
  EXPECT_EQ(l.data_in(3), 1);       // 9 carries data, 10 and 11 are padding
  auto few = FlatLayout::of(2, 3);  // fewer elements than ranks: one each, the last rank only padding
  EXPECT_EQ(few.chunk, 1);
  EXPECT_EQ(few.padded, 3);
  EXPECT_EQ(few.data_in(2), 0);
  EXPECT_EQ(FlatLayout::of(12, 4).padded, 12);  // divisible: no padding
  EXPECT_EQ(FlatLayout::of(0, 4).padded, 0);
  EXPECT_THROW(FlatLayout::of(5, 0), std::invalid_argument);
}

// Rank k's buffer: element i is (k + 1) * (i % 13) + k for i < n, 0 in the padding. Small integers, so
// every float32 sum is exact and the closed form holds bit for bit:
//   sum over k of (k + 1) * (i % 13) + k  =  W(W+1)/2 * (i % 13) + W(W-1)/2.
static torch::Tensor rank_buffer(int k, const FlatLayout& l) {
  auto b = torch::zeros({l.padded});
  auto i = torch::arange(l.numel, torch::kFloat32);
  b.narrow(0, 0, l.numel).copy_((k + 1) * torch::fmod(i, 13) + k);
  return b;
}

static torch::Tensor expected_sum(const FlatLayout& l) {
  const int W = l.world;
  auto e = torch::zeros({l.padded});
  auto i = torch::arange(l.numel, torch::kFloat32);
  e.narrow(0, 0, l.numel).copy_(W * (W + 1) / 2 * torch::fmod(i, 13) + W * (W - 1) / 2);
  return e;
}

using Case = std::tuple<int, int64_t>;  // world size, elements
class ShardComm : public ::testing::TestWithParam<Case> {};

TEST_P(ShardComm, ReduceScatterGivesEachRankItsChunkOfTheSum) {
  const auto [W, n] = GetParam();
  for (auto algo : {ReduceScatterAlgo::automatic, ReduceScatterAlgo::all_to_all}) {
    run_ranks(W, [&, W = W, n = n](ProcessGroup& pg) {
      const auto l = FlatLayout::of(n, W);
      auto flat = rank_buffer(pg.rank(), l);
      const auto before = flat.clone();
      auto out = torch::full({l.chunk}, -1.0f);
      dp::reduce_scatter(pg, flat, out, algo, "test");
      auto want = expected_sum(l).narrow(0, l.offset(pg.rank()), l.chunk);
      EXPECT_TRUE(torch::equal(out, want)) << "rank " << pg.rank() << " W=" << W << " n=" << n;
      EXPECT_TRUE(torch::equal(flat, before)) << "the input buffer must not change";
      // With a scratch buffer supplied, the same answer (the stage keeps one across steps).
      auto scratch = torch::empty_like(flat);
      auto again = torch::empty({l.chunk});
      dp::reduce_scatter(pg, flat, again, algo, "", scratch);
      EXPECT_TRUE(torch::equal(again, want));
    });
  }
}

TEST_P(ShardComm, AllGatherFlatPutsEveryChunkInPlace) {
  const auto [W, n] = GetParam();
  for (auto algo : {dp::AllGatherAlgo::list, dp::AllGatherAlgo::all_to_all})
    run_ranks(W, [&, W = W, n = n](ProcessGroup& pg) {
      const auto l = FlatLayout::of(n, W);
      // Rank r's chunk is 1000 * r + j; the gathered buffer is then 1000 * (i / chunk) + i % chunk.
      auto chunk = 1000.0f * pg.rank() + torch::arange(l.chunk, torch::kFloat32);
      auto flat = torch::full({l.padded}, -1.0f);
      dp::all_gather_flat(pg, chunk, flat, "test", algo);
      auto i = torch::arange(l.padded, torch::kInt64);
      auto want = (1000 * torch::div(i, l.chunk, "floor") + torch::remainder(i, l.chunk)).to(torch::kFloat32);
      EXPECT_TRUE(torch::equal(flat, want)) << "rank " << pg.rank();
      // The chunk may be this rank's own view of the output buffer (ZeRO-1 gathers its parameters so).
      auto flat2 = torch::zeros({l.padded});
      auto own = flat2.narrow(0, l.offset(pg.rank()), l.chunk);
      own.copy_(chunk);
      dp::all_gather_flat_async(pg, own, flat2, "", algo).wait();
      EXPECT_TRUE(torch::equal(flat2, want)) << "rank " << pg.rank() << " (aliased input)";
    });
}

TEST_P(ShardComm, ReduceScatterThenAllGatherIsAnAllReduce) {
  const auto [W, n] = GetParam();
  run_ranks(W, [&, W = W, n = n](ProcessGroup& pg) {
    const auto l = FlatLayout::of(n, W);
    auto flat = rank_buffer(pg.rank(), l);
    auto reduced = flat.clone();
    pg.all_reduce(reduced);
    auto mine = torch::empty({l.chunk});
    dp::reduce_scatter(pg, flat, mine);
    dp::all_gather_flat(pg, mine, flat);
    EXPECT_TRUE(torch::equal(flat, reduced));
  });
}

// flat_chunk() cuts each rank's chunk of tensors laid back to back (zeros in the padding), and
// gather_flat_chunks() puts the chunks back together into tensors of the original shapes, in order.
TEST_P(ShardComm, FlatChunkThenGatherGivesBackTheTensors) {
  const auto [W, n] = GetParam();
  run_ranks(W, [&, W = W, n = n](ProcessGroup& pg) {
    const auto whole = torch::arange(n + 6, torch::kFloat32);  // a [2, 3] tensor, then a [n] one
    const std::vector<torch::Tensor> tensors{whole.narrow(0, 0, 6).view({2, 3}), whole.narrow(0, 6, n)};
    const auto l = FlatLayout::of(n + 6, W);
    const auto chunk = dp::flat_chunk(tensors, l, pg.rank(), torch::kFloat32);
    auto padded = torch::zeros({l.padded});
    padded.narrow(0, 0, n + 6).copy_(whole);
    EXPECT_TRUE(torch::equal(chunk, padded.narrow(0, l.offset(pg.rank()), l.chunk)));
    const auto back = dp::gather_flat_chunks(pg, chunk, l, tensors);
    ASSERT_EQ(back.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(torch::equal(back[i], tensors[i])) << "tensor " << i;
    EXPECT_THROW(dp::flat_chunk({tensors[0]}, l, pg.rank(), torch::kFloat32), std::invalid_argument);
    EXPECT_THROW(dp::gather_flat_chunks(pg, torch::zeros({l.chunk + 1}), l, tensors), std::invalid_argument);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardComm,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(1, 2, 7, 1000, 1001)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "W" + std::to_string(std::get<0>(info.param)) + "_n" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(ShardCommGloo, NoNativeReduceScatterSoTheFallbackIsChosen) {
  run_ranks(2, [](ProcessGroup& pg) {
    EXPECT_FALSE(pg.has_native_reduce_scatter());
    EXPECT_EQ(dp::reduce_scatter_name(pg), "all-to-all + local sum");
    EXPECT_EQ(dp::reduce_scatter_name(pg, ReduceScatterAlgo::native), "native reduce_scatter");
    EXPECT_EQ(dp::all_gather_name(pg), "all-to-all");
    EXPECT_EQ(dp::all_gather_name(pg, dp::AllGatherAlgo::list), "list all-gather");
    auto flat = torch::ones({4});
    auto out = torch::empty({2});
    expect_usage_error([&] { dp::reduce_scatter(pg, flat, out, ReduceScatterAlgo::native); },
                       {"no reduce_scatter", "all-to-all"});
    auto bad = torch::empty({3});
    EXPECT_THROW(dp::reduce_scatter(pg, flat, bad), std::invalid_argument);
    EXPECT_THROW(dp::all_gather_flat(pg, bad, flat), std::invalid_argument);
  });
}
