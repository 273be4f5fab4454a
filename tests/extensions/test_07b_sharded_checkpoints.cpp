// Extension 07b: a checkpoint written shard by shard by 2 ranks must load bit for bit at 1, 2, 3 and 4 ranks
// (every unit cut anew, padding included), agree with the whole state assembled from its files, and refuse,
// on every rank and before changing anything, a damaged file, a save that did not finish, files of two saves,
// another model and another optimizer. Ranks run as threads (run_ranks).
#include "common/model/data.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "extensions/07b_sharded_checkpoints/sharded_checkpoint.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <mutex>

namespace {

namespace fs = std::filesystem;
using namespace dp::testing;
using dp::FullState;
using dp::ProcessGroup;

// nano at context 16 (4 units), trained with FSDP and AdamW (or SGD with momentum).
struct Trained {
  dp::TransformerLM model{nullptr};
  std::unique_ptr<dp::Fsdp> fsdp;
  std::unique_ptr<torch::optim::Optimizer> opt;
  ProcessGroup& pg;

  Trained(ProcessGroup& group, uint64_t seed, int d_ff = 256, bool sgd = false) : pg(group) {
    auto cfg = dp::TransformerConfig::preset("nano", 16);
    cfg.d_ff = d_ff;
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(seed);
      model = dp::TransformerLM(cfg);
    }
    fsdp = std::make_unique<dp::Fsdp>(pg, model.ptr(), model->units());
    if (sgd)
      opt = std::make_unique<torch::optim::SGD>(fsdp->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    else
      opt = std::make_unique<torch::optim::AdamW>(fsdp->parameters(), torch::optim::AdamWOptions(1e-2));
  }
  void train(ProcessGroup& pg, int steps) {
    for (int i = 0; i < steps; ++i) {
      auto [x, y] = dp::token_batch(12, 16, model->cfg.vocab_size, 3, i);
      opt->zero_grad();
      dp::lm_loss(model->forward_units(dp::shard_rows(x, pg.rank(), pg.world_size()), fsdp->runner()),
                  dp::shard_rows(y, pg.rank(), pg.world_size()))
          .backward();
      fsdp->finish_gradient_synchronization();
      opt->step();
    }
  }
  FullState state() { return dp::gathered_state(pg, *fsdp, *opt); }
};

// Saves to `dir` from 2 ranks after 2 steps; returns the state they held, gathered whole.
FullState save_from_two_ranks(const std::string& dir, uint64_t seed = 1, int64_t step = 2) {
  FullState saved;
  std::mutex mu;
  run_ranks(2, [&](ProcessGroup& pg) {
    Trained t(pg, seed);
    t.train(pg, 2);
    auto info = dp::save_sharded_checkpoint(dir, pg, *t.model, *t.fsdp, *t.opt, step, {{"preset", "nano"}});
    EXPECT_EQ(info.files,
              2 * static_cast<int64_t>(t.fsdp->unit_count()) + 2);  // per unit 2 chunks; replicated; metadata
    auto s = t.state();
    std::lock_guard<std::mutex> lock(mu);
    if (pg.rank() == 0) saved = s;
  });
  return saved;
}

// Tries to load `dir` at `world` ranks into a fresh model; every rank must throw a dp::UsageError with all
// `needles` and keep the state it had.
void expect_refused(const std::string& dir, int world, const std::vector<std::string>& needles, int d_ff = 256,
                    bool sgd = false) {
  run_ranks(world, [&](ProcessGroup& pg) {
    Trained t(pg, 9, d_ff, sgd);
    const FullState before = t.state();
    expect_usage_error([&] { dp::load_sharded_checkpoint(dir, pg, *t.model, *t.fsdp, *t.opt); }, needles);
    EXPECT_EQ(dp::first_difference(before, t.state()), "") << "a refused load changed the model or the optimizer";
  });
}

TEST(ShardedCheckpoint, LoadsBitForBitAtAnyWorldSize) {
  TempDir dir("ext07b_any_world");
  const FullState saved = save_from_two_ranks(dir.path.string());
  ASSERT_FALSE(saved.params.empty());
  ASSERT_TRUE(saved.optimizer[0].present);
  EXPECT_EQ(dp::read_sharded_info(dir.path.string()).meta, nlohmann::json({{"preset", "nano"}}));  // the caller's, kept
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE(world);
    run_ranks(world, [&](ProcessGroup& pg) {
      Trained t(pg, /*seed=*/5);  // other weights, no optimizer state
      ASSERT_NE(dp::first_difference(saved, t.state()), "");
      auto info = dp::load_sharded_checkpoint(dir.path.string(), pg, *t.model, *t.fsdp, *t.opt);
      EXPECT_EQ(info.world_size, 2);
      EXPECT_EQ(info.step, 2);
      EXPECT_EQ(dp::first_difference(saved, t.state()), "");
      // Each rank reads the metadata, the replicated tensors and, per unit, the saved chunks its own overlaps.
      const auto units = static_cast<int64_t>(t.fsdp->unit_count());
      if (world == 2) {
        EXPECT_EQ(info.files_touched, 2 + units);
      } else if (world == 1) {
        EXPECT_EQ(info.files_touched, 2 + 2 * units);
      }
    });
  }
  // One process assembling every file gets the same state.
  run_ranks(1, [&](ProcessGroup& pg) {
    Trained t(pg, 5);
    EXPECT_EQ(dp::first_difference(saved, dp::consolidate_sharded_checkpoint(
                                              dir.path.string(), dp::unique_named_parameters(*t.model, true))),
              "");
  });
}

TEST(ShardedCheckpoint, ASaveByFewerRanksLeavesNoChunkOfTheEarlierOne) {
  TempDir dir("ext07b_fewer");
  run_ranks(3, [&](ProcessGroup& pg) {
    Trained t(pg, 1);
    dp::save_sharded_checkpoint(dir.path.string(), pg, *t.model, *t.fsdp, *t.opt, 0);
  });
  ASSERT_TRUE(fs::exists(dir.file("u0.r2")));
  save_from_two_ranks(dir.path.string());  // into the same folder
  EXPECT_FALSE(fs::exists(dir.file("u0.r2")));
  EXPECT_FALSE(fs::exists(dir.file("u3.r2")));
  int64_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  EXPECT_EQ(files, dp::read_sharded_info(dir.path.string()).files);  // the folder holds the checkpoint, nothing else
}

TEST(ShardedCheckpoint, ResumedStepEqualsTheUninterruptedOne) {
  TempDir dir("ext07b_resume");
  run_ranks(2, [&](ProcessGroup& pg) {
    Trained run(pg, 1);
    run.train(pg, 2);
    dp::save_sharded_checkpoint(dir.path.string(), pg, *run.model, *run.fsdp, *run.opt, 2);
    Trained fresh(pg, 5);
    dp::load_sharded_checkpoint(dir.path.string(), pg, *fresh.model, *fresh.fsdp, *fresh.opt);
    run.train(pg, 1);
    fresh.train(pg, 1);
    EXPECT_EQ(dp::first_difference(run.state(), fresh.state()), "");
  });
}

TEST(ShardedCheckpoint, DamagedFileIsRefusedOnEveryRankAndChangesNothing) {
  TempDir dir("ext07b_damaged");
  save_from_two_ranks(dir.path.string());
  const std::string victim = dir.file("u1.r1");  // read by rank 1 only, at 2 ranks
  std::string bytes = read_file(victim);
  bytes[bytes.size() - 100] ^= 0x01;
  write_file(victim, bytes);
  expect_refused(dir.path.string(), 2, {"u1.r1", "damaged"});
}

TEST(ShardedCheckpoint, AnUnfinishedSaveIsNoCheckpoint) {
  TempDir dir("ext07b_unfinished");
  save_from_two_ranks(dir.path.string());
  fs::remove(dir.file("metadata"));  // the save died before rank 0 wrote the metadata
  expect_refused(dir.path.string(), 2, {"holds no complete sharded checkpoint", "metadata is missing"});
  expect_usage_error([&] { dp::read_sharded_info(dir.path.string()); }, {"holds no complete sharded checkpoint"});
}

TEST(ShardedCheckpoint, FilesOfTwoSavesAreNotMixed) {
  TempDir a("ext07b_save_a"), b("ext07b_save_b");
  save_from_two_ranks(a.path.string(), 1, 2);
  save_from_two_ranks(b.path.string(), 1, 2);  // the same training, another save
  fs::copy_file(b.file("u0.r0"), a.file("u0.r0"), fs::copy_options::overwrite_existing);
  expect_refused(a.path.string(), 2, {"u0.r0 belongs to another save", "did not finish"});
}

TEST(ShardedCheckpoint, AnotherModelOrOptimizerIsRefusedByName) {
  TempDir dir("ext07b_other");
  save_from_two_ranks(dir.path.string());
  expect_refused(dir.path.string(), 2, {"written for another model", "unit 1"}, /*d_ff=*/128);
  expect_refused(dir.path.string(), 3, {"holds adamw state, the optimizer is sgd"}, 256, /*sgd=*/true);
}

TEST(ShardedCheckpoint, AFailedWriteFailsTheSaveOnEveryRank) {
  TempDir dir("ext07b_unwritable");
  fs::create_directories(dir.file("u2.r1"));  // rank 1 cannot rename its file over a folder
  run_ranks(2, [&](ProcessGroup& pg) {
    Trained t(pg, 1);
    t.train(pg, 1);
    expect_usage_error([&] { dp::save_sharded_checkpoint(dir.path.string(), pg, *t.model, *t.fsdp, *t.opt, 1); },
                       {"u2.r1", pg.rank() == 0 ? "rank 1: " : "cannot write"});
  });
  EXPECT_FALSE(fs::exists(dir.file("metadata"))) << "a failed save must leave no metadata";
}

}  // namespace
