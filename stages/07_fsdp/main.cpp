// Stage 07: FSDP (ZeRO-3). Parameters, gradients and optimizer state sharded over the ranks; each unit
// (the embedding, every Transformer block, the head) gathered just before it computes and freed after.
//
// What it adds: stage 06 sharded the optimizer state, but every rank still held all parameters and all
// gradients, 4P + 4P bytes. FSDP keeps 1/N of everything: 16P/N with AdamW, plus the few units gathered
// at any moment. The price is traffic: each step gathers the weights twice (forward, backward) and
// reduce-scatters the gradients, 3 x (N-1)/N x 4P against DDP's 2 x, which prefetching (gathering the
// next unit while this one computes) hides behind compute. --reshard-after-forward false keeps the
// gathered weights from forward to backward: one gather fewer, more memory (ZeRO-2-like).
// --compute-dtype bf16 gathers bf16 copies of the fp32 master shards and computes in bf16; gradients
// are reduce-scattered and stepped in fp32.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage07_fsdp                        # checks only
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage07_fsdp --bench --preset small --context 128
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/stage07_fsdp --bench --trace t.json
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage07_fsdp --bench --preset large --context 32 --batch 2
//       --warmup 0 --steps 2 --variants fsdp --reshard-after-forward true   (970 M parameters: DDP cannot fit here)
// Correct output: PASS lines for CS336 2026's two FSDP tests (ToyFSDPModel: FSDP equals one process
// within a bound derived from fp32's or bf16's unit roundoff, each line with its difference, bound and
// ratio, e.g. ratio 0.02-0.2; shard-shaped fp32 gradients, replicated ones equal on every
// rank) and for the Transformer, with and without 2 accumulated micro-batches; with --bench a memory table (FSDP near 16P/N, DDP at 16P) and a time
// table (ratios to DDP round by round); last, "PASS stage 07".
//
// What it leaves: every rank still runs the whole model on its own batch (data parallelism only); the
// gathered unit must fit on one device. Tensor and pipeline parallelism split the model itself.
#include "common/accounting.hpp"
#include "common/cli.hpp"
#include "common/ddp_bench.hpp"
#include "common/launch_env.hpp"
#include "common/memory.hpp"
#include "common/models.hpp"
#include "common/runtime.hpp"
#include "common/transformer.hpp"
#include "stages/07_fsdp/benchmark.hpp"
#include "stages/07_fsdp/fsdp.hpp"
#include "stages/07_fsdp/fsdp_check.hpp"

#include <fmt/ranges.h>

using namespace dp;

// Every rank must pass: the verdict is gathered, so all ranks print and exit alike.
static bool everyone(ProcessGroup& pg, bool ok) {
  auto votes = pg.all_gather(ok ? 1.0 : 0.0);
  return std::count(votes.begin(), votes.end(), 1.0) == pg.world_size();
}

static std::string mode(const FsdpOptions& f) {
  return fmt::format("{}, {}", dtype_name(f.compute_dtype), f.reshard_after_forward ? "reshard after forward"
                                                                                         : "keep until backward");
}

// One verdict line per check: the largest difference, its bound, their ratio (the worst over ranks: what
// the margin test, scripts/margins.py, collects) and how the bound was derived.
static bool report(ProcessGroup& pg, const FsdpCheck& c, const std::string& what) {
  const bool ok = everyone(pg, c.ok());
  auto diffs = pg.all_gather(c.max_abs_diff), bounds = pg.all_gather(c.tolerance);
  Margin worst{0, 1};
  for (size_t i = 0; i < diffs.size(); ++i)
    if (Margin m{diffs[i], bounds[i]}; m.ratio() >= worst.ratio()) worst = m;
  print0("{} {}: max |diff| {:.3g} <= {:.3g} (ratio {:.2f}; bound = {})", ok ? "PASS" : "FAIL", what, c.max_abs_diff,
         c.tolerance, worst.ratio(), c.derivation);
  return ok;
}

static bool run_checks(ProcessGroup& pg, const std::vector<bool>& reshard_modes, uint64_t seed) {
  // [checks]
  bool all_ok = true;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (bool reshard : reshard_modes) {
      FsdpOptions f;
      f.compute_dtype = dtype, f.reshard_after_forward = reshard;
      const FsdpCheck toy = check_toy_fsdp(pg, f, seed);
      const bool ok = report(pg, toy, fmt::format("FSDP == one process on ToyFSDPModel ({}; 3 SGD steps, {} ranks)",
                                                  mode(f), pg.world_size()));
      check_fsdp_gradients(pg, f);  // throws CheckFailed
      print0("PASS FSDP gradients ({}): fp32, shard-shaped, replicated ones equal on every rank", mode(f));
      const FsdpCheck tf = check_transformer_fsdp(pg, f, 1, seed);
      const bool ok2 = report(pg, tf, fmt::format("FSDP == one process on a 2-layer Transformer ({}; 3 SGD steps)", mode(f)));
      const FsdpCheck acc = check_transformer_fsdp(pg, f, /*accumulate=*/2, seed);  // shard gradients add up
      const bool ok3 = report(pg, acc, fmt::format("FSDP, 2 micro-batches accumulated per step == one process ({})", mode(f)));
      all_ok = all_ok && ok && ok2 && ok3;
    }
  // [checks]
  return all_ok;
}

int main(int argc, char** argv) {
  Cli cli("stage07_fsdp", "Stage 07: FSDP (parameters, gradients and AdamW state sharded) checked and measured");
  Stage07Options o;
  o.cfg.preset = "tiny", o.cfg.context = 64, o.cfg.warmup = 1, o.cfg.steps = 5;  // a short run by default
  bool bench = false;
  std::string dtype = "float32", reshard = "both";
  std::vector<std::string> variants{"ddp", "fsdp"};
  cli.app().add_flag("--bench", bench, "After the checks, train the Transformer with DDP and FSDP");
  add_bench_options(cli.app(), o.cfg);
  cli.app().remove_option(cli.app().get_option("--budget"));
  cli.app().get_option("--steps")->description("Timed steps per variant");
  cli.app().add_option("--variants", variants,
                       "With --bench: ddp (stage 05, 25 MB buckets), zero1 (stage 06's Zero1Optimizer) and/or fsdp")
      ->delimiter(',')->check(CLI::IsMember({"ddp", "zero1", "fsdp"}));
  cli.app().add_option("--reshard-after-forward", reshard,
                       "true: free gathered weights after forward (ZeRO-3); false: keep them until backward; both")
      ->check(CLI::IsMember({"true", "false", "both"}));
  cli.app().add_option("--compute-dtype", dtype, "With --bench: float32 or bfloat16 (bf16) for FSDP's gathered weights")
      ->check([](const std::string& v) {
        try { parse_compute_dtype(v); } catch (const UsageError& e) { return std::string(e.what()); }
        return std::string();
      });
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    // Memory is this stage's subject: let a freed gathered unit or gradient go back to the OS at once, so
    // that resident memory follows the live tensors (common/memory.hpp says what glibc does otherwise).
    map_large_allocations();
    std::vector<bool> modes;
    if (reshard != "false") modes.push_back(true);
    if (reshard != "true") modes.push_back(false);
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    if (bench) {  // bad input: exit 2 before any rendezvous and before the checks
      o.cfg.bytes_per_param = 0;  // the memory check below knows each variant's own needs
      validate_bench_config(o.cfg, world);
      o.compute_dtype = parse_compute_dtype(dtype);
      o.variants.clear();
      for (const auto& v : variants) {
        if (v != "fsdp") o.variants.push_back(v);
        else for (bool m : modes) o.variants.push_back(m ? "fsdp" : "fsdp-keep");
      }
      check_memory(o, world);
    }
    auto pg = ProcessGroup::init_from_env({cli.common().backend, std::chrono::milliseconds(cli.timeout_ms())});
    print0("process group: backend {}, world size {}, device {}", pg.backend(), pg.world_size(), pg.device().str());

    if (!run_checks(pg, modes, cli.common().seed)) throw CheckFailed("FSDP differs from single-process training");

    if (bench) {
      print0("\n{}", describe(TransformerConfig::preset(o.cfg.preset, o.cfg.context)));
      print0("variants, trained side by side step by step: {}", fmt::join(o.variants, ", "));
      Results results("fsdp");
      run_benchmark(pg, o, results);
      print_tables(results);
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS stage 07: FSDP trains like one process ({} ranks)", pg.world_size());
    pg.shutdown();
    return 0;
  });
}
