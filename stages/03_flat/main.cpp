// Stage 03: one flattened all-reduce for all gradients.
//
// What it adds: stage 02 made one collective call per parameter tensor; here every gradient is
// copied into one flat buffer, reduced with one call, and copied back. Same maths, same checks, one
// fixed per-call latency instead of hundreds, at the price of two extra copies of the gradients.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage03_flat                          # checks only
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage03_flat --bench --preset small
// Correct output: as stage 02 (per-tensor differences, three PASS lines with their bounds); with --bench a
// table comparing no communication, stage 02 and stage 03 measured in the same run.
//
// What it leaves for the next stage: the all-reduce still starts only after backward has finished,
// so communication and computation never overlap. Stage 04 starts each gradient's all-reduce as
// soon as backward has produced it.
#include "common/base/format.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/cli.hpp"
#include "stages/02_naive_ddp/naive_ddp.hpp"
#include "stages/03_flat/flat_ddp.hpp"

using namespace dp;

// Correct before fast: the program refuses to time anything it has not checked.
static void run_checks(ProcessGroup& pg, uint64_t seed) {
  print0("toy MLP, batch 100 split over {}, SGD lr 0.01, 10 epochs:", count_of(pg.world_size(), "rank"));
  report_margin(check_toy_mlp_experiment(pg, make_grad_sync<FlatDdp>(), /*verbose=*/true, seed),
                "toy MLP: DDP weights equal single-process full-batch weights");
  for (const char* model : {"toy", "tied"})
    report_margin(check_cs336_scenario(pg, model, make_grad_sync<FlatDdp>(), 5, false, seed),
                  fmt::format("CS336 scenario ({}): 5 SGD steps equal single-process training, frozen parameters "
                              "unchanged",
                              model));
}

int main(int argc, char** argv) {
  Cli cli("stage03_flat", "Stage 03: DDP with one flattened all-reduce, checked, then benchmarked against stage 02");
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
      Results results("stage03");
      // [bench]
      // Stage 02's way and stage 03's way in the same run, taking turns step by step: compare ratios.
      record(results,
             bench_variants(
                 pg, cfg,
                 {{"naive (stage 02)", make_grad_sync<NaiveDdp>()}, {"flat (stage 03)", make_grad_sync<FlatDdp>()}}),
             cfg, pg.world_size());
      // [bench]
      print0("\n{}", ddp_table(results));
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS stage 03: flattened DDP matches single-process training");
    pg.shutdown();
    return 0;
  });
}
