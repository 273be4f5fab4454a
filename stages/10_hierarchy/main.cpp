// Stage 10: a cluster of nodes. Ranks inside a node talk over fast links, nodes over one slow uplink each: a
// collective that treats all W ranks alike pays the uplink's rate for the whole buffer. Laid out as a mesh of
// M nodes x L ranks (common/dist/mesh.hpp), the slow hop carries only what must cross it.
//
// What it adds: the mesh's two groups (a node's ranks; one rank per node); DDP's buckets all-reduced
// hierarchically (reduce-scatter in the node, all-reduce of a 1/L chunk across nodes, all-gather in the node);
// HSDP, stage 07's FSDP inside each node with the reduced shards all-reduced across nodes, in three flavours of
// gradient accumulation; and gradient-norm clipping that counts every element once, whether a rank holds its
// gradient whole (DDP), a shard of it (ZeRO-1, FSDP) or a shard repeated on every node (HSDP).
//
// Run it (the launcher simulates the nodes: --net-nodes groups the ranks, --net-uplink joins the groups):
//   ./build/bin/ddp_launch --nproc 4 -- ./build/bin/stage10_hierarchy --nodes 2                  # checks only
//   ./build/bin/ddp_launch --nproc 4 --net 10gbit --net-nodes 2 --net-uplink 1gbit -- \
//       ./build/bin/stage10_hierarchy --bench --preset tiny
// Correct output: the bus bandwidth measured inside a node and across nodes, each near its link's rate; PASS
// lines for the hierarchical all-reduce (equal to the flat one within fp32's rounding bound), for hierarchical
// DDP and for HSDP in each flavour (equal to one process), for clipping in DDP, ZeRO-1, FSDP and HSDP (the norm
// and the weights of one process's clip_grad_norm_); with --bench the common table with flat and hierarchical
// DDP, flat FSDP and HSDP, and the bytes each node's uplink carries per step; last, "PASS stage 10".
//
// What it leaves: one uplink per node, one data-parallel dimension. Clusters add tensor and pipeline
// parallelism inside the node, and several NICs per node, each a rail of its own.
#include "common/base/format.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/accounting.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/timing.hpp"
#include "common/measure/tolerance.hpp"
#include "common/model/transformer.hpp"
#include "stages/06_sharded_opt/strategies.hpp"
#include "stages/07_fsdp/strategies.hpp"
#include "stages/10_hierarchy/strategies.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

using namespace dp;

namespace {

// The hierarchical all-reduce against the flat one on 100,003 random numbers per rank: the two sum W terms per
// element in different orders, each within (W-1) x u(fp32) x sum|x| of the exact sum.
bool check_hierarchical_all_reduce(Mesh& mesh, uint64_t seed) {
  ProcessGroup& pg = mesh.world();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 100 + pg.rank());
  const torch::Tensor x = torch::randn({100003}, gen).to(pg.device());
  torch::Tensor flat = x.clone(), hier = x.clone(), sum_abs = x.abs();
  pg.all_reduce(flat);
  pg.all_reduce(sum_abs);
  hierarchical_all_reduce(mesh, hier);
  const int W = pg.world_size();
  const double u = unit_roundoff(torch::kFloat32);
  const double diff = (flat - hier).abs().max().item<double>();
  const double bound = 2.0 * (W - 1) * u * sum_abs.max().item<double>();
  return report_margin(worst_over_ranks(pg, {diff, bound, fmt::format("2 x {} x u(fp32) x max sum|x|", W - 1)}),
                       fmt::format("hierarchical all-reduce == flat all-reduce on {}", mesh.describe()));
}

bool run_checks(Mesh& mesh, uint64_t seed) {
  ProcessGroup& pg = mesh.world();
  const int M = mesh.nodes();
  bool ok = check_hierarchical_all_reduce(mesh, seed);
  StrategyCheck two;  // 2 micro-batches per step: the accumulation flavours differ there
  two.seed = seed;
  two.accumulate = 2;
  ok = report_margin(check_strategy(pg, hierarchical_ddp_strategy(M, 0.001), two),
                     "hierarchical DDP (1 kB buckets) == one process, 2 micro-batches per step") &&
       ok;
  for (const HsdpSync sync : {HsdpSync::every_micro_batch, HsdpSync::all_reduce_last, HsdpSync::none_until_last})
    ok = report_margin(check_strategy(pg, hsdp_strategy(M, {}, sync), two),
                       fmt::format("HSDP ({}) == one process, 2 micro-batches per step", hsdp_sync_name(sync))) &&
         ok;
  StrategyCheck clip;  // ToyFSDPModel's norms here are about 1-3: a limit of 0.2 clips every step
  clip.seed = seed;
  clip.max_grad_norm = 0.2;
  const std::pair<const char*, MakeStrategy> schemes[] = {{"DDP (stage 05)", bucketed_ddp_strategy(0.01)},
                                                          {"ZeRO-1 (stage 06)", zero1_strategy()},
                                                          {"FSDP (stage 07)", fsdp_strategy({})},
                                                          {"HSDP", hsdp_strategy(M)}};
  for (const auto& [name, make] : schemes)
    ok = report_margin(
             check_strategy(pg, make, clip),
             fmt::format("{} clipped to norm 0.2 == one process's clip_grad_norm_ (the norm and the weights)", name)) &&
         ok;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Cli cli("stage10_hierarchy", "Stage 10: a cluster of nodes: hierarchical all-reduce, HSDP and clipping, checked");
  BenchConfig cfg;
  cfg.preset = "tiny";  // a short run by default
  cfg.context = 64;
  cfg.warmup = 1;
  cfg.steps = 5;
  // bench_variants() trains the variants in groups that fit in memory together (about 20 B per parameter each, a
  // replica's at most): small's four rows and 4 ranks go one group at a time here.
  cfg.bytes_per_param = 20;
  bool bench = false;
  int nodes = 0;
  double clip = 0, tier_mb = 16;
  cli.app().add_flag("--bench", bench, "After the checks, benchmark flat and hierarchical DDP, FSDP and HSDP");
  cli.app()
      .add_option("--nodes", nodes, "Nodes of the mesh (default: ddp_launch --net-nodes, else the launch's)")
      ->check(PositiveInt);
  cli.app()
      .add_option("--clip-grad-norm", clip, "With --bench: clip every variant's gradient to this L2 norm (0: off)")
      ->check(CLI::NonNegativeNumber);
  cli.app()
      .add_option("--tier-mb", tier_mb, "MB (10^6 B) of the all-reduce that measures each tier")
      ->check(PositiveFinite);
  std::vector<std::string> names{"ddp", "hier-ddp", "fsdp", "hsdp"};
  cli.app()
      .add_option("--variants", names, "With --bench: the rows besides no communication: ddp, hier-ddp, fsdp, hsdp")
      ->delimiter(',')
      ->check(CLI::IsMember({"ddp", "hier-ddp", "fsdp", "hsdp"}));
  cli.app()
      .add_option("--accumulate", cfg.accumulate, "With --bench: micro-batches per step (HSDP's flavours differ there)")
      ->check(PositiveInt);
  add_bench_options(cli.app(), cfg);
  bench_only(cli.app(), {"--clip-grad-norm", "--accumulate", "--variants"});
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    const int world = LaunchEnv::from_environment().world_size;  // known before the group forms
    const std::string given =
        nodes > 0 ? "--nodes" : "the launch's nodes (ddp_launch --net-nodes, or LOCAL_WORLD_SIZE)";
    if (nodes == 0) nodes = nodes_from_environment();
    if (world % nodes != 0)  // bad input: exit 2 before any rendezvous
      throw UsageError(
          fmt::format("{} = {} does not divide the {} ranks into equal nodes; give --nodes N with N "
                      "a divisor of {}",
                      given, nodes, world, world));
    if (bench) validate_bench_config(cfg, world);
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    Mesh mesh = Mesh::make(pg, nodes);
    print0("process group: backend {}, {} as a mesh of {}", pg.backend(), count_of(pg.world_size(), "rank"),
           mesh.describe());
    const nlohmann::json tiers = measure_tiers(mesh, tier_mb * 1e6);
    if (!run_checks(mesh, cli.common().seed)) throw CheckFailed("stage 10 differs from single-process training");

    if (bench) {
      // [bench]
      const int M = mesh.nodes(), L = mesh.per_node();
      // Each row's scheme in common/measure/accounting.hpp's uplink_bytes_per_step(), and its strategy.
      std::vector<std::pair<std::string, MakeStrategy>> schemes;
      auto wanted = [&](const char* v) { return std::find(names.begin(), names.end(), v) != names.end(); };
      if (wanted("ddp")) schemes.push_back({"DDP, flat ring", bucketed_ddp_strategy(25)});
      if (wanted("hier-ddp")) schemes.push_back({"DDP, hierarchical", hierarchical_ddp_strategy(M, 25)});
      if (wanted("fsdp")) schemes.push_back({"FSDP, flat", fsdp_strategy({})});
      if (wanted("hsdp")) schemes.push_back({"HSDP", hsdp_strategy(M)});
      // With micro-batches, HSDP in each flavour (what crosses the uplink K times or once) in place of the flat rows.
      if (cfg.accumulate > 1)
        schemes = {{"HSDP, every micro-batch", hsdp_strategy(M, {}, HsdpSync::every_micro_batch)},
                   {"HSDP", hsdp_strategy(M, {}, HsdpSync::all_reduce_last)},
                   {"HSDP, nothing until the last", hsdp_strategy(M, {}, HsdpSync::none_until_last)}};
      std::vector<Variant> variants;
      for (const auto& [name, make] : schemes) variants.push_back({name, with_max_grad_norm(make, clip)});
      print_bench_header(pg, cfg);
      Results results("stage10");
      record(results, bench_variants(pg, cfg, variants), cfg, pg.world_size());
      // [bench]
      const int64_t P = TransformerConfig::preset(cfg.preset, cfg.context).num_parameters();
      std::string table = "| variant | uplink MB per step per node (formula) |\n|---|---:|\n";
      for (const auto& [name, make] : schemes) {
        const double uplink = uplink_bytes_per_step(name, P, M, L, cfg.accumulate);
        table += fmt::format("| {} | {:.2f} |\n", name, uplink / 1e6);
        results.meta["uplink_bytes_per_step"][name] = uplink;
      }
      results.meta["mesh"] = {{"nodes", M}, {"per_node", L}};
      results.meta["tiers"] = tiers;  // each tier's bus bandwidth alone, measured before the checks
      print0("\n{}\n\nwhat each node's uplink carries per step, each direction, on {} (MB = 10^6 B)\n{}",
             ddp_table(results), mesh.describe(), table);
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS stage 10: the hierarchy's collectives, HSDP and clipping train like one process ({})",
           mesh.describe());
    pg.shutdown();
    return 0;
  });
}
