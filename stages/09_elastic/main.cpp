// Stage 09: elastic data parallelism. A rank dies, the others go on; a new one joins and catches up.
//
// What it adds: in stage 08 a dead rank ends the run, and everything since the last checkpoint is lost
// when it restarts. Here the ranks train in generations. Each generation is a process group of fixed
// members, formed in a store that no training rank hosts (a file the launcher owns). When a collective
// fails (Gloo reports a dead peer at once; a hung one after --timeout) the survivors leave their group,
// meet in the next round, form a new group, take the state of the member with the most steps, and redo
// the step. A replacement the launcher starts (--max-restarts) waits in the store; the members notice it
// at their next step boundary, form a generation with it, and send it the model, AdamW's moments, the
// step and the curve. The global batch never changes (each generation splits it over its members), so
// the loss curve is the uninterrupted run's, whatever happens. When every holder of the state has died (a
// round of newcomers only) they load the run's last checkpoint (--checkpoint-every) and redo the steps
// since; without one the run cannot go on (exit 3; ddp_launch starts no more replacements). Only DDP can do
// this: with ZeRO-1 or FSDP a dead rank's shard is gone, and --sync zero1|fsdp is refused.
//
// Run it:
//   ./build/bin/ddp_launch --elastic --nproc 3 -- ./build/bin/stage09_elastic          # nothing fails
//   DP_FAULT=die@1:step20 ./build/bin/ddp_launch --elastic --nproc 3 --max-restarts 1 --restart-delay 3
//       -- ./build/bin/stage09_elastic --curve elastic.json   # rank 1 killed as step 21 begins; replaced
//   DP_FAULT=stop@2:step10 ./build/bin/ddp_launch --elastic --nproc 3 -- ./build/bin/stage09_elastic --timeout 5s
// Correct output: "generation 0: 3 ranks ..."; after the kill, from the survivors, "generation 0 failed at step 21:
// all_reduce ... Connection closed by peer", "generation 1: 2 ranks ... after a failure at step 21 (seen 0.08-0.3 s
// after it ...)" and "step 21 done 1-1.6 s after the failure"; then "generation 2: 3 ranks ... a newcomer waits
// ... state from 0.0 (51.93 MB)"; the loss falling from 6.1 below 2.7 by step 60, as in stage 08; "PASS replicas
// bit-identical going into every step"; last "PASS stage 09: 60 steps, ..., ranks 3 -> 2 -> 3".
//
// What it leaves: one node (the store is a file; across machines it would be a TCP store in a process
// that trains nothing, as torchrun's agent or torchft's lighthouse); replicated state only (HSDP would
// heal a shard from its replica group); a failure costs a redone step, and the work since the last
// checkpoint only when every holder is gone.
#include "common/base/timeline.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/results.hpp"  // command_line
#include "stages/08_train_lm/trainer.hpp"
#include "stages/09_elastic/elastic_loop.hpp"

#include <fmt/format.h>

#include <csignal>
#include <filesystem>
#include <memory>
#include <optional>

using namespace dp;
using json = nlohmann::json;

int main(int argc, char** argv) {
  Cli cli("stage09_elastic", "Stage 09: elastic DDP; survives dead ranks and takes in new ones between steps");
  ElasticOptions o;
  RunOptions& r = o.run;
  r.context = 64;
  r.batch = 12;
  r.steps = 60;
  r.warmup = 10;
  r.sample_bytes = 0;
  add_training_options(cli.app(), r);  // stage 08's: --corpus, --preset, --context, --batch, --accumulate, --steps,
                                       // --lr, --warmup
  std::vector<std::string> syncs = sync_names();
  syncs.push_back("hsdp");  // extension 10a's (stage 08 with stage 10's HSDP): named here to be refused with the reason
  cli.app()
      .add_option("--sync", r.trainer.sync, "ddp only (zero1, fsdp and hsdp are refused: a dead rank's shard is gone)")
      ->check(CLI::IsMember(syncs));
  cli.app().add_option("--checkpoint", r.checkpoint,
                       "Checkpoint file: written at the end, when too few ranks are left, and with "
                       "--checkpoint-every; loaded when nobody alive holds the state");
  cli.app()
      .add_option("--checkpoint-every", r.checkpoint_every, "Save every N steps (needs --checkpoint)")
      ->check(PositiveInt);
  cli.app().add_flag("--resume", r.resume, "Start from --checkpoint (stage 08's or this stage's)");
  cli.app().add_option("--curve", r.curve, "Write the loss curve and the membership changes as JSON");
  std::optional<int> min_ranks;  // default: ddp_launch's --min-nproc (DP_ELASTIC_MIN), else 1
  cli.app()
      .add_option("--min-ranks", min_ranks,
                  "Stop (with a checkpoint) when fewer ranks are left "
                  "(default: ddp_launch's --min-nproc, else 1)")
      ->check(PositiveInt);
  cli.app().add_option("--trace", o.trace,
                       "Write every process's timeline (rounds, groups, heals, steps) as a "
                       "Chrome trace-event file");
  cli.app()
      .add_option("--settle", o.settle_s, "Seconds a round waits for more members after the first")
      ->check(NonNegativeFinite);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;
  r.seed = cli.common().seed;

  // A write to a peer that just died raises SIGPIPE, whose default kills this survivor too (seen with
  // LibTorch 2.x's Gloo, a rank killed by signal 13 right after its peer's SIGKILL). Ignored, the write
  // fails with EPIPE, the collective throws, and the survivor goes to the next round like the others.
  std::signal(SIGPIPE, SIG_IGN);
  return run_main([&] {
    r.command = command_line(argc, argv);
    configure_cpu_threads();
    const LaunchEnv env = LaunchEnv::from_environment();
    o.min_ranks = min_ranks.value_or(env.elastic_min);
    const bool own_store = env.elastic_store.empty();  // by hand: a store file of its own, removed on the way out
    if (env.launched && own_store)
      throw UsageError(
          "stage 09 meets its peers in ddp_launch --elastic's store (DP_ELASTIC_STORE is unset); run "
          "ddp_launch --elastic --nproc N -- stage09_elastic");
    const std::string path = own_store ? fmt::format("/tmp/stage09_store.{}", ::getpid()) : env.elastic_store;
    const std::unique_ptr<const std::string, void (*)(const std::string*)> remove_store(
        own_store ? &path : nullptr, [](const std::string* p) { std::filesystem::remove(*p); });
    o.max_ranks = env.world_size;
    const DistOptions dist = cli.dist_options();
    if (dist.on_gpu()) throw UsageError("stage 09 runs on the CPU over Gloo; drop --device cuda / --backend nccl");
    validate_elastic_options(o);
    validate_run_options(r);
    check_run_fits(r, o.max_ranks, env.ranks_on_this_machine());  // every started rank: the most any membership holds
    if (!o.trace.empty()) check_writable("--trace", o.trace);
    r.world_size = env.world_size;
    const TextCorpus corpus = load_corpus(r.corpus, r.batch, r.context);
    set_log_tag(env.rank, env.world_size);  // its lines keep the launcher's tag; its rank changes each generation
    Membership members(path, fmt::format("{}.{}", env.rank, env.restart), o.max_ranks,
                       std::chrono::milliseconds(static_cast<int64_t>(o.settle_s * 1000)), dist.timeout);
    Faults faults(members.store(), members.id(), env.rank, env.restart);
    if (!o.trace.empty()) timeline::open(o.trace, members.id());
    json curve;
    try {
      curve = train_elastic(o, corpus, members, faults, dist, /*with_state=*/env.restart == 0);
    } catch (const RunOver& e) {  // a replacement started as the last generation finished: nothing to join
      print_rank("{}; nothing is left for this process to do", e.what());
      return 0;
    }

    // [verdict]
    const auto& train = curve.at("train");
    const double first = train.front().at(1).get<double>(), last = train.back().at(1).get<double>();
    if (!std::isfinite(last) || last >= first)
      throw CheckFailed(
          fmt::format("the training loss did not fall: {:.4f} at the first step, {:.4f} at the last", first, last));
    std::string sizes;
    for (const auto& e : curve.at("events"))
      sizes += (sizes.empty() ? "" : " -> ") + std::to_string(e.at("ranks").get<int>());
    print0("PASS replicas bit-identical going into every step (a hash of the parameters gathered before each)");
    print0("PASS stage 09: {} steps, loss {:.3f} -> {:.3f}, ranks {}", r.steps, first, last, sizes);
    // [verdict]
    return 0;
  });
}
