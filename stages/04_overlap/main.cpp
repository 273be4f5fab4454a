// Stage 04: overlap communication with backward. Each gradient's all-reduce starts from a hook the
// moment autograd has finished accumulating it, while backward goes on computing earlier layers.
//
// What it adds: stages 02 and 03 waited for backward to finish before sending anything. Backward
// produces gradients last layer first; the last layer's gradient is final long before the first
// layer's, so its all-reduce can travel while the rest of backward runs. after_backward() then only
// waits for what is still in flight.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage04_overlap                       # checks only
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage04_overlap --bench --preset small
// Correct output: the overlap evidence line (how many all-reduces started before backward returned),
// three PASS lines, and with --bench a table: no communication, stage 02 and stage 04 in one run.
//
// What it leaves for the next stage: one collective per parameter tensor again (the per-call cost of
// stage 02, now spread over backward). Stage 05 groups gradients into buckets.
#include "common/base/format.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/cli.hpp"
#include "common/model/data.hpp"
#include "common/model/models.hpp"
#include "common/model/transformer.hpp"
#include "stages/02_naive_ddp/naive_ddp.hpp"
#include "stages/04_overlap/overlap_ddp.hpp"

using namespace dp;

// Overlap is a claim about time, so we show it: one backward of a small Transformer, and we count
// the all-reduces that were launched before loss.backward() returned.
static void show_overlap(ProcessGroup& pg) {
  // [overlap]
  torch::manual_seed(0);
  auto cfg = TransformerConfig::preset("tiny", 32);
  auto model = TransformerLM(cfg);
  model->to(pg.device());
  OverlapDdp ddp(pg, model.ptr());
  auto [x, y] = token_batch(2 * pg.world_size(), 32, cfg.vocab_size, 1, 0);
  ddp.on_train_batch_start();
  lm_loss(model->forward(shard_rows(x, pg.rank(), pg.world_size()).to(pg.device())),
          shard_rows(y, pg.rank(), pg.world_size()).to(pg.device()))
      .backward();
  const auto backward_returned = std::chrono::steady_clock::now();
  ddp.finish_gradient_synchronization();
  int before = 0;
  double earliest_ms = 0;
  for (const auto& l : ddp.launches()) {
    if (l.during_backward && l.time < backward_returned) ++before;
    earliest_ms = std::max(earliest_ms, std::chrono::duration<double, std::milli>(backward_returned - l.time).count());
  }
  // [overlap]
  print0("overlap: {} of {} all-reduces were launched before backward returned (the first {:.1f} ms before)", before,
         ddp.launches().size(), earliest_ms);
  if (before == 0) throw CheckFailed("no all-reduce started during backward: the hooks did not fire");
}

static void run_checks(ProcessGroup& pg, uint64_t seed) {
  print0("toy MLP, batch 100 split over {}, SGD lr 0.01, 10 epochs:", count_of(pg.world_size(), "rank"));
  report_margin(check_toy_mlp_experiment(pg, make_grad_sync<OverlapDdp>(), /*verbose=*/true, seed),
                "toy MLP: DDP weights equal single-process full-batch weights");
  for (const char* model : {"toy", "tied"})
    report_margin(check_cs336_scenario(pg, model, make_grad_sync<OverlapDdp>(), 5, false, seed),
                  fmt::format("CS336 scenario ({}): 5 SGD steps equal single-process training, frozen parameters "
                              "unchanged",
                              model));
  show_overlap(pg);
}

int main(int argc, char** argv) {
  Cli cli("stage04_overlap", "Stage 04: DDP with all-reduces launched from gradient hooks during backward");
  BenchConfig cfg;
  bool bench = false;
  cli.app().add_flag("--bench", bench, "After the checks, benchmark the Transformer");
  add_bench_options(cli.app(), cfg);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    check_cs336_world_size(world);                               // bad input: exit 2 before any rendezvous
    if (bench) validate_bench_config(cfg, world);
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    run_checks(pg, cli.common().seed);

    if (bench) {
      print_bench_header(pg, cfg);
      Results results("stage04");
      std::vector<Variant> variants{{"naive (stage 02)", make_grad_sync<NaiveDdp>()},
                                    {"overlap (stage 04)", make_grad_sync<OverlapDdp>()}};
      record(results, bench_variants(pg, cfg, variants), cfg, pg.world_size());
      print0("\n{}", ddp_table(results));
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS stage 04: overlapped DDP matches single-process training");
    pg.shutdown();
    return 0;
  });
}
