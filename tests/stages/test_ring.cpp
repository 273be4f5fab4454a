// Stage 01's ring collectives (ring_allreduce.cpp, the workbook's exercises 01.1-01.4) against the library's
// collectives and closed forms: every world size from 1 to 5, tensors with fewer elements than ranks, chunks of unequal
// size, int64 and float32. Entries are integers, so every sum is exact whatever its order and the two
// must agree bit for bit. Ranks are threads.
#include "stages/01_allreduce/ring_allreduce.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

using dp::ProcessGroup;
using dp::testing::run_ranks;

// Each rank's input: distinct per rank and per element, so a chunk added twice, dropped or sent to the
// wrong place changes the answer.
torch::Tensor input(int rank, int64_t n, torch::ScalarType dtype) {
  return (torch::arange(n, torch::kInt64) * 7 + 1000 * (rank + 1)).remainder(4099).to(dtype);
}

TEST(RingAllReduce, EqualsAllReduceAtEveryWorldSizeAndLength) {
  for (int world = 1; world <= 5; ++world) {
    run_ranks(world, [world](ProcessGroup& pg) {
      for (int64_t n : {1, 2, 3, 4, 5, 7, 64, 1001}) {
        for (auto dtype : {torch::kInt64, torch::kFloat32}) {
          auto mine = input(pg.rank(), n, dtype);
          auto library = mine.clone();
          dp::ring_all_reduce(pg, mine);
          pg.all_reduce(library);
          ASSERT_TRUE(torch::equal(mine, library))
              << "world " << world << ", rank " << pg.rank() << ", " << n << " elements of " << c10::toString(dtype)
              << ": " << (mine != library).sum().item<int64_t>() << " differ";
        }
      }
    });
  }
}

TEST(RingAllReduce, ReducesInPlaceAndKeepsTheShape) {
  run_ranks(3, [](ProcessGroup& pg) {
    auto t = input(pg.rank(), 24, torch::kFloat32).view({4, 6});
    const void* storage = t.data_ptr();
    dp::ring_all_reduce(pg, t);
    EXPECT_EQ(t.data_ptr(), storage);
    EXPECT_EQ(t.sizes(), (std::vector<int64_t>{4, 6}));
    auto want = input(0, 24, torch::kFloat32) + input(1, 24, torch::kFloat32) + input(2, 24, torch::kFloat32);
    EXPECT_TRUE(torch::equal(t.view({-1}), want));
  });
}

// Planted mistakes (the workbook's classic ones), each written as a learner might: the ring with its
// reduce-scatter copying instead of adding, or with no all-gather phase. ring_mismatch_hint must name each.
void mistaken_ring(ProcessGroup& pg, torch::Tensor& t, bool add, bool all_gather) {
  const int W = pg.world_size(), r = pg.rank();
  auto chunk = t.view({-1}).tensor_split(W);
  auto incoming = torch::empty_like(chunk[0]);
  auto step = [&](int out, int in, int tag) {
    auto into = incoming.narrow(0, 0, chunk[in].numel());
    dp::Work recv = pg.recv_async(into, (r + W - 1) % W, tag), send = pg.send_async(chunk[out], (r + 1) % W, tag);
    recv.wait();
    send.wait();
    return into;
  };
  for (int s = 0; s < W - 1; ++s) {
    const int out = (r - s - 1 + 2 * W) % W;
    const int in = (r - s - 2 + 2 * W) % W;
    if (add)
      chunk[in].add_(step(out, in, s));
    else
      chunk[in].copy_(step(out, in, s));
  }
  for (int s = 0; all_gather && s < W - 1; ++s) {
    const int out = (r - s + W) % W;
    const int in = (r - s - 1 + W) % W;
    chunk[in].copy_(step(out, in, W + s));
  }
}

// Every rank's hint for the mistaken ring.
std::vector<std::string> hints_of_mistake(int world, bool add, bool all_gather) {
  std::vector<std::string> hints(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    auto t = input(pg.rank(), 1001, torch::kFloat32), in = t.clone();
    mistaken_ring(pg, t, add, all_gather);
    hints[pg.rank()] = dp::ring_mismatch_hint(pg, in, t);
  });
  return hints;
}

TEST(RingAllReduceHints, CopiedInsteadOfAddedIsNamed) {
  for (int world : {2, 3, 4})
    for (const auto& h : hints_of_mistake(world, /*add=*/false, /*all_gather=*/true))
      EXPECT_NE(h.find("[ring-copied-not-added]"), std::string::npos) << "world " << world << ": " << h;
}

TEST(RingAllReduceHints, MissingAllGatherIsNamed) {
  for (int world : {2, 3, 4})
    for (const auto& h : hints_of_mistake(world, /*add=*/true, /*all_gather=*/false))
      EXPECT_NE(h.find("[ring-no-all-gather]"), std::string::npos) << "world " << world << ": " << h;
}

TEST(RingAllReduceHints, TheRightRingGetsNoHint) {
  for (const auto& h : hints_of_mistake(3, /*add=*/true, /*all_gather=*/true)) EXPECT_EQ(h, "");
}

// After the reduce-scatter chunk r of rank r is the sum of every rank's chunk r; after the all-gather every
// chunk c is rank c's chunk c; the alternate ring sums like all_reduce. Every world size and length.
TEST(RingCollectives, ReduceScatterAllGatherAndAlternateAreRight) {
  for (int world = 1; world <= 5; ++world) {
    run_ranks(world, [world](ProcessGroup& pg) {
      const int r = pg.rank();
      for (int64_t n : {1, 3, 7, 1001}) {
        std::vector<torch::Tensor> all;
        for (int q = 0; q < world; ++q) all.push_back(input(q, n, torch::kFloat32));
        const auto sum = torch::stack(all).sum(0);
        const std::string where =
            "world " + std::to_string(world) + ", rank " + std::to_string(r) + ", n " + std::to_string(n);

        auto t = all[r].clone();
        dp::ring_reduce_scatter(pg, t);
        EXPECT_TRUE(torch::equal(t.tensor_split(world)[r], sum.tensor_split(world)[r])) << "reduce-scatter, " << where;

        t = torch::full({n}, -1.0f);
        t.tensor_split(world)[r].copy_(all[r].tensor_split(world)[r]);  // only this rank's own chunk is known
        dp::ring_all_gather(pg, t);
        for (int c = 0; c < world; ++c)
          EXPECT_TRUE(torch::equal(t.tensor_split(world)[c], all[c].tensor_split(world)[c]))
              << "all-gather, chunk " << c << ", " << where;

        t = all[r].clone();
        dp::alternate_ring_all_reduce(pg, t);
        EXPECT_TRUE(torch::equal(t, sum)) << "alternate ring, " << where;
      }
    });
  }
}

// The predicted times, by hand: 4 ranks, 4 MB at 1 MB/s. A reduce-scatter or an all-gather is 3 steps of a
// 1 MB chunk (3 s), the all-reduce both (6 s), the alternate ring 3 steps of the whole 4 MB (12 s); a step's
// latency is paid once per step; one rank sends nothing.
TEST(RingSeconds, MatchesTheStepsByHand) {
  using dp::Ring;
  EXPECT_DOUBLE_EQ(dp::ring_seconds(Ring::kReduceScatter, 4, 4e6, 1e6, 0), 3.0);
  EXPECT_DOUBLE_EQ(dp::ring_seconds(Ring::kAllGather, 4, 4e6, 1e6, 0), 3.0);
  EXPECT_DOUBLE_EQ(dp::ring_seconds(Ring::kAllReduce, 4, 4e6, 1e6, 0), 6.0);
  EXPECT_DOUBLE_EQ(dp::ring_seconds(Ring::kAlternate, 4, 4e6, 1e6, 0), 12.0);
  EXPECT_DOUBLE_EQ(dp::ring_seconds(Ring::kAllReduce, 4, 4e6, 1e6, 0.01), 6.06);
  EXPECT_DOUBLE_EQ(dp::ring_seconds(Ring::kAlternate, 2, 4e6, 1e6, 0.5), 4.5);
  EXPECT_DOUBLE_EQ(dp::ring_seconds(Ring::kAllReduce, 1, 4e6, 1e6, 0.5), 0.0);
}

TEST(RingAllReduce, RefusesANonContiguousTensor) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto t = torch::zeros({4, 6}).t();
    EXPECT_THROW(dp::ring_all_reduce(pg, t), std::invalid_argument);
    EXPECT_THROW(dp::ring_reduce_scatter(pg, t), std::invalid_argument);
    EXPECT_THROW(dp::ring_all_gather(pg, t), std::invalid_argument);
    EXPECT_THROW(dp::alternate_ring_all_reduce(pg, t), std::invalid_argument);
  });
}

}  // namespace
