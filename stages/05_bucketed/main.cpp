// Stage 05: gradient buckets. Gradients are copied into a few flat buckets (reverse registration
// order, up to a cap in MB each, --caps); each bucket is all-reduced with one collective as soon as its last
// gradient is ready, while backward goes on.
//
// What it adds: stage 04 overlapped communication with backward but paid a collective's fixed cost once per
// parameter tensor; stage 03 paid it once but could not overlap. Buckets pay it once per bucket and keep the
// overlap; the overhead model predicts the best bucket size. Built on it (extensions/05*): fp16 hooks (05a),
// buckets in arrival order (05b), the optimizer overlapped (05c), no_sync() accumulation against PyTorch's DDP (05d).
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage05_bucketed                      # checks only
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage05_bucketed --bench --preset small
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/stage05_bucketed --bench --preset tiny --trace t.json
//     (--net: a simulated 1 Gbit/s link per rank, root only; --trace: a timeline, python3 scripts/trace/timeline.py
//     t.json)
// Correct output: bucket assignments and PASS lines for caps 0.0016, 0.0001 and 0.01 MB; with --bench the
// overhead model's prediction and one table: no communication, stages 02-04 and stage 05 at each cap in --caps,
// measured in one run, with overlap efficiency and the speed-up over one process. On a 1 Gbit/s link buckets
// beat stage 03 by about 15%; over loopback they do not.
//
// What it leaves for the next stage: every rank still keeps a full copy of the optimizer state
// (AdamW: two floats per parameter, twice the model). Stage 06 shards it across ranks.
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/timing.hpp"  // CommModel
#include "common/model/transformer.hpp"
#include "stages/02_naive_ddp/naive_ddp.hpp"
#include "stages/03_flat/flat_ddp.hpp"
#include "stages/04_overlap/overlap_ddp.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"

using namespace dp;

static void run_checks(ProcessGroup& pg, uint64_t seed) {
  for (double cap : {0.0016, 0.0001, 0.01})
    for (const char* model : {"toy", "tied"}) {
      auto make_bucketed = [&](ProcessGroup& g, std::shared_ptr<torch::nn::Module> m) -> std::unique_ptr<GradSync> {
        auto ddp = std::make_unique<BucketedDdp>(g, std::move(m), cap);
        print0("{} model, {} MB buckets:\n{}", model, cap, ddp->describe_buckets());
        return ddp;
      };
      report_margin(check_cs336_scenario(pg, model, make_bucketed, 5, false, seed),
                    fmt::format("CS336 scenario ({}, {} MB buckets): equals single-process training", model, cap));
    }
}

int main(int argc, char** argv) {
  Cli cli("stage05_bucketed", "Stage 05: bucketed DDP overlapped with backward, with the bucket-size overhead model");
  BenchConfig cfg;
  bool bench = false;
  std::vector<double> caps{1, 10, 100, 1000};
  cli.app().add_flag("--bench", bench, "After the checks, benchmark the Transformer");
  cli.app()
      .add_option("--caps", caps, "Bucket caps to benchmark, in MB (10^6 bytes)")
      ->delimiter(',')
      ->check(PositiveFinite);
  std::vector<std::string> names{"naive", "flat", "overlap", "bucketed"};
  cli.app()
      .add_option("--variants", names,
                  "Which rows to benchmark besides no communication: naive, flat, overlap, "
                  "bucketed (the stage 05 rows, one per cap)")
      ->delimiter(',')
      ->check(CLI::IsMember({"naive", "flat", "overlap", "bucketed"}));
  add_bench_options(cli.app(), cfg);
  bench_only(cli.app(), {"--caps", "--variants"});
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
      const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
      const double s = 4.0 * mcfg.num_parameters();  // fp32 gradient bytes per step
      // [model]
      // The overhead model (common/measure/timing.hpp): with n_b buckets, t(n_b) = s / (n_b w) + n_b o after
      // backward (the last bucket still to send, o paid per call), least at a cap of sqrt(s w o).
      const CommModel m = measure_comm_model(pg);
      const double best_cap_mb = m.best_bucket_cap_mb(s);
      // [model]
      print0(
          "\noverhead model: o = {:.3f} ms per call, w = {:.2f} GB/s, s = {:.1f} MB of gradients -> best cap "
          "sqrt(s w o) = {:.1f} MB",
          m.o * 1e3, m.w / 1e9, s / 1e6, best_cap_mb);
      print_bench_header(pg, cfg);
      Results results("stage05");
      // [bench]
      std::vector<Variant> variants;
      auto wanted = [&](const char* v) { return std::find(names.begin(), names.end(), v) != names.end(); };
      if (wanted("naive")) variants.push_back({"naive (stage 02)", make_grad_sync<NaiveDdp>()});
      if (wanted("flat")) variants.push_back({"flat (stage 03)", make_grad_sync<FlatDdp>()});
      if (wanted("overlap")) variants.push_back({"overlap (stage 04)", make_grad_sync<OverlapDdp>()});
      if (wanted("bucketed"))
        for (double cap : caps)
          variants.push_back({fmt::format("bucketed {:g} MB (stage 05)", cap), bucketed_ddp_strategy(cap)});
      record(results, bench_variants(pg, cfg, variants), cfg, pg.world_size());
      // [bench]
      results.meta["overhead_model"] = {
          {"o_s", m.o}, {"w_Bps", m.w}, {"grad_bytes", s}, {"predicted_best_cap_mb", best_cap_mb}};
      print0("\n{}", ddp_table(results));
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS stage 05: bucketed DDP matches single-process training");
    pg.shutdown();
    return 0;
  });
}
