// Stage 02: naive DDP. Broadcast the weights once, then one all-reduce per gradient after backward.
//
// What it adds: data parallelism. Every rank holds the whole model and trains on its own slice of the
// batch; averaging the gradients over ranks makes every rank take exactly the step that one process
// would take on the whole batch. Two things make that true: all ranks start from the same weights
// (broadcast from rank 0), and the averaged gradient equals the full-batch gradient (mean losses over
// equal shards).
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage02_naive_ddp                    # checks only
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage02_naive_ddp --bench --preset small
// Correct output: per-tensor differences from single-process training (1e-8 or so: float rounding), then
// "PASS" lines for the toy MLP and both CS336 models, each with its largest difference, the bound derived
// from fp32's unit roundoff (docs/tolerances.md) and their ratio; with --bench a table of step and sync times.
//
// What it leaves for the next stage: one collective per parameter tensor. Each call pays a fixed
// latency, and a Transformer has hundreds of tensors. Stage 03 sends them all in one call.
#include "common/base/format.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/cli.hpp"
#include "stages/02_naive_ddp/naive_ddp.hpp"

using namespace dp;

// Correct before fast: the program refuses to time anything it has not checked.
static void run_checks(ProcessGroup& pg, uint64_t seed) {
  // [checks]
  print0("toy MLP, batch 100 split over {}, SGD lr 0.01, 10 epochs:", count_of(pg.world_size(), "rank"));
  report_margin(check_toy_mlp_experiment(pg, make_grad_sync<NaiveDdp>(), /*verbose=*/true, seed),
                "toy MLP: DDP weights equal single-process full-batch weights");
  for (const char* model : {"toy", "tied"})
    report_margin(check_cs336_scenario(pg, model, make_grad_sync<NaiveDdp>(), 5, false, seed),
                  fmt::format("CS336 scenario ({}): 5 SGD steps equal single-process training, frozen parameters "
                              "unchanged",
                              model));
  // [checks]
}

int main(int argc, char** argv) {
  Cli cli("stage02_naive_ddp", "Stage 02: naive DDP (one all-reduce per gradient), checked, then benchmarked");
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
      Results results("stage02");
      // The baseline, the same per-rank work with no communication at all, is measured alongside.
      record(results, bench_variants(pg, cfg, {{"naive (stage 02)", make_grad_sync<NaiveDdp>()}}), cfg,
             pg.world_size());
      print0("\n{}", ddp_table(results));
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS stage 02: naive DDP matches single-process training");
    pg.shutdown();
    return 0;
  });
}
