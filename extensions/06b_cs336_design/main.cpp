// Extension 06b, on stage 06: CS336's design of ZeRO-1 (ShardedOptimizer), checked bit for bit against AdamW
// like stage 06's, then trained beside stage 05's DDP and stage 06's ZeRO-1 on the common benchmark.
//
// What it adds: CS336 asks for this design. Every parameter tensor gets one owner (largest first, to the
// least-loaded rank); gradients are all-reduced as in DDP (stage 05's buckets), each rank steps what it
// owns with an ordinary torch::optim optimizer, with each group's own options, then broadcasts it:
// 3 x (N-1)/N x 4P bytes per rank and step, where stage 06's ZeRO-1 sends DDP's 2 x (N-1)/N x 4P. What it
// buys: whole tensors, any parameter groups, groups added during training, no flat buffers. Extensions 06c
// (its checkpoints, at any world size) and 06d (memory around the first step) use this design.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext06b_cs336_design                     # both designs' checks
//   ./build/bin/ddp_launch --nproc 4 -- ./build/bin/ext06b_cs336_design --design cs336      # one design
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/ext06b_cs336_design --bench --context 128
// Correct output: per design, "PASS sharded AdamW == AdamW on toy" and "on tied" (bit-identical after
// each of 10 steps); with --bench the common benchmark's table (no communication, stage 05's DDP, both
// designs) and what each rank holds after the first step (DDP 16P, both designs 4P + 4P + 8P/N) and
// sends per step (DDP and ZeRO-1 2(N-1)/N x 4P, the CS336 design 3(N-1)/N x 4P); last, "PASS extension 06b".
//
// What it leaves: tensor-granular shares are only as balanced as the tensors allow (a rank may own nothing),
// and the third pass over the wire stays: stage 07 builds on stage 06's flat chunks instead.
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/measure/cli.hpp"
#include "extensions/06b_cs336_design/cs336_design.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/06_sharded_opt/strategies.hpp"

using namespace dp;

int main(int argc, char** argv) {
  Cli cli("ext06b_cs336_design",
          "Extension 06b: CS336's sharded AdamW checked against AdamW, then measured beside ZeRO-1");
  BenchConfig cfg;
  // a short run by default
  cfg.preset = "tiny";
  cfg.context = 64;
  cfg.warmup = 1;
  cfg.steps = 5;
  bool bench = false;
  std::string design = "all";
  cli.app().add_flag("--bench", bench, "After the checks, train the Transformer with DDP and the sharded designs");
  add_bench_options(cli.app(), cfg);
  add_design_option(cli.app(), design);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    if (bench) validate_bench_config(cfg, world);                // bad input: exit 2 before any rendezvous
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    print0("process group: backend {}, world size {}, device {}", pg.backend(), pg.world_size(), pg.device().str());

    if (!check_designs(pg, design)) throw CheckFailed("sharded AdamW differs from AdamW");

    if (bench) {
      // [bench]
      std::vector<Variant> variants{{"DDP, 25 MB buckets (stage 05)", bucketed_ddp_strategy(25.0)}};
      for (const auto& d : selected_designs(design))
        variants.push_back(d == "cs336" ? Variant{"CS336 design", cs336_strategy()}
                                        : Variant{"ZeRO-1", zero1_strategy()});
      print_bench_header(pg, cfg);
      Results results("ext06b");
      record(results, bench_variants(pg, cfg, variants), cfg, pg.world_size());
      // [bench]
      print0(
          "\n{}\n\nwhat each rank holds after the first step, counted tensor by tensor (MB = 10^6 B; DDP 16P, "
          "both designs 4P + 4P + 8P/N), and what it sends per step\n{}",
          ddp_table(results), memory_table(results));
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS extension 06b: sharded AdamW ({}) matches plain AdamW bit for bit",
           design == "all"     ? "CS336 design, ZeRO-1"
           : design == "cs336" ? "CS336 design"
                               : design);
    pg.shutdown();
    return 0;
  });
}
