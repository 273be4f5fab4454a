// Extension 05d, on stage 05 and extensions 05a-05c: every feature of stage 05's DDP measured in one run,
// and our side of the comparison against PyTorch's own DDP (scripts/bench/compare_torch_ddp.py runs this
// program and scripts/peers/torch_ddp.py launch by launch on the same simulated link).
//
// What it adds: stage 05's benchmark times one bucketed row per cap. Here every cap x communication hook
// (05a: --comm-hook allreduce,fp16) x bucket order (05b: --bucket-order reverse,arrival) x optimizer
// placement (05c: --overlap-optimizer both) is a row of the same run, so each feature is a ratio against
// the plain row beside it; and --accumulate K times gradient accumulation (K micro-batches per AdamW step,
// the first K-1 under stage 05's no_sync(), no communication) against K = 1.
//
// Run it (root, for the simulated link):
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/ext05d_feature_bench --bench --preset tiny
//       --caps 1,25 --comm-hook allreduce,fp16 --bucket-order reverse,arrival --overlap-optimizer both
//       --accumulate 4                                          (one line; 16 rows, then the accumulation lines)
// Correct output: the CS336 PASS lines with buckets in reverse registration order and, with arrival among
// the orders, rebuilt in arrival order; "PASS optimizer overlapped ... bit-identical"; with --bench one
// table (no communication, then a row per cap x hook x order x optimizer placement, all measured in the
// same run), then with --accumulate K "gradient accumulation" lines for K = 1 and K: step time, time per
// sequence and collectives per sequence (K times fewer with K micro-batches).
//
// What it leaves: measurements only; each feature's idea is in its own folder (05a-05c) and page section.
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/cli.hpp"
#include "common/model/data.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "extensions/05a_comm_hooks/low_precision_hooks.hpp"
#include "extensions/05b_arrival_order/arrival_order_ddp.hpp"
#include "extensions/05c_optimizer_overlap/overlapped_optimizer.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"

#include <fmt/ranges.h>

using namespace dp;

// A stage 05 DDP with `cap` MB buckets, in reverse registration order or rebuilt in arrival order (05b).
static std::unique_ptr<BucketedDdp> make_ddp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m, double cap,
                                             bool arrival) {
  if (arrival) return std::make_unique<ArrivalOrderDdp>(pg, std::move(m), cap);
  return std::make_unique<BucketedDdp>(pg, std::move(m), cap);
}

static void run_checks(ProcessGroup& pg, bool arrival, uint64_t seed) {
  for (double cap : {0.0016, 0.0001, 0.01})
    for (const char* model : {"toy", "tied"}) {
      auto make = [&](ProcessGroup& g, std::shared_ptr<torch::nn::Module> m) -> std::unique_ptr<GradSync> {
        return make_ddp(g, std::move(m), cap, arrival);
      };
      report_margin(check_cs336_scenario(pg, model, make, 5, false, seed),
                    fmt::format("CS336 scenario ({}, {} MB buckets{}): equals single-process training", model, cap,
                                arrival ? ", rebuilt in arrival order after step 1" : ""));
    }
}

// Every cap x hook x bucket order x optimizer placement, named by what differs from stage 05's defaults.
static std::vector<Variant> feature_variants(const std::vector<double>& caps, const std::vector<std::string>& hooks,
                                             const std::vector<std::string>& orders, const std::vector<bool>& in_sync) {
  std::vector<Variant> out;
  for (double cap : caps)
    for (const auto& hook : hooks)
      for (const auto& order : orders)
        for (bool overlapped : in_sync) {
          const bool arrival = order == "arrival";
          const auto name =
              fmt::format("bucketed {:g} MB{}{}{} (stage 05)", cap, hook == "allreduce" ? "" : ", " + hook + " hook",
                          arrival ? ", arrival order" : "", overlapped ? ", optimizer overlapped" : "");
          auto ddp = [=](ProcessGroup& g, std::shared_ptr<torch::nn::Module> mod) {
            auto d = make_ddp(g, std::move(mod), cap, arrival);
            d->register_comm_hook(make_comm_hook(hook, g));
            return d;
          };
          if (overlapped)  // the benchmark's AdamW, one per parameter, stepped bucket by bucket
            out.emplace_back(name, MakeStrategy([=](ProcessGroup& g, std::shared_ptr<torch::nn::Module> mod,
                                                    const MakeOptimizer& opt) -> std::unique_ptr<Strategy> {
                               return std::make_unique<OverlappedOptimizerDdp>(ddp(g, std::move(mod)), opt);
                             }));
          else
            out.emplace_back(name, MakeGradSync([=](ProcessGroup& g, std::shared_ptr<torch::nn::Module> mod)
                                                    -> std::unique_ptr<GradSync> { return ddp(g, std::move(mod)); }));
        }
  return out;
}

// Gradient accumulation on the Transformer: K micro-batches of --batch sequences (split over the ranks) per
// AdamW step, the first K-1 backward passes under no_sync(), against K = 1, interleaved step by step.
static nlohmann::json bench_accumulation(ProcessGroup& pg, const BenchConfig& cfg, int K, double cap,
                                         const std::string& hook, bool arrival) {
  const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  struct Run {
    int k = 1;
    TransformerLM model{nullptr};
    std::unique_ptr<BucketedDdp> ddp;
    std::unique_ptr<torch::optim::AdamW> opt;
    std::vector<double> step_s;
  };
  std::vector<Run> runs;
  for (int k : {1, K}) {
    Run r;
    r.k = k;
    torch::manual_seed(0);
    r.model = TransformerLM(mcfg);
    r.model->to(pg.device());
    r.ddp = make_ddp(pg, r.model.ptr(), cap, arrival);
    r.ddp->register_comm_hook(make_comm_hook(hook, pg));
    r.opt = std::make_unique<torch::optim::AdamW>(unique_parameters(*r.model), torch::optim::AdamWOptions(1e-4));
    runs.push_back(std::move(r));
  }
  for (int i = 0; i < cfg.warmup + cfg.steps; ++i)
    for (auto& r : runs) {
      pg.barrier();
      Timer t(pg.device());
      // [accumulate]
      r.ddp->on_train_batch_start();
      r.opt->zero_grad();
      for (int k = 0; k < r.k; ++k) {
        auto [gx, gy] = token_batch(cfg.global_batch, cfg.context, mcfg.vocab_size, 1234, int64_t{i} * K + k);
        auto x = shard_rows(gx, pg.rank(), pg.world_size()).to(pg.device());
        auto y = shard_rows(gy, pg.rank(), pg.world_size()).to(pg.device());
        // Mean over this micro-batch's tokens, divided by K: the gradient of the mean over all K micro-batches.
        auto loss = lm_loss(r.model->forward(x), y) / r.k;
        if (k + 1 < r.k) {
          NoSyncGuard local_only(*r.ddp);
          loss.backward();
        } else {
          loss.backward();  // launches the buckets, holding the sum of all K backward passes
        }
      }
      r.ddp->finish_gradient_synchronization();
      r.opt->step();
      // [accumulate]
      if (i >= cfg.warmup) r.step_s.push_back(t.seconds());
    }
  nlohmann::json out = nlohmann::json::array();
  print0("\ngradient accumulation ({} MB buckets, {} hook), {} sequences per micro-batch:", cap, hook,
         cfg.global_batch);
  for (auto& r : runs) {
    const Stats s = summarize(max_over_ranks(pg, r.step_s));
    const double seqs = static_cast<double>(r.k * cfg.global_batch);
    print0(
        "  K = {}: step {:.3f} s [{:.3f}-{:.3f}], {:.2f} ms per sequence, {} collectives per step = {:.3f} per "
        "sequence",
        r.k, s.median, s.min, s.max, 1e3 * s.median / seqs, r.ddp->calls_per_step(), r.ddp->calls_per_step() / seqs);
    out.push_back({{"accumulate", r.k},
                   {"step_s", s.median},
                   {"per_sequence_s", s.median / seqs},
                   {"collectives_per_step", r.ddp->calls_per_step()},
                   {"step_samples_s", max_over_ranks(pg, r.step_s)}});
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
  Cli cli("ext05d_feature_bench", "Extension 05d: every feature of stage 05's DDP measured in one run");
  BenchConfig cfg;
  bool bench = false;
  std::vector<double> caps{1, 25};
  int accumulate = 1;
  std::vector<std::string> hooks{"allreduce"};
  std::vector<std::string> orders{"reverse"};
  std::string overlap_opt = "false";
  cli.app().add_flag("--bench", bench, "After the checks, benchmark the Transformer");
  cli.app()
      .add_option("--caps", caps, "Bucket caps to benchmark, in MB (10^6 bytes)")
      ->delimiter(',')
      ->check(PositiveFinite);
  cli.app()
      .add_option("--comm-hook", hooks,
                  "How a bucket is reduced (05a): allreduce (fp32), fp16 (half the bytes), bf16 (where the "
                  "backend sums bf16: not Gloo in LibTorch 1.13); a list benchmarks each")
      ->delimiter(',')
      ->check(HookName);
  cli.app()
      .add_option("--bucket-order", orders,
                  "reverse (stage 05: reverse registration order, fixed) or arrival (05b: rebuilt after the "
                  "first step in the order gradients arrive, first bucket 1 MiB at most); a list benchmarks each")
      ->delimiter(',')
      ->check(CLI::IsMember({"reverse", "arrival"}));
  cli.app()
      .add_option("--overlap-optimizer", overlap_opt,
                  "Step AdamW bucket by bucket while later buckets are on the wire (05c): false, true or both "
                  "(a row of each)")
      ->check(CLI::IsMember({"false", "true", "both"}));
  cli.app()
      .add_option("--accumulate", accumulate,
                  "Micro-batches per optimizer step (K): with --bench, also time K micro-batches of --batch "
                  "under no_sync() against K = 1 (first cap, hook and order)")
      ->check(PositiveInt);
  add_bench_options(cli.app(), cfg);
  bench_only(cli.app(), {"--caps", "--comm-hook", "--overlap-optimizer", "--accumulate"});  // the checks use no hook
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    check_cs336_world_size(world);                               // bad input: exit 2 before any rendezvous
    if (bench) validate_bench_config(cfg, world);
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    for (const auto& h : hooks) make_comm_hook(h, pg);  // bf16 without bf16 sums: exit 2 now, not after the checks
    const bool arrival_first = orders.front() == "arrival";
    const bool any_arrival = std::find(orders.begin(), orders.end(), "arrival") != orders.end();
    run_checks(pg, false, cli.common().seed);
    if (any_arrival) run_checks(pg, true, cli.common().seed);
    check_overlapped_optimizer(pg, [&](ProcessGroup& g, std::shared_ptr<torch::nn::Module> m) {
      return make_ddp(g, std::move(m), 0.001, any_arrival);  // 1 kB buckets: many
    });

    if (bench) {
      std::vector<bool> in_sync;
      if (overlap_opt != "true") in_sync.push_back(false);
      if (overlap_opt != "false") in_sync.push_back(true);
      print_bench_header(pg, cfg);
      Results results("ext05d");
      record(results, bench_variants(pg, cfg, feature_variants(caps, hooks, orders, in_sync)), cfg, pg.world_size());
      print0("\n{}", ddp_table(results));
      results.meta["comm_hook"] = fmt::format("{}", fmt::join(hooks, ","));
      results.meta["bucket_order"] = fmt::format("{}", fmt::join(orders, ","));
      results.meta["overlap_optimizer"] = overlap_opt;
      if (accumulate > 1)
        results.meta["accumulation"] =
            bench_accumulation(pg, cfg, accumulate, caps.front(), hooks.front(), arrival_first);
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS extension 05d: every stage 05 feature matches single-process training");
    pg.shutdown();
    return 0;
  });
}
