// Extension 06a, on stage 06: true ZeRO-1 in buckets, its reduce-scatters sent from backward (BucketedZero1),
// checked bit for bit against AdamW and measured against stage 05's DDP on the same link.
//
// What it adds: stage 06's Zero1Optimizer reduce-scatters the whole gradient buffer once backward is over and
// all-gathers the whole parameter buffer after its step: two long waits on a slow link, where stage 05's
// DDP sends its buckets while backward still runs. BucketedZero1 groups the parameters as stage 05 does
// (last layers first, about 25 MB each), sends each bucket's reduce-scatter from backward's gradient hooks,
// steps each bucket's chunk and all-gathers it; with its all-gathers left to the next forward (runner()),
// the second half of ZeRO-1's traffic hides behind that forward, which DDP's all-reduce cannot do.
//
// Run it (root, for the simulated link):
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext06a_zero1_buckets                        # checks only
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/ext06a_zero1_buckets --bench --preset tiny
//       --context 128 --warmup 2 --steps 10                                                       (one line)
// Correct output: "PASS bucketed ZeRO-1 AdamW == AdamW on toy" and "on tied" (bit-identical after each of 10
// steps, buckets of 400 bytes); with --bench, bytes per rank of each way of training (parameters,
// gradients, AdamW state, beside 16P and 4P + 4P + 8P/N), then one table: no communication, stage 05's DDP,
// stage 06's flat ZeRO-1, ZeRO-1 in buckets and ZeRO-1 in buckets with the all-gathers behind the next
// forward, measured in the same run; "PASS extension 06a" last.
//
// What it leaves: parameters and gradients stay whole on every rank; FSDP (stage 07) shards them too.
#include "common/base/format.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/harness/optimizer_check.hpp"
#include "common/measure/accounting.hpp"
#include "common/measure/cli.hpp"
#include "common/model/data.hpp"
#include "common/model/transformer.hpp"
#include "extensions/06a_zero1_buckets/bucketed_zero1.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/06_sharded_opt/strategies.hpp"

using namespace dp;
namespace optim = torch::optim;

// [variants]
static std::vector<Variant> variants(double cap_mb) {
  return {{fmt::format("DDP, {:g} MB buckets (stage 05)", cap_mb), bucketed_ddp_strategy(cap_mb)},
          {"ZeRO-1, flat (stage 06)", zero1_strategy()},
          {fmt::format("ZeRO-1 in {:g} MB buckets (06a)", cap_mb), bucketed_zero1_strategy(cap_mb)},
          {fmt::format("ZeRO-1 in {:g} MB buckets, gathers behind forward (06a)", cap_mb),
           bucketed_zero1_strategy(cap_mb, /*overlap_gathers=*/true)}};
}
// [variants]

// What each way of training holds per rank after one step (AdamW's state allocated), counted tensor by
// tensor by its Strategy::bytes(), beside the arithmetic: DDP 16P, ZeRO-1 4P + 4P + 8P/N.
static nlohmann::json memory(ProcessGroup& pg, const BenchConfig& cfg, const std::vector<Variant>& vs) {
  const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  const int64_t P = mcfg.num_parameters();
  const MakeOptimizer adamw = [](std::vector<torch::Tensor> p) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(std::move(p), optim::AdamWOptions(1e-4));
  };
  nlohmann::json out = nlohmann::json::array();
  print0("\nbytes per rank after one step (MB = 10^6 B), counted tensor by tensor:");
  for (const auto& v : vs) {
    torch::manual_seed(0);
    TransformerLM model(mcfg);
    model->to(pg.device());
    auto s = v.make(pg, model.ptr(), adamw);
    auto [gx, gy] = token_batch(cfg.global_batch, cfg.context, mcfg.vocab_size, 7, 0);
    auto x = shard_rows(gx, pg.rank(), pg.world_size()).to(pg.device());
    auto y = shard_rows(gy, pg.rank(), pg.world_size()).to(pg.device());
    s->zero_grad();
    const UnitRunner run = s->runner();
    lm_loss(run ? model->forward_units(x, run) : model->forward(x), y).backward();
    s->after_backward();
    s->step();
    s->full_parameters();  // the gathers a step(false) left: every design ends with whole weights
    const TrainingBytes b = s->bytes();
    const bool zero = v.name.rfind("ZeRO-1", 0) == 0;
    const TrainingBytes expect = zero ? zero1_expected_bytes(P, pg.world_size()) : fp32_training_bytes(P);
    print0("  {}: params {:.1f}, grads {:.1f}, AdamW state {:.1f}, total {:.1f} (arithmetic {}: {:.1f})", v.name,
           b.params / 1e6, b.grads / 1e6, b.state / 1e6, b.total() / 1e6, zero ? "4P + 4P + 8P/N" : "16P",
           expect.total() / 1e6);
    out.push_back({{"variant", v.name},
                   {"param_MB", b.params / 1e6},
                   {"grad_MB", b.grads / 1e6},
                   {"state_MB", b.state / 1e6},
                   {"total_MB", b.total() / 1e6},
                   {"expected_MB", expect.total() / 1e6}});
  }
  return out;
}

int main(int argc, char** argv) {
  Cli cli("ext06a_zero1_buckets", "Extension 06a: ZeRO-1 in buckets sent from backward, against stage 05's DDP");
  BenchConfig cfg;
  bool bench = false;
  double cap = 25;
  cli.app().add_flag("--bench", bench, "After the checks, benchmark the Transformer against stage 05's DDP");
  cli.app()
      .add_option("--cap", cap, "Bucket cap of DDP and of ZeRO-1 in buckets, in MB (10^6 bytes)")
      ->check(PositiveFinite);
  bench_only(cli.app(), {"--cap"});
  add_bench_options(cli.app(), cfg);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    if (bench) validate_bench_config(cfg, world);                // bad input: exit 2 before any rendezvous
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    // [check]
    const bool ok = check_against_adamw(
        pg, "bucketed ZeRO-1 AdamW",
        [](ProcessGroup& g, const std::vector<torch::Tensor>& p, const optim::AdamWOptions& o) {
          // Buckets of 400 bytes: 4 or 5 of them for CS336's models, so buckets leave one by one from backward.
          std::shared_ptr<BucketedZero1> z = BucketedZero1::make<optim::AdamW>(g, p, o, 0.0004);
          return ShardedSteps{[z] { z->zero_grad(); }, [z] { z->step(); }, z->describe(), /*sums_over_ranks=*/true};
        });
    // [check]
    if (!ok) throw CheckFailed("bucketed ZeRO-1 differs from AdamW");

    if (bench) {
      const auto vs = variants(cap);
      Results results("ext06a");
      results.meta["memory"] = memory(pg, cfg, vs);
      print_bench_header(pg, cfg);
      record(results, bench_variants(pg, cfg, vs), cfg, pg.world_size());
      print0("\n{}", ddp_table(results));
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS extension 06a: ZeRO-1 in buckets matches AdamW bit for bit");
    pg.shutdown();
    return 0;
  });
}
