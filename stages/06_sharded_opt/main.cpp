// Stage 06: ZeRO-1 optimizer-state sharding in two designs, checked bit for bit against AdamW; memory,
// bytes and speed side by side; resume.
//
// What it adds: AdamW keeps two float32 moments per parameter, twice the model, and plain data
// parallelism keeps them on every rank. Both designs keep 1/N of them per rank. The CS336 design
// (ShardedOptimizer) gives every parameter tensor one owner (largest first, to the least-loaded rank):
// gradients are all-reduced as in DDP, each rank steps what it owns with an ordinary torch::optim
// optimizer, then broadcasts it: 3 x (N-1)/N x 4P bytes per rank and step. True ZeRO-1 (Zero1Optimizer)
// puts all parameters and gradients in flat buffers cut into N equal chunks: gradients are
// reduce-scattered (all-to-all + local sum on Gloo), each rank steps its chunk, parameters are
// all-gathered: 2 x (N-1)/N x 4P, plain DDP's bytes. (extensions/06a_zero1_buckets cuts the same traffic
// into stage 05's buckets and sends each bucket's reduce-scatter from backward's hooks, as DDP does.)
// (Checkpoints of the sharded state, loadable at any world size: extensions/06b_checkpoints.)
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage06_sharded_opt                      # checks only
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage06_sharded_opt --bench --preset tiny
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage06_sharded_opt --bench --preset small --context 128
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage06_sharded_opt --bench --design zero1  # one design
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/stage06_sharded_opt --bench --context 128 --steps 10
// --batch is the global batch, split over the ranks as in stages 02-05: the default 4 is 2 sequences per
// rank with 2 ranks (other defaults keep a run short: --preset tiny --context 64 --warmup 1 --steps 5).
// Correct output: per design, "PASS sharded AdamW == AdamW on toy" and "on tied" (bit-identical after
// each of 10 steps); with --bench, per variant the bytes of parameters, gradients and state beside
// 4P + 4P + 8P/N, peak RSS (the process's view: run one --optimizer/--design per process for the
// cleanest peaks), bytes sent per step and step times; last, "PASS stage 06".
//
// What it leaves: parameters and gradients stay whole on every rank (4P + 4P). ZeRO-2 keeps only the
// gradient chunk; FSDP (ZeRO-3) shards the parameters too and gathers each layer just in time.
#include "common/accounting.hpp"
#include "common/cli.hpp"
#include "common/ddp_bench.hpp"
#include "common/ddp_check.hpp"
#include "common/launch_env.hpp"
#include "common/memory.hpp"
#include "common/models.hpp"
#include "common/params.hpp"
#include "common/runtime.hpp"
#include "common/trace.hpp"
#include "common/trace_write.hpp"
#include "common/transformer.hpp"
#include "stages/06_sharded_opt/adamw_check.hpp"
#include "stages/06_sharded_opt/benchmark.hpp"
#include "stages/06_sharded_opt/sharded_optimizer.hpp"
#include "stages/06_sharded_opt/zero1_optimizer.hpp"

#include <filesystem>

using namespace dp;
namespace optim = torch::optim;

// --design: a misspelt design is refused with the value and the choices (exit 2, as every bad input).
static std::string check_design(const std::string& v) {
  if (v == "cs336" || v == "zero1" || v == "all") return {};
  return "unknown design '" + v + "': use cs336 (all-reduce, step the owned tensors, broadcast), zero1 "
         "(reduce-scatter, step a flat chunk, all-gather) or all (ZeRO-1 in buckets: ext06a_zero1_buckets)";
}

int main(int argc, char** argv) {
  Cli cli("stage06_sharded_opt", "Stage 06: sharded AdamW (ZeRO-1, two designs) checked against AdamW, memory and speed");
  Stage06Options o;
  o.cfg.preset = "tiny", o.cfg.context = 64, o.cfg.warmup = 1, o.cfg.steps = 5;  // a short run by default
  o.cfg.bytes_per_param = 20;  // one replica at a time, plain AdamW's: 16 B + buffers
  bool bench = false;
  cli.app().add_flag("--bench", bench, "After the checks, train the Transformer with AdamW and the sharded designs");
  add_bench_options(cli.app(), o.cfg);
  cli.app().remove_option(cli.app().get_option("--budget"));  // every step here is timed to its end
  cli.app().get_option("--steps")->description("Timed steps per optimizer");
  cli.app().add_option("--optimizer", o.which,
                       "With --bench: adamw, sharded or both (one per process gives the cleanest peak RSS)")
      ->check(CLI::IsMember({"adamw", "sharded", "both"}));
  cli.app().add_option("--design", o.design,
                       "Which sharded design to check and benchmark: cs336 (all-reduce + broadcast), zero1 "
                       "(reduce-scatter + all-gather) or all")
      ->check(check_design);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    if (bench) validate_bench_config(o.cfg, world);  // bad input: exit 2 before any rendezvous
    auto pg = ProcessGroup::init_from_env({cli.common().backend, std::chrono::milliseconds(cli.timeout_ms())});
    print0("process group: backend {}, world size {}, device {}", pg.backend(), pg.world_size(), pg.device().str());

    bool all_ok = true;
    for (const auto& design : selected_designs(o.design))
      all_ok = check_against_adamw(pg, design == "zero1" ? "ZeRO-1 AdamW" : "sharded AdamW",
                                   [&](ProcessGroup& g, const std::vector<torch::Tensor>& p, const optim::AdamWOptions& opts) {
                                     return sharded_steps(design, g, p, opts);
                                   }) && all_ok;
    if (!all_ok) throw CheckFailed("sharded AdamW differs from AdamW");

    if (bench) {
      print0("\n{}", describe(TransformerConfig::preset(o.cfg.preset, o.cfg.context)));
      Results results("sharded_optimizer");
      if (!o.cfg.trace.empty()) pg.barrier(), trace::enable();
      run_benchmark(pg, o, results);
      if (!o.cfg.trace.empty()) trace::write(pg, o.cfg.trace), print0("trace of the timed steps written to {}", o.cfg.trace);
      print_tables(results);
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS stage 06: sharded AdamW ({}) matches plain AdamW bit for bit",
           o.design == "all" ? "CS336 design, ZeRO-1" : o.design == "cs336" ? "CS336 design" : o.design);
    pg.shutdown();
    return 0;
  });
}
