// Extension 06c, on stage 06 and extension 06b's design: checkpoints of the sharded optimizer state, loadable at any
// world size.
//
// What it adds: with extension 06b's CS336 design every rank holds the AdamW state of the tensors it owns, and
// nothing else. A checkpoint must hold all of it: save_checkpoint() gathers each tensor's state from its
// owner to rank 0, one tensor at a time, and rank 0 writes one checksummed file atomically;
// load_checkpoint() checks everything first, then every rank installs the state of the tensors it owns
// now, whatever the world size that saved it.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext06c_checkpoints --checkpoint /tmp/s6         # save, resume
//   ./build/bin/ddp_launch --nproc 3 -- ./build/bin/ext06c_checkpoints --checkpoint /tmp/s6 --resume-only
//       (loads what 2 ranks saved into 3 ranks, then trains on)
// Correct output: the CS336 design's check ("PASS sharded AdamW == AdamW on toy", "on tied"), then
// "PASS checkpoint ... resumed step equals the uninterrupted one" (the run that saved it and a fresh replica
// loaded from it take the same next step, bit for bit); with --resume-only "PASS loaded ... saved by N
// ranks"; "PASS extension 06c" last.
//
// What it leaves: the file is this design's own format; stage 08 saves every way of training through the
// training-strategy contract's full state (common/state/full_state.hpp), which has no parameter groups.
#include "common/base/format.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/cli.hpp"
#include "common/model/data.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "extensions/06b_cs336_design/cs336_design.hpp"
#include "extensions/06b_cs336_design/sharded_optimizer.hpp"
#include "extensions/06c_checkpoints/checkpoint.hpp"

#include <filesystem>

using namespace dp;
namespace optim = torch::optim;

// The Transformer trained with extension 06b's CS336 design: gradients all-reduced and divided by N, then the
// ShardedOptimizer steps what this rank owns and broadcasts it.
struct Run {
  TransformerLM model{nullptr};
  std::unique_ptr<ShardedOptimizer> opt;
  Run(ProcessGroup& pg, const TransformerConfig& c, uint64_t seed) {
    torch::manual_seed(seed);
    model = TransformerLM(c);
    model->to(pg.device());
    broadcast_parameters(pg, *model);
    opt = std::make_unique<ShardedOptimizer>(ShardedOptimizer::make<optim::AdamW>(
        pg, unique_parameters(*model), optim::AdamWOptions(1e-3).weight_decay(0.1)));
  }
  void step(ProcessGroup& pg, const BenchConfig& cfg, int64_t i) {
    const auto& c = model->cfg;
    auto [gx, gy] = token_batch(cfg.global_batch, cfg.context, c.vocab_size, 11, i);
    opt->zero_grad();
    lm_loss(model->forward(shard_rows(gx, pg.rank(), pg.world_size()).to(pg.device())),
            shard_rows(gy, pg.rank(), pg.world_size()).to(pg.device()))
        .backward();
    for (auto& p : unique_parameters(*model, true)) {
      pg.all_reduce(p.mutable_grad());
      p.mutable_grad().div_(pg.world_size());
    }
    opt->step();
  }
};

int main(int argc, char** argv) {
  Cli cli("ext06c_checkpoints", "Extension 06c: checkpoints of the sharded optimizer, loadable at any world size");
  BenchConfig cfg;
  std::string dir;
  bool resume_only = false;
  add_checkpoint_options(cli.app(), cfg, dir, resume_only, "Folder for the checkpoint file (made if missing)",
                         "Load the file an earlier run saved (at any world size), train one step, save nothing");
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    validate_bench_config(cfg, world);                           // bad input: exit 2 before any rendezvous
    const std::string path = dir + "/ext06c_" + cfg.preset + ".ckpt";
    if (resume_only) {
      if (!std::filesystem::exists(path))
        throw UsageError(fmt::format("--resume-only: {} does not exist; run once without --resume-only first", path));
    } else {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec)
        throw UsageError(
            fmt::format("--checkpoint {}: cannot create that folder ({}); give a writable folder", dir, ec.message()));
      check_writable("--checkpoint", path);
    }
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    const bool ok = check_against_adamw(
        pg, "sharded AdamW", [](ProcessGroup& g, const std::vector<torch::Tensor>& p, const optim::AdamWOptions& o) {
          return cs336_steps(g, p, o);
        });
    if (!ok) throw CheckFailed("sharded AdamW differs from AdamW");

    const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
    if (resume_only) {
      Run fresh(pg, mcfg, /*seed=*/5);
      const auto info = load_checkpoint(path, pg, *fresh.model, *fresh.opt);
      fresh.step(pg, cfg, info.max_step);
      print0("PASS loaded {} (saved by {} at step {}) into {}, and trained on", path, count_of(info.world_size, "rank"),
             info.max_step, count_of(pg.world_size(), "rank"));
    } else {
      Run run(pg, mcfg, /*seed=*/1);
      for (int64_t i = 0; i < cfg.steps; ++i) run.step(pg, cfg, i);
      // [resume]
      save_checkpoint(path, pg, *run.model, *run.opt);
      Run fresh(pg, mcfg, /*seed=*/5);  // other weights, no state: everything must come from the file
      const auto info = load_checkpoint(path, pg, *fresh.model, *fresh.opt);
      run.step(pg, cfg, cfg.steps);
      fresh.step(pg, cfg, cfg.steps);
      // [resume]
      const bool same = max_param_diff(*run.model, *fresh.model) == 0.0;
      print0("{} checkpoint {} ({}, saved by {}, step {}): resumed step {} the uninterrupted one",
             same ? "PASS" : "FAIL", path, format_bytes(static_cast<double>(std::filesystem::file_size(path))),
             count_of(info.world_size, "rank"), info.max_step, same ? "equals" : "DIFFERS from");
      if (!same) throw CheckFailed("resuming from the checkpoint changed the training");
    }
    pg.barrier();
    print0("PASS extension 06c: sharded checkpoints resume training exactly");
    pg.shutdown();
    return 0;
  });
}
