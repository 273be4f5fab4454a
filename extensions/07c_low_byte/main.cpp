// Extension 07c, on stage 07: FSDP's weights and gradients in fewer bytes, and the error they cost. A variant is
// named WEIGHTS/GRADIENTS: the wire of each unit's all-gather and of its reduce-scatter (low_byte_fsdp.hpp).
// "fp32/fp32" is stage 07; "int8/int8" gathers block-scaled int8 weights and reduce-scatters int8 gradient pieces
// summed in fp32; "fp32/fp16-lowsum" sums fp16 pieces in fp16, the mistake, for comparison.
//
// What it adds: (1) checks on the launched ranks: each variant's reduce-scatter and all-gather equal their
// one-process models bit for bit (common/comm/low_byte.hpp) and lie within their derived bounds, on buffers of the
// model's tensor sizes. (2) --errors: each format's error against the exact average of real gradients for 2 to 32
// simulated ranks (fp32 sums flat in the ranks, 16-bit sums growing), and the weights' error after one gather.
// (3) --bench: step time and bytes per step of each variant, counted and by formula, the step against stage 07's.
// (4) --curve N: N training steps of each variant on text from a Markov chain, the loss against fp32's.
//
// Run it (root, for the simulated link):
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/ext07c_low_byte --bench --preset tiny
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext07c_low_byte --errors --curve 200
// Correct output: "PASS" lines for the checks; with --errors a table of relative errors per format and simulated
// ranks; with --bench the step table, then a line per variant of MB sent per step (counted and by formula) and its
// step over stage 07's; with --curve the final losses and each variant's distance from fp32's, against the distance
// between two fp32 runs on different data.
//
// What it leaves: the capstone (stage 08) trained with these variants; ZeRO-1's reduce-scatter in fewer bytes.
#include "common/base/errors.hpp"
#include "common/comm/low_byte.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/measure/accounting.hpp"  // zero1_bytes_per_step
#include "common/measure/cli.hpp"
#include "common/measure/error_study.hpp"
#include "common/model/data.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "common/model/units.hpp"
#include "extensions/07c_low_byte/low_byte_fsdp.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>

using namespace dp;

namespace {

struct Options {
  // WEIGHTS/GRADIENTS: stage 07's; each half alone in fewer bytes; both; the mistake (16-bit sums)
  std::vector<std::string> variants{
      "fp32/fp32", "fp32/bf16", "fp32/int8", "bf16/bf16", "int8/fp32", "int8/int8", "fp32/fp16-lowsum",
  };
  int64_t block = 256;
  bool bench = false;
  bool errors = false;
  std::vector<int> error_ranks{2, 3, 4, 8, 16, 32};
  int seeds = 3;
  int curve = 0;
};

// [checks]
// Every wire the variants use, on buffers of the sizes of `model`'s tensors (padded to W chunks, as FSDP's units
// are), drawn alike on every rank: the reduce-scatter (then / W) and the all-gather against their one-process models
// and bounds. Throws dp::CheckFailed on a mismatch.
void run_checks(ProcessGroup& pg, const Options& o, TransformerLM& model) {
  const int W = pg.world_size(), r = pg.rank();
  std::set<std::string> scatters, gathers;
  for (const auto& v : o.variants) {
    const auto low = parse_low_byte_variant(v, o.block);
    if (low.scatter.wire.format != WireFormat::fp32) scatters.insert(v.substr(v.find('/') + 1));
    if (low.gather.format != WireFormat::fp32) gathers.insert(low.gather.name());
  }
  for (const auto& s : scatters) {
    const LowByteOptions opts = parse_low_byte_variant("fp32/" + s, o.block).scatter;
    const bool in_wire = opts.sum == SumIn::wire;
    bool same = true;
    int64_t outside = 0;
    uint64_t draw = 0;
    for (const auto& p : unique_parameters(*model)) {
      const auto L = FlatLayout::of(p.numel(), W);
      std::vector<torch::Tensor> all;  // every rank's gradient buffer, drawn alike on every rank
      for (int k = 0; k < W; ++k) {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(++draw);
        all.push_back(torch::randn({L.padded}, gen) * (k + 1));
      }
      auto out = torch::empty({L.chunk});
      low_byte_reduce_scatter_async(pg, all[r].clone(), out, opts).wait();
      out.div_(W);  // as Fsdp does after the wait
      const auto mine = [&](const torch::Tensor& t) { return t.narrow(0, L.offset(r), L.chunk); };
      same = same && torch::equal(out, mine(low_byte_scatter_average(all, opts)));
      auto exact = torch::zeros({L.padded}, torch::kDouble);
      for (const auto& x : all) exact += x.to(torch::kDouble) / W;
      const auto off = (out.to(torch::kDouble) - mine(exact)).abs();
      outside += (off > mine(low_byte_scatter_bound(all, opts.wire))).sum().item<int64_t>();
    }
    if (!same) throw CheckFailed(fmt::format("reduce-scatter {}: differs from its one-process model", opts.name()));
    if (!in_wire && outside > 0)
      throw CheckFailed(fmt::format("reduce-scatter {}: {} values outside the derived bound", opts.name(), outside));
    print0("PASS reduce-scatter, {}: every tensor's chunk equals the one-process model bit for bit{}", opts.name(),
           in_wire ? "" : ", within the derived bound of the exact average");
  }
  for (const auto& g : gathers) {
    const WireSpec wire = parse_wire_format(g.substr(0, g.find('/')), o.block);
    bool same = true;
    int64_t outside = 0;
    uint64_t draw = 0;
    for (const auto& p : unique_parameters(*model)) {
      const auto L = FlatLayout::of(p.numel(), W);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(++draw);
      auto whole = torch::randn({L.padded}, gen);  // every rank's chunk of it is that rank's shard
      auto full = torch::empty({L.padded});
      low_byte_all_gather_async(pg, whole.narrow(0, L.offset(r), L.chunk), full, wire).wait();
      same = same && torch::equal(full, low_byte_gathered(whole, W, wire));
      outside += ((full - whole).abs() > low_byte_gather_bound(whole, W, wire)).sum().item<int64_t>();
    }
    if (!same || outside > 0)
      throw CheckFailed(fmt::format("all-gather {}: {} ({} values outside one rounding's bound)", wire.name(),
                                    same ? "within" : "differs from its one-process model", outside));
    print0("PASS all-gather, {}: every tensor equals the one-process model bit for bit, within one rounding",
           wire.name());
  }
}
// [checks]

// `x` padded with zeros to a multiple of `world` values, as a unit's flat buffer is.
torch::Tensor padded_to(const torch::Tensor& x, int world) {
  auto out = torch::zeros({FlatLayout::of(x.numel(), world).padded});
  out.narrow(0, 0, x.numel()).copy_(x);
  return out;
}

// [errors]
// --errors (rank 0 alone): the reduce-scatter's error against the exact average of W real gradients, W simulated
// (the model is the collective bit for bit: run_checks), and the weights' error after one gather. A table, and rows.
nlohmann::json error_study(const Options& o, const TransformerConfig& mcfg, uint64_t seed) {
  const int most = *std::max_element(o.error_ranks.begin(), o.error_ranks.end());
  const std::vector<LowByteOptions> kinds{{parse_wire_format("bf16"), SumIn::fp32},
                                          {parse_wire_format("fp16"), SumIn::fp32},
                                          {parse_wire_format("int8", o.block), SumIn::fp32},
                                          {parse_wire_format("bf16"), SumIn::wire},
                                          {parse_wire_format("fp16"), SumIn::wire}};
  nlohmann::json draws = nlohmann::json::array(), weights = nlohmann::json::array();
  for (int s = 0; s < o.seeds; ++s) {
    std::vector<torch::Tensor> grads;  // rank k's: 2 sequences of its own
    for (int k = 0; k < most; ++k) grads.push_back(markov_gradient(mcfg, seed, 2, 1000 * s + k));
    for (int W : o.error_ranks) {
      std::vector<torch::Tensor> xs;
      for (int k = 0; k < W; ++k) xs.push_back(padded_to(grads[k], W));
      auto exact = torch::zeros_like(xs[0], torch::kDouble);
      for (const auto& x : xs) exact += x.to(torch::kDouble) / W;
      for (const auto& k : kinds) {
        auto err = low_byte_scatter_average(xs, k).to(torch::kDouble) - exact;
        double worst = 0;  // |error| / bound, largest over the values (fp32 sums: must be <= 1; 0 / tiny = 0)
        if (k.sum == SumIn::fp32)
          worst = (err.abs() / low_byte_scatter_bound(xs, k.wire).to(torch::kDouble).clamp_min(1e-300))
                      .max()
                      .item<double>();
        if (worst > 1)
          throw CheckFailed(fmt::format("{} at {} ranks: an error {:.2f} x its derived bound", k.name(), W, worst));
        draws.push_back({{"format", k.name()},
                         {"ranks", W},
                         {"seed", s},
                         {"relative_error", (err.norm() / exact.norm()).item<double>()},
                         {"worst_over_bound", worst}});
      }
    }
  }
  std::vector<std::string> formats;
  for (const auto& k : kinds) formats.push_back(k.name());
  const auto summary = error_summary(draws, formats, o.error_ranks,
                                     fmt::format("reduce-scatter: relative error ||avg - exact|| / ||exact|| of {} "
                                                 "gradients, median over {} draws:",
                                                 mcfg.name, o.seeds));
  // The weights: one gather's rounding of the fresh model's, each of 2 ranks' chunks encoded on its own.
  torch::manual_seed(seed);
  TransformerLM model(mcfg);
  std::vector<torch::Tensor> flat;
  for (const auto& p : unique_parameters(*model)) flat.push_back(p.detach().reshape({-1}));
  auto whole = padded_to(torch::cat(flat), 2);
  print0("all-gather of {}'s weights (2 ranks), relative error after one rounding:", mcfg.name);
  for (const char* f : {"bf16", "fp16", "int8"}) {
    const auto wire = parse_wire_format(f, o.block);
    auto err = low_byte_gathered(whole, 2, wire) - whole;
    const double rel = (err.norm() / whole.norm()).item<double>();
    const double worst = (err.abs() / low_byte_gather_bound(whole, 2, wire).clamp_min(1e-30)).max().item<double>();
    if (worst > 1)
      throw CheckFailed(fmt::format("gathered {} weights: an error {:.2f} x its derived bound", wire.name(), worst));
    print0("  {:<10} {:.3e} (worst value / its bound {:.2f})", wire.name(), rel, worst);
    weights.push_back({{"format", wire.name()}, {"relative_error", rel}, {"worst_over_bound", worst}});
  }
  return {{"draws", draws}, {"summary", summary}, {"weights", weights}};
}
// [errors]

// A LowByteFsdp strategy over `model` with AdamW (lr `lr`), the variant `name`.
std::unique_ptr<Strategy> make_strategy(ProcessGroup& pg, TransformerLM& model, const Options& o,
                                        const std::string& name, double lr) {
  const MakeOptimizer adamw = [lr](std::vector<torch::Tensor> p) {
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<torch::optim::AdamW>(std::move(p), torch::optim::AdamWOptions(lr)));
  };
  return low_byte_fsdp_strategy({}, parse_low_byte_variant(name, o.block))(pg, model.ptr(), adamw);
}

// --curve N: N steps of AdamW (lr 1e-3) on Markov-chain text with each variant from the same weights and data, and
// fp32 once more on other data: how far a variant moves the curve, against how far other data moves it.
nlohmann::json loss_curves(ProcessGroup& pg, const Options& o, const BenchConfig& cfg, uint64_t seed) {
  const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  std::vector<std::pair<std::string, uint64_t>> runs;  // (variant, data draw)
  for (const auto& v : o.variants) runs.emplace_back(v, 0);
  runs.emplace_back(o.variants.front(), 1);  // the first variant (fp32's) on other data: the bound
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [variant, data] : runs) {
    torch::manual_seed(seed);
    TransformerLM model(mcfg);
    auto strategy = make_strategy(pg, model, o, variant, 1e-3);
    std::vector<double> losses;
    for (int t = 0; t < o.curve; ++t) {
      auto [gx, gy] = markov_batch(cfg.global_batch, cfg.context, mcfg.vocab_size, 2000 + 7919 * data, t);
      strategy->zero_grad();
      auto loss = lm_loss(model->forward_units(shard_rows(gx, pg.rank(), pg.world_size()), strategy->runner()),
                          shard_rows(gy, pg.rank(), pg.world_size()));
      loss.backward();
      strategy->after_backward();
      strategy->step();
      auto l = loss.detach().reshape({1}).clone();
      pg.all_reduce(l);
      losses.push_back(l.item<double>() / pg.world_size());
    }
    out.push_back({{"variant", variant}, {"data", data}, {"losses", losses}});
  }
  compare_curves(out, "variant");
  return out;
}

// After --bench: each variant's bytes per step, counted by its Fsdp and by formula, and its step over the first
// variant's (stage 07's when it is fp32/fp32), round by round. Formula, per unit u of C_u values per chunk, U units:
// 2U - 1 gathers of (W - 1) chunk_wire_bytes(weights, C_u) (the last unit is not gathered again for backward), U
// reduce-scatters of (W - 1) chunk_wire_bytes(gradients, C_u), and the replicated gradients' fp32 all-reduce. ZeRO-1
// (stage 06): its fp32 all-gather of every parameter, (W - 1) / W x 4P, and its reduce-scatter of one flat buffer.
nlohmann::json bytes_per_step(ProcessGroup& pg, const Options& o, const BenchConfig& cfg, const Results& results) {
  const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  const int W = pg.world_size();
  TransformerLM model(mcfg);
  std::vector<int64_t> chunks;  // each unit's shard, in values: the layout every variant's Fsdp gives it
  int64_t replicated_values = 0;
  for (const auto& unit : tensor_units(model.ptr(), model->units(), is_sharded_module, "ext07c_low_byte")) {
    chunks.push_back(FlatLayout::of(count_elements(unit.sharded), W).chunk);
    replicated_values += count_elements(unit.replicated);
  }
  const auto P = count_elements(unique_parameters(*model));
  const double replicated = 2.0 * (W - 1) / W * 4.0 * static_cast<double>(replicated_values);
  const nlohmann::json* first = nullptr;
  nlohmann::json out = nlohmann::json::array();
  print0("\n{:<20} {:>14} {:>12} {:>10} {:>24}", "variant", "MB sent/step", "by formula", "x first",
         "step x first [min-max]");
  double first_mb = 0;
  for (const auto& v : o.variants) {
    const auto low = parse_low_byte_variant(v, o.block);
    double formula = W > 1 ? replicated : 0;
    const size_t U = low.zero1 ? 0 : chunks.size();
    if (low.zero1) {  // ZeRO-1: one flat buffer of every parameter, reduce-scattered, then all-gathered in fp32
      const auto L = FlatLayout::of(P, W);
      formula = low.scatter.wire.format == WireFormat::fp32
                    ? zero1_bytes_per_step(P, W)
                    : zero1_bytes_per_step(P, W) / 2 + (W - 1) * chunk_wire_bytes(low.scatter.wire, L.chunk);
    }
    for (size_t u = 0; u < U && W > 1; ++u) {
      const int64_t chunk = chunks[u];
      const double gathers = u + 1 == U ? 1 : 2;
      formula += (W - 1) * (gathers * chunk_wire_bytes(low.gather, chunk) + chunk_wire_bytes(low.scatter.wire, chunk));
    }
    const nlohmann::json* row = nullptr;
    for (const auto& r : results.rows())
      if (r["variant"] == v) row = &r;
    if (!row) continue;
    if (!first) first = row;
    std::vector<double> ratio;
    for (size_t i = 0; i < (*row)["step_samples_s"].size(); ++i)
      ratio.push_back((*row)["step_samples_s"][i].get<double>() / (*first)["step_samples_s"][i].get<double>());
    const double mb = (*row)["sent_MB_per_step"];
    if (row == first) first_mb = mb;
    const Stats s = summarize(ratio);
    print0("{:<20} {:>14.2f} {:>12.2f} {:>10} {:>10.3f} [{:.3f}-{:.3f}]", v, mb, formula / 1e6,
           first_mb > 0 ? fmt::format("{:.3f}", mb / first_mb) : "-", s.median, s.min, s.max);
    if (std::abs(mb - formula / 1e6) > 1e-6 * std::max(1.0, mb))
      throw CheckFailed(fmt::format("{}: {:.6f} MB sent per step, the formula says {:.6f}", v, mb, formula / 1e6));
    out.push_back({{"variant", v},
                   {"sent_MB_per_step", mb},
                   {"formula_MB_per_step", formula / 1e6},
                   {"ratio_to_first_samples", ratio}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Cli cli("ext07c_low_byte", "Extension 07c: FSDP's weights and gradients in fewer bytes, and the error they cost");
  Options o;
  BenchConfig cfg;
  cfg.preset = "tiny";
  add_bench_options(cli.app(), cfg);  // before --bench: --preset, --batch and --context serve every part
  cli.app().add_flag("--bench", o.bench, "After the checks, benchmark each variant on the Transformer");
  bench_only(cli.app(), {"--warmup", "--steps", "--budget", "--trace"});
  cli.app().add_flag("--errors", o.errors, "Measure each format's error against the exact average, 2-32 ranks");
  cli.app()
      .add_option("--curve", o.curve, "Train N steps with each variant and compare the losses with fp32's")
      ->check(PositiveInt);
  cli.app()
      .add_option("--variants", o.variants,
                  fmt::format("WEIGHTS/GRADIENTS wires to run; weights: {}; gradients: {}",
                              fmt::join(low_byte_gather_names(), ", "), fmt::join(low_byte_scatter_names(), ", ")))
      ->delimiter(',');
  cli.app().add_option("--block", o.block, "int8: values per scale")->check(PositiveInt);
  cli.app()
      .add_option("--error-ranks", o.error_ranks, "Simulated ranks for --errors")
      ->delimiter(',')
      ->check(PositiveInt);
  cli.app().add_option("--seeds", o.seeds, "Gradient draws per point for --errors")->check(PositiveInt);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    const int world = LaunchEnv::from_environment().world_size;
    validate_bench_config(cfg, world);
    // Bad input before the group forms: unknown names; a block longer than the smallest tensor's shard, which
    // would be mostly padding (each chunk is encoded in whole blocks).
    for (const auto& v : o.variants) parse_low_byte_variant(v, o.block);
    const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
    torch::manual_seed(cli.common().seed);
    TransformerLM model(mcfg);
    int64_t smallest = INT64_MAX;  // values in the smallest unit's shard
    for (const auto& unit : tensor_units(model.ptr(), model->units(), is_sharded_module, "ext07c_low_byte"))
      smallest = std::min(smallest, FlatLayout::of(count_elements(unit.sharded), world).chunk);
    if (o.block > smallest)
      throw UsageError(fmt::format(
          "--block {}: longer than the smallest shard ({} values: a unit over {} ranks); use a block of at most {}",
          o.block, smallest, world, smallest));
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    torch::manual_seed(cli.common().seed + 1 + pg.rank());
    run_checks(pg, o, model);

    Results results("ext07c");
    if (o.bench) {
      std::vector<Variant> variants;
      for (const auto& v : o.variants)
        variants.emplace_back(v, low_byte_fsdp_strategy({}, parse_low_byte_variant(v, o.block)));
      cfg.bytes_per_param = 20;  // one replica's state at a time, sharded: a generous bound
      print_bench_header(pg, cfg);
      record(results, bench_variants(pg, cfg, variants), cfg, pg.world_size());
      print0("\n{}", ddp_table(results));
      results.meta["low_byte"] = bytes_per_step(pg, o, cfg, results);
    }
    if (o.errors && pg.rank() == 0) {
      auto e = error_study(o, mcfg, cli.common().seed);
      results.meta["errors"] = e["draws"];
      results.meta["error_summary"] = e["summary"];
      results.meta["weight_errors"] = e["weights"];
    }
    if (o.curve > 0) results.meta["curves"] = loss_curves(pg, o, cfg, cli.common().seed);
    results.meta["preset"] = cfg.preset;
    results.meta["context"] = cfg.context;
    results.meta["global_batch"] = cfg.global_batch;
    results.meta["variants"] = o.variants;
    results.meta["block"] = o.block;
    if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    pg.barrier();
    print0("PASS extension 07c: every variant checked");
    pg.shutdown();
    return 0;
  });
}
