// Extension 07a's own check: FSDP trains the small Transformer like one process (SGD with momentum, with
// and without 2 accumulated micro-batches), in the four modes (fp32/bf16 x reshard after forward or not),
// at 2 and 4 ranks. Ranks are threads (run_ranks).
#include "extensions/07a_fsdp_bench/transformer_check.hpp"
#include "tests/stages/fsdp_modes.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

namespace {

using dp::ProcessGroup;
using dp::testing::run_ranks;

template <typename M>
class TransformerCheck : public ::testing::Test {};
TYPED_TEST_SUITE(TransformerCheck, dp::testing::FsdpModes, dp::testing::FsdpModeNames);

TYPED_TEST(TransformerCheck, World2And4) {
  for (int world : {2, 4})
    run_ranks(world, [](ProcessGroup& pg) {
      auto r = dp::check_transformer_fsdp(pg, TypeParam::options());
      EXPECT_LE(r.diff, r.bound) << "world " << pg.world_size();
    });
}

// Gradient accumulation: 2 micro-batches per step, each reduce-scattered and added to the shard
// gradients, train like one process on all rows (and like FSDP without accumulation).
TYPED_TEST(TransformerCheck, AccumulatesMicroBatches) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto r = dp::check_transformer_fsdp(pg, TypeParam::options(), /*accumulate=*/2);
    EXPECT_LE(r.diff, r.bound);
  });
}

}  // namespace
