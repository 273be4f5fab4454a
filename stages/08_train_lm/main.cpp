// Stage 08, the capstone: a language model trained on real text with what stages 05-07 built, loss
// curves that match across world sizes, and a killed run resumed from its last checkpoint.
//
// What it adds: every earlier stage trained on random tokens for a handful of steps and showed
// correctness as weight differences. Here the Transformer learns English from the bytes of Debian's
// `fortunes` package (2.4 MB; every 20th 4 KiB block held out for validation). A distributed sampler
// gives every step the same global batch whatever the world size, so 1, 2 and 4 ranks draw the same
// loss curve. --sync picks stage 05's bucketed DDP (with --accumulate K: K micro-batches, the first K-1
// under no_sync()), stage 06's true ZeRO-1 or stage 07's FSDP. Checkpoints are world-size-free and
// replaced atomically; --resume continues exactly where the last one left off, with any world size.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage08_train_lm                    # 100 steps, tiny
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage08_train_lm --steps 600 --curve curve.json
//       --checkpoint lm.ckpt --checkpoint-every 50            (kill it; the same command plus --resume goes on)
//   ./build/bin/ddp_launch --nproc 4 -- ./build/bin/stage08_train_lm --sync zero1 --accumulate 2
// Correct output: a PASS line for the check (the synchronization trains a small model like one process
// on the same real batches), the loss falling from ln 256 = 5.55 nats per byte below 2.5 within 100 steps
// (about 2.0 after 500), validation losses, the time per phase, a few lines sampled from the model, and last
// "PASS stage 08".
//
// What it leaves: a dead rank still ends the run, and every step since the last checkpoint is done again;
// stage 09 keeps the run alive through it. Beyond data parallelism (tensor, pipeline and sequence
// parallelism) docs/08_train_lm.md lists the next steps.
#include "common/base/format.hpp"
#include "common/dist/dist.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/results.hpp"
#include "stages/08_train_lm/corpus.hpp"
#include "stages/08_train_lm/lm_check.hpp"
#include "stages/08_train_lm/train_loop.hpp"
#include "stages/08_train_lm/trainer.hpp"

#include <nlohmann/json.hpp>

#include <cmath>

using namespace dp;
using json = nlohmann::json;

int main(int argc, char** argv) {
  Cli cli("stage08_train_lm", "Stage 08: train a Transformer on real text with DDP, ZeRO-1 or FSDP; resume it");
  RunOptions o;
  add_training_options(cli.app(), o);  // --corpus, --preset, --context, --batch, --accumulate, --steps, --lr, --warmup
  cli.app()
      .add_option("--sync", o.trainer.sync, "ddp (stage 05), zero1 (stage 06) or fsdp (stage 07)")
      ->check(CLI::IsMember(sync_names()));
  cli.app()
      .add_option("--bucket-mb", o.trainer.bucket_mb, "DDP's bucket cap in MB (stage 05; default 25)")
      ->check(PositiveFinite);
  cli.app()
      .add_option("--eval-every", o.eval_every, "Validation loss every N steps (and at the end)")
      ->check(PositiveInt);
  cli.app().add_option("--checkpoint", o.checkpoint, "Checkpoint file (written atomically)");
  cli.app()
      .add_option("--checkpoint-every", o.checkpoint_every, "Save every N steps (needs --checkpoint)")
      ->check(PositiveInt);
  cli.app().add_flag("--resume", o.resume, "Continue from --checkpoint (any world size, --sync or --accumulate)");
  cli.app().add_option("--curve", o.curve, "Write the loss curve, timings and sample as JSON (rank 0)");
  cli.app()
      .add_option("--sample", o.sample_bytes, "Bytes of text to sample from the model at the end (0: none)")
      ->check(NonNegativeFinite);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;
  o.seed = cli.common().seed;

  return run_main([&] {
    o.command = command_line(argc, argv);  // reads the launch environment: inside run_main, whose errors exit 2
    configure_cpu_threads();
    check_blas();
    // Bad input exits 2 before the process group forms: flags, a missing checkpoint or corpus, a batch the
    // world size does not split, a model this machine cannot hold. The launch environment knows this rank
    // and the world size already.
    validate_run_options(o);
    if (cli.app().count("--bucket-mb") && o.trainer.sync != "ddp")  // given, it would be ignored
      throw UsageError(fmt::format("--bucket-mb sets DDP's buckets; --sync {} has none: leave it out", o.trainer.sync));
    const LaunchEnv env = LaunchEnv::from_environment();
    const TextCorpus corpus = load_corpus(o.corpus, o.batch, o.context);
    DistributedSampler sampler(window_count(corpus.train, o.context), o.batch, o.seed, env.rank, env.world_size);
    check_run_fits(o, env.world_size, env.local_world_size, cli.dist_options().on_gpu());
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    o.world_size = pg.world_size();
    print0("process group: backend {}, world size {}; corpus {}: {} bytes of training text, {} held out", pg.backend(),
           pg.world_size(), corpus.source, corpus.train.numel(), corpus.val.numel());

    // [check]
    const LmCheck check = check_against_one_process(pg, o, corpus);
    print0(
        "{} {} trains like one process: 2 steps of a 2-layer model on real batches, max |diff| {:.3g} "
        "(ratio {:.2f} to its bound; bound = {})",
        check.ok() ? "PASS" : "FAIL", o.trainer.sync, check.max_abs_diff, check.worst_ratio, check.derivation);
    if (!check.ok()) throw CheckFailed("the synchronized model differs from single-process training");
    // [check]

    const json curve = train(pg, o, corpus, sampler);  // ends with a barrier: every rank has trained every step

    const auto& train_curve = curve.at("train");
    const double first = train_curve.front().at(1).get<double>(), last = train_curve.back().at(1).get<double>();
    if (!std::isfinite(last) || last >= first)
      throw CheckFailed(
          fmt::format("the training loss did not fall: {:.4f} at the first step, {:.4f} at the last", first, last));
    print0("PASS stage 08: {} trained {} steps on {}, loss {:.3f} -> {:.3f}", o.trainer.sync, o.steps,
           count_of(pg.world_size(), "rank"), first, last);
    pg.shutdown();
    return 0;
  });
}
