// Stage 06: ZeRO-1, optimizer-state sharding, checked bit for bit against AdamW, then trained beside stage 05's
// DDP on the common benchmark.
//
// What it adds: AdamW keeps two float32 moments per parameter, twice the model, and plain data
// parallelism keeps them on every rank. ZeRO-1 (Zero1Optimizer) keeps 1/N of them per rank: all parameters
// and gradients live in flat buffers cut into N equal chunks; gradients are reduce-scattered (all-to-all +
// local sum on Gloo), each rank steps its chunk, parameters are all-gathered: 2 x (N-1)/N x 4P bytes per
// rank and step, plain DDP's bytes. Extensions of this stage: 06a cuts the same traffic into stage 05's
// buckets sent from backward's hooks; 06c saves the sharded state for any world size; 06d measures memory
// around the first optimizer step; 06b is CS336's design (whole tensors, one owner each, broadcast).
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage06_sharded_opt                      # checks only
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/stage06_sharded_opt --bench --context 128
// Correct output: "PASS ZeRO-1 AdamW == AdamW on toy" and "on tied" (bit-identical after each of 10
// steps); with --bench the common benchmark's table (no communication, stage 05's DDP, ZeRO-1) and what
// each rank holds after the first step (DDP 16P, ZeRO-1 4P + 4P + 8P/N) and sends per step (both
// 2(N-1)/N x 4P); last, "PASS stage 06".
//
// What it leaves: parameters and gradients stay whole on every rank (4P + 4P). ZeRO-2 keeps only the
// gradient chunk; FSDP (ZeRO-3) shards the parameters too and gathers each layer just in time.
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/harness/optimizer_check.hpp"
#include "common/measure/cli.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/06_sharded_opt/strategies.hpp"

using namespace dp;

int main(int argc, char** argv) {
  Cli cli("stage06_sharded_opt", "Stage 06: ZeRO-1 (sharded AdamW) checked against AdamW, then measured");
  BenchConfig cfg;
  // a short run by default
  cfg.preset = "tiny";
  cfg.context = 64;
  cfg.warmup = 1;
  cfg.steps = 5;
  bool bench = false;
  cli.app().add_flag("--bench", bench, "After the checks, train the Transformer with DDP and ZeRO-1");
  add_bench_options(cli.app(), cfg);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    if (bench) validate_bench_config(cfg, world);                // bad input: exit 2 before any rendezvous
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    print0("process group: backend {}, world size {}, device {}", pg.backend(), pg.world_size(), pg.device().str());

    if (!check_against_adamw(pg, "ZeRO-1 AdamW", zero1_steps)) throw CheckFailed("ZeRO-1 AdamW differs from AdamW");

    if (bench) {
      // [bench]
      std::vector<Variant> variants{{"DDP, 25 MB buckets (stage 05)", bucketed_ddp_strategy(25.0)},
                                    {"ZeRO-1", zero1_strategy()}};
      print_bench_header(pg, cfg);
      Results results("stage06");
      record(results, bench_variants(pg, cfg, variants), cfg, pg.world_size());
      // [bench]
      print0(
          "\n{}\n\nwhat each rank holds after the first step, counted tensor by tensor (MB = 10^6 B; DDP 16P, "
          "ZeRO-1 4P + 4P + 8P/N), and what it sends per step\n{}",
          ddp_table(results), memory_table(results));
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS stage 06: ZeRO-1 AdamW matches plain AdamW bit for bit");
    pg.shutdown();
    return 0;
  });
}
