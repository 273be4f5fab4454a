// Extension 06c: checkpoints of a sharded optimizer must resume training exactly at any world size, and a
// damaged file or another model must be refused by name. Ranks run as threads (run_ranks).
#include "common/model/params.hpp"
#include "extensions/06c_checkpoints/checkpoint.hpp"
#include "tests/stages/sharded_opt_support.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/files.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <tuple>

namespace {

namespace fs = std::filesystem;
using namespace dp::testing;
using dp::ProcessGroup;
using dp::ShardedOptimizer;
using dp::UsageError;

// Steps [from, to) of a training run with the batches of build_pair().
void train(dp::ToyBase& m, ShardedOptimizer& opt, const std::vector<Batch>& batches, int from, int to) {
  for (int step = from; step < to; ++step) {
    opt.zero_grad();
    loss_of(m, batches[step]).backward();
    opt.step();
  }
}

// Saves from a 2-rank run after 3 steps.
void save_after_three_steps(const std::string& path, const std::string& model, const std::string& kind) {
  run_ranks(2, [&](ProcessGroup& pg) {
    auto p = build_pair(model, 6);
    ShardedOptimizer opt(pg, make_groups(kind, *p.shd, "two", true), local_factory(kind));
    train(*p.shd, opt, p.batches, 0, 3);
    dp::save_checkpoint(path, pg, *p.shd, opt);
  });
}

using ResumeCombo = std::tuple<std::string, std::string, int>;  // model, optimizer, world size at load
class Resume : public ::testing::TestWithParam<ResumeCombo> {};

TEST_P(Resume, SaveAtWorld2AfterThreeStepsThenThreeMoreEqualsSixSteps) {
  // Named variables, not a structured binding: the lambda below captures them (C++17 lets no lambda capture a
  // binding; GCC accepts it as an extension, Clang refuses).
  const std::string model = std::get<0>(GetParam()), kind = std::get<1>(GetParam());
  const int load_world = std::get<2>(GetParam());
  TempDir dir("stage06_resume");
  const std::string path = dir.file("ckpt.bin");
  save_after_three_steps(path, model, kind);
  auto info = dp::read_checkpoint_info(path);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.optimizer, kind);
  EXPECT_EQ(info.max_step, kind == "sgd" ? 0 : 3);

  run_ranks(load_world, [&](ProcessGroup& pg) {
    // Uninterrupted: the plain optimizer for 6 steps (equal to the sharded one: test_06b_cs336_design.cpp).
    // Computed here, on the rank's thread, with the rank's intra-op thread count: LibTorch 2.x splits
    // the backward's reductions by thread count, and a different split rounds differently.
    auto u = build_pair(model, 6);
    auto plain = plain_optimizer(kind, make_groups(kind, *u.ref, "two", false));
    for (int step = 0; step < 6; ++step) {
      plain->zero_grad();
      loss_of(*u.ref, u.batches[step]).backward();
      plain->step();
    }
    auto p = build_pair(model, 6);
    {
      torch::NoGradGuard no_grad;
      for (auto& t : dp::unique_parameters(*p.shd)) t.zero_();  // the load must bring every value back
    }
    ShardedOptimizer opt(pg, make_groups(kind, *p.shd, "two", true), local_factory(kind));
    opt.set_lr(1, 123.0);  // and the learning rates
    auto got = dp::load_checkpoint(path, pg, *p.shd, opt);
    require(got.world_size == 2, "saved world size");
    train(*p.shd, opt, p.batches, 3, 6);
    require_same(*u.ref, *p.shd, fmt::format("resumed at W={} rank {}", pg.world_size(), pg.rank()));
  });
}

INSTANTIATE_TEST_SUITE_P(Ext06c, Resume,
                         ::testing::Combine(::testing::Values("toy", "tied"), ::testing::Values("adamw", "sgd"),
                                            ::testing::Values(1, 2, 3)),
                         [](const ::testing::TestParamInfo<ResumeCombo>& info) {
                           return fmt::format("{}_{}_loadW{}", std::get<0>(info.param), std::get<1>(info.param),
                                              std::get<2>(info.param));
                         });

// Loads `path` into a fresh 2-rank toy model with AdamW and expects UsageError with `needles` on every rank.
void expect_load_refused(const std::string& path, const std::string& model, const std::string& kind,
                         const std::vector<std::string>& needles) {
  std::mutex m;
  int refused = 0;
  run_ranks(2, [&](ProcessGroup& pg) {
    auto p = build_pair(model, 1);
    auto before = p.shd->parameters()[0].detach().clone();
    ShardedOptimizer opt(pg, make_groups(kind, *p.shd, "two", true), local_factory(kind));
    expect_usage_error([&] { dp::load_checkpoint(path, pg, *p.shd, opt); }, needles);
    require(torch::equal(before, p.shd->parameters()[0]), "a refused load changed the model");
    std::lock_guard<std::mutex> lock(m);
    ++refused;
  });
  EXPECT_EQ(refused, 2);
}

TEST(Checkpoint, TruncatedOrCorruptedFileIsRefusedAsDamaged) {
  TempDir dir("stage06_damaged");
  const std::string good = dir.file("good.bin"), bad = dir.file("bad.bin");
  save_after_three_steps(good, "toy", "adamw");
  const std::string bytes = read_file(good);

  write_file(bad, bytes.substr(0, bytes.size() / 2));
  expect_load_refused(bad, "toy", "adamw", {"damaged", "truncated"});
  write_file(bad, bytes.substr(0, 20));
  expect_load_refused(bad, "toy", "adamw", {"damaged", "header"});
  std::string flipped = bytes;
  flipped[flipped.size() - 100] ^= 0x01;  // one bit inside the tensor payload
  write_file(bad, flipped);
  expect_load_refused(bad, "toy", "adamw", {"damaged", "checksum"});
  std::string magic = bytes;
  magic[0] = 'X';
  write_file(bad, magic);
  expect_load_refused(bad, "toy", "adamw", {"damaged", "magic"});
  expect_load_refused(dir.file("missing.bin"), "toy", "adamw", {"cannot read", "missing.bin"});
  EXPECT_THROW(dp::read_checkpoint_info(bad), UsageError);
}

TEST(Checkpoint, OtherModelOrOptimizerIsRefusedNamingTheMismatch) {
  TempDir dir("stage06_mismatch");
  const std::string tied = dir.file("tied.bin");
  save_after_three_steps(tied, "tied", "adamw");
  // ToyMLP's first parameter is also fc1.weight, but [20, 10] instead of [10, 10].
  expect_load_refused(tied, "mlp", "adamw", {"'fc1.weight'", "[10, 10]", "[20, 10]"});
  expect_load_refused(tied, "toy", "adamw", {"parameter 0", "'fc1.weight'", "'no_grad_fixed_param'"});
  expect_load_refused(tied, "tied", "sgd", {"adamw state", "optimizer is sgd"});
}

TEST(Checkpoint, FailedSaveLeavesThePreviousCheckpointIntact) {
  TempDir dir("stage06_atomic");
  const std::string path = dir.file("ckpt.bin");
  save_after_three_steps(path, "toy", "adamw");
  const std::string before = read_file(path);
  // PATH.tmp is a directory: creating the temporary file fails (also when running as root, where an
  // unwritable directory would not stop us).
  fs::create_directories(path + ".tmp");
  int failed = 0;
  std::mutex m;
  run_ranks(2, [&](ProcessGroup& pg) {
    auto p = build_pair("toy", 6);
    ShardedOptimizer opt(pg, make_groups("adamw", *p.shd, "two", true), local_factory("adamw"));
    train(*p.shd, opt, p.batches, 0, 5);
    expect_usage_error([&] { dp::save_checkpoint(path, pg, *p.shd, opt); }, {"cannot write checkpoint"});
    expect_usage_error([&] { dp::save_checkpoint(dir.file("no/such/dir/ckpt.bin"), pg, *p.shd, opt); },
                       {"cannot write checkpoint", "No such file or directory"});
    std::lock_guard<std::mutex> lock(m);
    ++failed;
  });
  EXPECT_EQ(failed, 2);
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(dp::read_checkpoint_info(path).max_step, 3);
  EXPECT_FALSE(fs::exists(dir.file("no/such/dir/ckpt.bin.tmp")));
  // A successful save replaces the file and leaves no temporary file behind.
  fs::remove(path + ".tmp");
  run_ranks(2, [&](ProcessGroup& pg) {
    auto p = build_pair("toy", 6);
    ShardedOptimizer opt(pg, make_groups("adamw", *p.shd, "two", true), local_factory("adamw"));
    train(*p.shd, opt, p.batches, 0, 5);
    dp::save_checkpoint(path, pg, *p.shd, opt);
  });
  EXPECT_EQ(dp::read_checkpoint_info(path).max_step, 5);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

}  // namespace
