// Stage 01's ring all-reduce (ring_allreduce.cpp, the workbook's exercise 01.1) against the library's
// all_reduce: every world size from 1 to 5, tensors with fewer elements than ranks, chunks of unequal
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
    const int out = (r - s + W) % W, in = (r - s - 1 + W) % W;
    if (add)
      chunk[in].add_(step(out, in, s));
    else
      chunk[in].copy_(step(out, in, s));
  }
  for (int s = 0; all_gather && s < W - 1; ++s) {
    const int out = (r + 1 - s + W) % W, in = (r - s + W) % W;
    chunk[in].copy_(step(out, in, W - 1 + s));
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

TEST(RingAllReduce, RefusesANonContiguousTensor) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto t = torch::zeros({4, 6}).t();
    EXPECT_THROW(dp::ring_all_reduce(pg, t), std::invalid_argument);
  });
}

}  // namespace
