// Stage 05: gradient buckets. Gradients are copied into a few flat buckets (reverse registration
// order, up to a cap in MB each, --caps); each bucket is all-reduced with one collective as soon as its last
// gradient is ready, while backward goes on.
//
// What it adds: stage 04 overlapped communication with backward but paid a collective's fixed cost
// once per parameter tensor; stage 03 paid it once but could not overlap. Buckets pay it once per
// bucket and keep the overlap. The bucket size trades the two: the overhead model below predicts it.
//
// It also offers what users of PyTorch's DDP reach for: gradient accumulation (--accumulate K: K
// micro-batches per optimizer step, the first K-1 under no_sync(), no communication) and communication
// hooks (--comm-hook fp16: buckets all-reduced as float16, half the bytes on the wire), and buckets rebuilt
// after the first step in the order gradients arrive (--bucket-order arrival, first bucket 1 MiB at most),
// and the optimizer overlapped with communication (--overlap-optimizer: each bucket's parameters are stepped
// as soon as that bucket arrived, while later ones are still on the wire).
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage05_bucketed                      # checks only
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage05_bucketed --bench --preset small
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/stage05_bucketed --bench --preset tiny --trace t.json
//     (--net: each rank behind a simulated 1 Gbit/s link, root only; --trace: a timeline of every step,
//      python3 scripts/timeline.py t.json draws it)
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage05_bucketed --bench --preset tiny --accumulate 4 --comm-hook fp16
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage05_bucketed --bench --preset tiny --bucket-order arrival
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/stage05_bucketed --bench --preset tiny
//       --variants bucketed --caps 25 --comm-hook allreduce,fp16 --bucket-order reverse,arrival
//       --overlap-optimizer both               (one line; --variants: only these rows; 8 stage 05 rows)
// Correct output: bucket assignments and PASS lines for caps 0.0016, 0.0001 and 0.01 MB; with --bench
// the overhead model's prediction and one table: no communication, stages 02, 03, 04, and stage 05
// at each cap in --caps, all measured in the same run, with overlap efficiency and the speed-up over
// one process. On a 1 Gbit/s link, buckets beat stage 03 by about 15%; over loopback they do not.
// --comm-hook, --bucket-order and --overlap-optimizer take lists: one stage 05 row per cap x hook x order x
// optimizer placement (the checks use the default hook; with arrival among the orders they also print the
// PASS lines with arrival-order buckets). With
// --accumulate K (K > 1) the benchmark ends with "gradient accumulation" lines for K = 1 and K: step time,
// time per sequence, and collectives per sequence (K times fewer with K micro-batches).
//
// What it leaves for the next stage: every rank still keeps a full copy of the optimizer state
// (AdamW: two floats per parameter, twice the model). Stage 06 shards it across ranks.
#include "common/cli.hpp"
#include "common/data.hpp"
#include "common/ddp_bench.hpp"
#include "common/ddp_check.hpp"
#include "common/launch_env.hpp"
#include "common/models.hpp"
#include "common/runtime.hpp"
#include "common/transformer.hpp"
#include "stages/02_naive_ddp/naive_ddp.hpp"
#include "stages/03_flat/flat_ddp.hpp"
#include "stages/04_overlap/overlap_ddp.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/05_bucketed/comm_hooks.hpp"
#include "stages/05_bucketed/feature_bench.hpp"

#include <fmt/ranges.h>

using namespace dp;

template <typename Sync>
static std::unique_ptr<GradSync> make(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) {
  return std::make_unique<Sync>(pg, std::move(m));
}

static void run_checks(ProcessGroup& pg, BucketOrder order, uint64_t seed) {
  // [checks]
  for (double cap : {0.0016, 0.0001, 0.01}) {
    for (const char* model : {"toy", "tied"}) {
      auto make_bucketed = [&](ProcessGroup& g, std::shared_ptr<torch::nn::Module> m) -> std::unique_ptr<GradSync> {
        auto ddp = std::make_unique<BucketedDdp>(g, std::move(m), cap, order);
        print0("{} model, {} MB buckets:\n{}", model, cap, ddp->describe_buckets());
        return ddp;
      };
      const Margin m = check_cs336_scenario(pg, model, make_bucketed, 5, false, seed);
      print0("PASS CS336 scenario ({}, {} MB buckets{}): equals single-process training: max |diff| {:.3g} <= {:.3g} "
             "(ratio {:.2f})", model, cap, order == BucketOrder::arrival ? ", rebuilt in arrival order after step 1" : "",
             m.diff, m.bound, m.ratio());
    }
  }
  // [checks]
}

// The overhead model: one all-reduce of b bytes takes about o + b / w. A 4 kB all-reduce is all
// overhead (4 kB at GB/s is microseconds), so its time is o; a 32 MB one is mostly bytes, so w follows.
struct CommModel {
  double o = 0, w = 0;  // seconds per call, bytes per second
};
static double median_allreduce_s(ProcessGroup& pg, int64_t bytes) {
  auto t = torch::zeros({bytes / 4});
  auto mine = time_iterations([&] { pg.all_reduce(t); }, 3, 15, 5.0);
  auto counts = pg.all_gather(static_cast<double>(mine.size()));
  mine.resize(static_cast<size_t>(*std::min_element(counts.begin(), counts.end())));
  return summarize(max_over_ranks(pg, mine)).median;
}
static CommModel measure_comm_model(ProcessGroup& pg) {
  // [model]
  const double small = 4e3, large = 32e6;  // bytes
  const double t_small = median_allreduce_s(pg, static_cast<int64_t>(small));
  const double t_large = median_allreduce_s(pg, static_cast<int64_t>(large));
  CommModel m;
  m.o = t_small;
  m.w = (large - small) / std::max(t_large - t_small, 1e-9);
  // [model]
  return m;
}

// The stage 05 rows: every cap x hook x bucket order x optimizer (after finish, or overlapped), named by
// what differs from the defaults.
static std::vector<Variant> bucketed_variants(const std::vector<double>& caps, const std::vector<std::string>& hooks,
                                              const std::vector<std::string>& orders, const std::vector<bool>& in_sync) {
  std::vector<Variant> out;
  for (double cap : caps)
    for (const auto& hook : hooks)
      for (const auto& order_name : orders)
        for (bool overlapped : in_sync) {
          const auto order = order_name == "arrival" ? BucketOrder::arrival : BucketOrder::reverse_registration;
          const auto name = fmt::format("bucketed {:g} MB{}{}{} (stage 05)", cap, hook == "allreduce" ? "" : ", " + hook + " hook",
                                        order_name == "arrival" ? ", arrival order" : "", overlapped ? ", optimizer overlapped" : "");
          auto make_ddp = [=](ProcessGroup& g, std::shared_ptr<torch::nn::Module> mod) {
            auto ddp = std::make_unique<BucketedDdp>(g, std::move(mod), cap, order);
            ddp->register_comm_hook(make_comm_hook(hook, g), hook);
            return ddp;
          };
          if (overlapped)  // the benchmark's AdamW, one per parameter, stepped bucket by bucket
            out.emplace_back(name, MakeStrategy([=](ProcessGroup& g, std::shared_ptr<torch::nn::Module> mod,
                                                    const MakeOptimizer& opt) -> std::unique_ptr<Strategy> {
              return std::make_unique<OverlappedOptimizerDdp>(make_ddp(g, std::move(mod)), opt);
            }));
          else
            out.emplace_back(name, MakeGradSync([=](ProcessGroup& g, std::shared_ptr<torch::nn::Module> mod)
                                                    -> std::unique_ptr<GradSync> { return make_ddp(g, std::move(mod)); }));
        }
  return out;
}

// --comm-hook: one of comm_hook_names(), or exit 2 naming the value and the choices.
static const CLI::Validator HookName(
    [](std::string& s) -> std::string {
      const auto names = comm_hook_names();
      if (std::find(names.begin(), names.end(), s) != names.end()) return {};
      return "unknown communication hook '" + s + "': use allreduce, fp16 or bf16";
    },
    "HOOK");

int main(int argc, char** argv) {
  Cli cli("stage05_bucketed", "Stage 05: bucketed DDP overlapped with backward, with the bucket-size overhead model");
  BenchConfig cfg;
  bool bench = false;
  std::vector<double> caps{1, 10, 100, 1000};
  int accumulate = 1;
  std::vector<std::string> hooks{"allreduce"};
  std::vector<std::string> orders{"reverse"};
  cli.app().add_flag("--bench", bench, "After the checks, benchmark the Transformer");
  cli.app().add_option("--caps", caps, "Bucket caps to benchmark, in MB (10^6 bytes)")
      ->delimiter(',')->check(PositiveFinite);
  cli.app().add_option("--accumulate", accumulate,
                       "Micro-batches per optimizer step (K): with --bench, also time K micro-batches of --batch "
                       "under no_sync() against K = 1")->check(PositiveInt);
  cli.app().add_option("--comm-hook", hooks,
                       "How a bucket is reduced: allreduce (fp32), fp16 (half the bytes), bf16 (where the backend "
                       "sums bf16: not Gloo in LibTorch 1.13); a list benchmarks each")->delimiter(',')->check(HookName);
  cli.app().add_option("--bucket-order", orders,
                       "reverse (reverse registration order, fixed) or arrival (rebuilt after the first step in the "
                       "order gradients arrive, first bucket 1 MiB at most); a list benchmarks each")
      ->delimiter(',')->check(CLI::IsMember({"reverse", "arrival"}));
  std::vector<std::string> names{"naive", "flat", "overlap", "bucketed"};
  cli.app().add_option("--variants", names, "Which rows to benchmark besides no communication: naive, flat, overlap, "
                       "bucketed (the stage 05 rows, one per cap)")
      ->delimiter(',')->check(CLI::IsMember({"naive", "flat", "overlap", "bucketed"}));
  std::string overlap_opt = "false";
  cli.app().add_option("--overlap-optimizer", overlap_opt,
                       "Stage 05 rows step AdamW bucket by bucket while later buckets are on the wire: false, true "
                       "or both (a row of each)")->check(CLI::IsMember({"false", "true", "both"}));
  add_bench_options(cli.app(), cfg);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    check_cs336_world_size(world);  // bad input: exit 2 before any rendezvous
    if (bench) validate_bench_config(cfg, world);
    auto pg = ProcessGroup::init_from_env({cli.common().backend, std::chrono::milliseconds(cli.timeout_ms())});
    for (const auto& h : hooks) make_comm_hook(h, pg);  // bf16 without bf16 sums: exit 2 now, not after the checks
    std::vector<bool> overlap_opt_choices;
    if (overlap_opt != "true") overlap_opt_choices.push_back(false);
    if (overlap_opt != "false") overlap_opt_choices.push_back(true);
    const BucketOrder order = orders.front() == "arrival" ? BucketOrder::arrival : BucketOrder::reverse_registration;
    run_checks(pg, BucketOrder::reverse_registration, cli.common().seed);
    if (std::find(orders.begin(), orders.end(), "arrival") != orders.end()) run_checks(pg, BucketOrder::arrival, cli.common().seed);
    check_overlapped_optimizer(pg);

    if (bench) {
      const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
      const double s = 4.0 * mcfg.num_parameters();  // fp32 gradient bytes per step
      auto m = measure_comm_model(pg);
      // After backward, the last bucket (s / n_b bytes) is still to send, and every call costs o:
      //   t(n_b) = s / (n_b w) + n_b o,  minimised at n_b = sqrt(s / (w o)), i.e. a cap of sqrt(s w o).
      const double best_cap_mb = std::sqrt(s * m.w * std::max(m.o, 1e-9)) / 1e6;
      print0("\noverhead model: o = {:.3f} ms per call, w = {:.2f} GB/s, s = {:.1f} MB of gradients -> best cap "
             "sqrt(s w o) = {:.1f} MB", m.o * 1e3, m.w / 1e9, s / 1e6, best_cap_mb);
      print_bench_header(pg, cfg);
      Results results("stage05");
      // [bench]
      std::vector<Variant> variants;
      auto wanted = [&](const char* v) { return std::find(names.begin(), names.end(), v) != names.end(); };
      if (wanted("naive")) variants.push_back({"naive (stage 02)", make<NaiveDdp>});
      if (wanted("flat")) variants.push_back({"flat (stage 03)", make<FlatDdp>});
      if (wanted("overlap")) variants.push_back({"overlap (stage 04)", make<OverlapDdp>});
      if (wanted("bucketed"))
        for (auto& v : bucketed_variants(caps, hooks, orders, overlap_opt_choices)) variants.push_back(std::move(v));
      record(results, bench_variants(pg, cfg, variants), cfg, pg.world_size());
      // [bench]
      results.meta["overhead_model"] = {{"o_s", m.o}, {"w_Bps", m.w}, {"grad_bytes", s},
                                        {"predicted_best_cap_mb", best_cap_mb}};
      print0("\n{}", ddp_table(results));
      results.meta["comm_hook"] = fmt::format("{}", fmt::join(hooks, ","));
      results.meta["bucket_order"] = fmt::format("{}", fmt::join(orders, ","));
      results.meta["overlap_optimizer"] = overlap_opt;
      if (accumulate > 1) results.meta["accumulation"] = bench_accumulation(pg, cfg, accumulate, caps.front(), hooks.front(), order);
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS stage 05: bucketed DDP matches single-process training");
    pg.shutdown();
    return 0;
  });
}
