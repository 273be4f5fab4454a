// Extension 07b, on stage 07: FSDP's checkpoints written shard by shard (as PyTorch's Distributed Checkpoint
// writes them) and read back at any world size, with no rank ever holding the whole state.
//
// What it adds: stage 08 saves through the training-strategy contract's full state, every tensor and its
// AdamW state gathered whole on every rank: 12P bytes, the memory FSDP exists to avoid (FSDP's `large`
// cannot checkpoint that way here). Here each rank writes its own chunk of every unit, one file per unit
// (sharded_checkpoint.hpp), and rank 0 writes the metadata last. A load at another world size cuts every
// unit's flat buffer anew and reads only the files whose chunks overlap this rank's new one.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext07b_sharded_checkpoints --checkpoint /tmp/s7         # save,
//   resume
//   ./build/bin/ddp_launch --nproc 3 -- ./build/bin/ext07b_sharded_checkpoints --checkpoint /tmp/s7 --resume-only
//       (loads what 2 ranks saved into 3 ranks, checks it against the whole state assembled, trains on)
// Correct output: per rank "[rank r/2] wrote 8 files, at most 15.4 MB at once" (6 on rank 1); "PASS checkpoint
// ...: resumed step equals the uninterrupted one" (the run that saved and a fresh replica loaded from the
// folder take the same next step, bit for bit); then what the save cost, beside gathering the whole state as
// stage 08 does ("save: 0.30 s, peak resident memory +16 MB ...; gathering the whole state instead: +160 MB").
// With --resume-only, per rank "read K of the checkpoint's 14 files", "PASS loaded ... (saved by 2 ranks at
// step 3) into 3 ranks: every tensor and its AdamW state equal to the whole state assembled from the files"
// and the load's cost; "PASS extension 07b" last. --json FILE writes the costs (scripts/bench/bench_docs.sh ext07b).
//
// What it leaves: a save over an older checkpoint replaces it file by file (an interrupted one is refused on
// load, not mixed; save to a new folder per step to keep the last good one); stage 08 still saves the full
// state, through the contract every way of training shares.
#include "common/base/format.hpp"
#include "common/base/log.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/memory.hpp"
#include "common/measure/results.hpp"
#include "common/measure/timing.hpp"
#include "common/model/data.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "common/state/full_state.hpp"
#include "extensions/07b_sharded_checkpoints/sharded_checkpoint.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <algorithm>
#include <filesystem>
#include <mutex>

using namespace dp;
namespace optim = torch::optim;

// The Transformer trained with stage 07's FSDP and AdamW over its shards.
struct Run {
  TransformerLM model{nullptr};
  std::unique_ptr<Fsdp> fsdp;
  std::unique_ptr<optim::AdamW> opt;
  Run(ProcessGroup& pg, const TransformerConfig& c, uint64_t seed) {
    {
      std::lock_guard<std::mutex> lock(model_init_mutex());
      torch::manual_seed(seed);
      model = TransformerLM(c);
    }
    model->to(pg.device());
    fsdp = std::make_unique<Fsdp>(pg, model.ptr(), model->units());  // rank 0's weights, sharded
    opt = std::make_unique<optim::AdamW>(fsdp->parameters(), optim::AdamWOptions(1e-3).weight_decay(0.1));
  }
  void step(ProcessGroup& pg, const BenchConfig& cfg, int64_t i) {
    auto [gx, gy] = token_batch(cfg.global_batch, cfg.context, model->cfg.vocab_size, 11, i);
    opt->zero_grad();
    lm_loss(model->forward_units(shard_rows(gx, pg.rank(), pg.world_size()).to(pg.device()), fsdp->runner()),
            shard_rows(gy, pg.rank(), pg.world_size()).to(pg.device()))
        .backward();
    fsdp->finish_gradient_synchronization();
    opt->step();
  }
};

// Runs `f` on every rank and returns, the most of any rank: its seconds, and the peak resident memory it added
// over what the rank held before it (MB). A collective.
template <typename F>
std::pair<double, double> measured(ProcessGroup& pg, F&& f) {
  reset_peak_rss();  // the peak back down to the present (Linux's clear_refs)
  const int64_t before = current_rss_bytes();
  Timer timer(pg.device());
  f();
  const double s = timer.seconds(), mb = static_cast<double>(peak_rss_bytes() - before) / 1e6;
  const auto all = pg.all_gather(std::vector<double>{s, mb});
  std::pair<double, double> most{0, 0};
  for (const auto& r : all) {
    most.first = std::max(most.first, r[0]);
    most.second = std::max(most.second, r[1]);
  }
  return most;
}

double most_of(ProcessGroup& pg, int64_t v) {
  const auto all = pg.all_gather(static_cast<double>(v));
  return *std::max_element(all.begin(), all.end());
}

int main(int argc, char** argv) {
  Cli cli("ext07b_sharded_checkpoints",
          "Extension 07b: FSDP's checkpoints written shard by shard, loadable at any world size");
  BenchConfig cfg;
  std::string dir;
  bool resume_only = false;
  add_checkpoint_options(cli.app(), cfg, dir, resume_only, "Folder of the checkpoint's files (made if missing)",
                         "Load the folder an earlier run saved (at any world size), check it, train one step, "
                         "save nothing");
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    // A freed buffer goes back to the OS at once, so that resident memory follows the live tensors and the peak
    // a save or a load adds is what it allocated (common/measure/memory.hpp says what glibc does otherwise).
    map_large_allocations();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    validate_bench_config(cfg, world);                           // bad input: exit 2 before any rendezvous
    if (resume_only) {                                           // bad input: exit 2 now, before any rendezvous
      const auto saved = read_sharded_info(dir).meta;            // "holds no complete sharded checkpoint", "damaged"
      if (saved.value("preset", cfg.preset) != cfg.preset)
        throw UsageError(fmt::format("--preset {}: {} was saved from --preset {}; give --preset {}", cfg.preset, dir,
                                     saved.value("preset", ""), saved.value("preset", "")));
    } else {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec)
        throw UsageError(
            fmt::format("--checkpoint {}: cannot create that folder ({}); give a writable folder", dir, ec.message()));
      check_writable("--checkpoint", (std::filesystem::path(dir) / "metadata").string());
    }
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
    Results results("sharded_checkpoint");
    const auto add_row = [&](nlohmann::json row, const Fsdp& fsdp) {  // what every row says of the run
      const double P = static_cast<double>(fsdp.num_parameters());
      row.update({{"preset", cfg.preset},
                  {"world_size", pg.world_size()},
                  {"parameters", P},
                  {"full_state_MB", 12 * P / 1e6}});
      results.add(std::move(row));
    };
    if (resume_only) {
      // [reshard]
      Run fresh(pg, mcfg, /*seed=*/5);  // other weights, no state: everything must come from the files
      ShardedCheckpointInfo info;
      const auto [load_s, load_mb] =
          measured(pg, [&] { info = load_sharded_checkpoint(dir, pg, *fresh.model, *fresh.fsdp, *fresh.opt); });
      print_rank("read {} of the checkpoint's {} files, at most {} at once", info.files_touched, info.files,
                 format_bytes(static_cast<double>(info.largest_held)));
      // The reference: every file assembled on one process (the whole state: this check's cost, not the load's).
      const auto whole = consolidate_sharded_checkpoint(dir, unique_named_parameters(*fresh.model, true));
      const std::string diff = first_difference(gathered_state(pg, *fresh.fsdp, *fresh.opt), whole);
      // [reshard]
      if (!diff.empty())
        throw CheckFailed("the loaded state differs from the files' at " + diff);  // alike on every rank
      fresh.step(pg, cfg, info.step);
      print0(
          "PASS loaded {} (saved by {} at step {}) into {}: every tensor and its AdamW state equal to the whole "
          "state assembled from the files; trained on",
          dir, count_of(info.world_size, "rank"), info.step, count_of(pg.world_size(), "rank"));
      print0("load: {:.2f} s, peak resident memory +{:.0f} MB on the rank that added most", load_s, load_mb);
      add_row({{"operation", "load"},
               {"saved_by", info.world_size},
               {"files_per_rank", most_of(pg, info.files_touched)},
               {"checkpoint_MB", info.bytes / 1e6},
               {"largest_file_MB", most_of(pg, info.largest_held) / 1e6},
               {"rss_added_MB", load_mb},
               {"seconds", load_s}},
              *fresh.fsdp);
    } else {
      Run run(pg, mcfg, /*seed=*/1);
      for (int64_t i = 0; i < cfg.steps; ++i) run.step(pg, cfg, i);
      ShardedCheckpointInfo saved;
      const auto [save_s, save_mb] = measured(pg, [&] {
        saved = save_sharded_checkpoint(dir, pg, *run.model, *run.fsdp, *run.opt, cfg.steps, {{"preset", cfg.preset}});
      });
      // What stage 08's way holds while it saves: the whole state gathered on every rank (measured the same way).
      const auto [gather_s, gather_mb] = measured(pg, [&] { gathered_state(pg, *run.fsdp, *run.opt); });
      print_rank("wrote {}, at most {} at once", count_of(saved.files_touched, "file"),
                 format_bytes(static_cast<double>(saved.largest_held)));
      Run fresh(pg, mcfg, /*seed=*/5);  // other weights, no state: everything must come from the files
      load_sharded_checkpoint(dir, pg, *fresh.model, *fresh.fsdp, *fresh.opt);
      run.step(pg, cfg, cfg.steps);
      fresh.step(pg, cfg, cfg.steps);
      const std::string diff =
          first_difference(gathered_state(pg, *run.fsdp, *run.opt), gathered_state(pg, *fresh.fsdp, *fresh.opt));
      // What stage 08's way would hold on every rank while saving: every parameter and its 2 AdamW tensors, fp32.
      const double full = 12.0 * static_cast<double>(run.fsdp->num_parameters());
      print0(
          "{} checkpoint {} (saved by {} at step {}: {}, {}; at most {} of it on one rank at once, where a gathered "
          "checkpoint holds 12P = {} on every rank): resumed step {} the uninterrupted one",
          diff.empty() ? "PASS" : "FAIL", dir, count_of(saved.world_size, "rank"), saved.step,
          count_of(saved.files, "file"), format_bytes(static_cast<double>(saved.bytes)),
          format_bytes(most_of(pg, saved.largest_held)), format_bytes(full),
          diff.empty() ? "equals" : "DIFFERS (" + diff + ") from");
      if (!diff.empty()) throw CheckFailed("resuming from the sharded checkpoint changed the training");
      print0(
          "save: {:.2f} s, peak resident memory +{:.0f} MB on the rank that added most; gathering the whole state "
          "instead: +{:.0f} MB ({:.2f} s)",
          save_s, save_mb, gather_mb, gather_s);
      add_row({{"operation", "save"},
               {"saved_by", saved.world_size},
               {"files_per_rank", most_of(pg, saved.files_touched)},
               {"checkpoint_MB", saved.bytes / 1e6},
               {"largest_file_MB", most_of(pg, saved.largest_held) / 1e6},
               {"rss_added_MB", save_mb},
               {"seconds", save_s},
               {"gathered_rss_added_MB", gather_mb}},
              *run.fsdp);
    }
    if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    pg.barrier();
    print0("PASS extension 07b: sharded checkpoints resume training exactly, at any world size");
    pg.shutdown();
    return 0;
  });
}
