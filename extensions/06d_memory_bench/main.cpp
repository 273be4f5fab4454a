// Extension 06d, on stage 06 (and extension 06b's design): memory around the first optimizer step, one way of training
// at a time (CS336's optimizer_state_sharding_accounting), and the time of each step and of its optimizer.step().
//
// What it adds: stage 06 and extension 06b train their designs beside DDP on the common benchmark, where what a rank
// holds is counted tensor by tensor but one process holds every variant, so its peak RSS says nothing about
// any one of them. Here plain AdamW (after stage 05's DDP), the CS336 design and true ZeRO-1, each the
// dp::Strategy its stage gives, are trained one after the other; each is measured right before and right
// after its first optimizer step, where AdamW allocates its state (tensor bytes beside 8P/N and
// 4P + 4P + 8P/N, peak RSS, the buffers each keeps for communication), then timed, with the optimizer's own
// share (ZeRO-1's holds all its communication). One --optimizer and --design per process gives each its own
// peak RSS.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext06d_memory_bench --preset small --context 128
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext06d_memory_bench --optimizer sharded --design cs336
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/ext06d_memory_bench --context 128 --steps 10
// Correct output: the designs' PASS lines (extension 06b's checks run first), then a memory table and a time table, one
// row per optimizer; "PASS extension 06d" last.
//
// What it leaves: the optimizer's state is the only thing sharded; stage 07's FSDP shards the rest.
#include "common/base/format.hpp"
#include "common/base/trace.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/trace_write.hpp"
#include "common/model/transformer.hpp"
#include "extensions/06b_cs336_design/cs336_design.hpp"
#include "extensions/06d_memory_bench/memory_bench.hpp"

using namespace dp;

int main(int argc, char** argv) {
  Cli cli(
      "ext06d_memory_bench",
      "Extension 06d: memory around the first optimizer step, AdamW and the ZeRO-1 designs (stage 06, extension 06b)");
  MemoryBenchOptions o;
  // a short run by default
  o.cfg.preset = "tiny";
  o.cfg.context = 64;
  o.cfg.warmup = 1;
  o.cfg.steps = 5;
  o.cfg.bytes_per_param = 20;  // one replica at a time, plain AdamW's: 16 B + buffers
  add_bench_options(cli.app(), o.cfg);
  cli.app().remove_option(cli.app().get_option("--budget"));  // every step here is timed to its end
  cli.app().get_option("--steps")->description("Timed steps per optimizer");
  cli.app()
      .add_option("--optimizer", o.which, "adamw, sharded or both (one per process gives the cleanest peak RSS)")
      ->check(CLI::IsMember({"adamw", "sharded", "both"}));
  add_design_option(cli.app(), o.design);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    validate_bench_config(o.cfg, world);                         // bad input: exit 2 before any rendezvous
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    print0("process group: backend {}, world size {}, device {}", pg.backend(), pg.world_size(), pg.device().str());

    if (!check_designs(pg, o.design)) throw CheckFailed("sharded AdamW differs from AdamW");

    print0("\n{}", describe(TransformerConfig::preset(o.cfg.preset, o.cfg.context)));
    Results results("sharded_optimizer");
    if (!o.cfg.trace.empty()) {
      pg.barrier();
      trace::enable();
    }
    run_benchmark(pg, o, results);
    if (!o.cfg.trace.empty()) {
      trace::write(pg, o.cfg.trace);
      print0("trace of the timed steps written to {}", o.cfg.trace);
    }
    print_tables(results);
    if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    pg.barrier();
    print0("PASS extension 06d: AdamW and the sharded designs measured one at a time ({})",
           count_of(pg.world_size(), "rank"));
    pg.shutdown();
    return 0;
  });
}
