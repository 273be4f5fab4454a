// Extension 07a, on stage 07: FSDP against stage 05's DDP and stage 06's ZeRO-1, in memory and in time,
// up to a model that DDP cannot hold on this machine.
//
// What it adds: stage 07 measures FSDP on the common benchmark, where every variant trains beside a
// whole no-communication replica, so no model can be larger than one rank holds whole. Here each way of
// training is built alone (no baseline, no single-process row): what a rank holds is counted tensor by
// tensor beside its formula (DDP 16P, ZeRO-1 8P + 8P/N, FSDP 16P/N plus the gathered units at their
// peak), the peak RSS of a process that trained one variant, and the time per step as a ratio to the
// first variant, round by round. Variants that the ranks of this machine cannot hold together are left
// out with a note, so the `large` preset (970 M parameters, 15.5 GB with DDP) trains with FSDP alone.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext07a_fsdp_bench --preset small --context 128
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/ext07a_fsdp_bench --variants ddp,zero1,fsdp
//       --preset small --context 128 --warmup 1 --steps 6 --trace t.json                           (one line)
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext07a_fsdp_bench --preset large --context 32 --batch 2
//       --warmup 0 --steps 2 --variants fsdp --reshard-after-forward true                        (one line)
// Correct output: stage 07's PASS lines (its checks run first), then this extension's own: FSDP trains
// the Transformer it times like one process (SGD with momentum, fp32 and bf16, with and without 2
// accumulated micro-batches; transformer_check.hpp); then a memory table (FSDP near 16P/N, DDP at 16P)
// and a time table (ratios to the first variant round by round); "PASS extension 07a" last.
//
// What it leaves: the figures are one CPU machine's; a GPU changes the ratio of compute to communication.
#include "common/base/format.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/memory.hpp"
#include "common/model/transformer.hpp"
#include "extensions/07a_fsdp_bench/fsdp_bench.hpp"
#include "extensions/07a_fsdp_bench/transformer_check.hpp"
#include "stages/07_fsdp/fsdp.hpp"
#include "stages/07_fsdp/strategies.hpp"

#include <fmt/ranges.h>

using namespace dp;

int main(int argc, char** argv) {
  Cli cli("ext07a_fsdp_bench", "Extension 07a: FSDP against DDP and ZeRO-1 in memory and time");
  FsdpBenchOptions o;
  // a short run by default
  o.cfg.preset = "tiny";
  o.cfg.context = 64;
  o.cfg.warmup = 1;
  o.cfg.steps = 5;
  std::string reshard = "both", dtype = "float32";
  std::vector<std::string> variants{"ddp", "fsdp"};
  add_bench_options(cli.app(), o.cfg);
  cli.app().remove_option(cli.app().get_option("--budget"));
  cli.app().get_option("--steps")->description("Timed steps per variant");
  cli.app()
      .add_option("--variants", variants,
                  "ddp (stage 05, 25 MB buckets), zero1 (stage 06's Zero1Optimizer) and/or fsdp")
      ->delimiter(',')
      ->check(CLI::IsMember({"ddp", "zero1", "fsdp"}));
  add_fsdp_flags(cli.app(), reshard, dtype);  // --reshard-after-forward, --compute-dtype
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    map_large_allocations();  // resident memory follows the live tensors (common/measure/memory.hpp)
    const std::vector<bool> modes = true_false_both(reshard);
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    // Bad input: exit 2 before any rendezvous and before the checks.
    o.cfg.bytes_per_param = 0;  // check_memory below knows each variant's own needs
    validate_bench_config(o.cfg, world);
    o.compute_dtype = parse_compute_dtype(dtype);
    if (cli.app().count("--compute-dtype") && std::find(variants.begin(), variants.end(), "fsdp") == variants.end())
      throw UsageError(
          fmt::format("--compute-dtype {} is the dtype of FSDP's gathered weights, and --variants {} has "
                      "no fsdp: add it, or leave out --compute-dtype",
                      dtype, fmt::join(variants, ",")));
    o.cuda = cli.dist_options().on_gpu();  // the group's device, known before it forms
    o.variants.clear();
    for (const auto& v : variants) {
      if (v != "fsdp")
        o.variants.push_back(v);
      else
        for (bool m : modes) o.variants.push_back(m ? "fsdp" : "fsdp-keep");
    }
    check_memory(o, world);
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    print0("process group: backend {}, world size {}, device {}", pg.backend(), pg.world_size(), pg.device().str());

    if (!run_fsdp_checks(pg, modes, cli.common().seed) || !run_transformer_checks(pg, modes, cli.common().seed))
      throw CheckFailed("FSDP differs from single-process training");

    print0("\n{}", describe(TransformerConfig::preset(o.cfg.preset, o.cfg.context)));
    print0("variants, trained side by side step by step: {}", fmt::join(o.variants, ", "));
    Results results("fsdp");
    run_benchmark(pg, o, results);
    print_tables(results);
    if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    pg.barrier();
    print0("PASS extension 07a: FSDP, DDP and ZeRO-1 measured side by side ({})", count_of(pg.world_size(), "rank"));
    pg.shutdown();
    return 0;
  });
}
