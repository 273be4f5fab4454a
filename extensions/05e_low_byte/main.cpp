// Extension 05e, on stage 05 and extension 05a: gradients that cost fewer bytes, and what the fewer bytes cost in
// error. Every hook here is a stage 05 communication hook (register_comm_hook): bf16, fp16 or block-scaled int8 on
// the wire with every sum in fp32 (common/comm/low_byte.hpp), PowerSGD's rank-r approximation with error feedback
// (powersgd.hpp), against the fp32 all-reduce and extension 05a's fp16 hook, whose sums are in fp16.
//
// What it adds: (1) checks on the launched ranks: each rounding hook equals its one-process model bit for bit and
// lies within its derived bound of the exact average; PowerSGD's error feedback keeps its books (applied + owed =
// produced). (2) --errors: the error of each format against the exact average of real Transformer gradients, for
// 2 to 32 simulated ranks, fp32 sums against 16-bit sums. (3) --bench: step time and bytes per step of each hook,
// and the step's ratio to the fp32 lower bound (forward + max(backward, one fp32 all-reduce) + optimizer).
// (4) --curve N: N training steps of each hook on text from a Markov chain, the loss against fp32's.
//
// Run it (root, for the simulated link):
//   ./build/bin/ddp_launch --nproc 2 --net 1gbit -- ./build/bin/ext05e_low_byte --bench --preset tiny
//       --hooks fp32,fp16-allreduce,bf16,fp16,int8,powersgd                        (one line)
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext05e_low_byte --errors --curve 200
// Correct output: "PASS" lines for the checks; with --errors a table of relative errors per format and simulated
// ranks (the fp32-sum rows flat in the ranks, the 16-bit-sum rows growing); with --bench the table of steps, with
// a line per hook of MB sent per step and x lower bound; with --curve the final losses and each hook's distance from
// fp32's, against the distance between two fp32 runs on different data.
//
// What it leaves: FSDP's and ZeRO's reduce-scatter and all-gather in few bytes (the same wire formats, sharded).
#include "common/base/errors.hpp"
#include "common/comm/low_byte.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/error_study.hpp"
#include "common/model/data.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "extensions/05e_low_byte/low_byte_hook.hpp"
#include "extensions/05e_low_byte/powersgd.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

using namespace dp;

namespace {

struct Options {
  std::vector<std::string> hooks{"fp32", "fp16-allreduce", "bf16", "fp16", "int8", "powersgd"};
  LowByteHookOptions hook;
  double cap = 25;
  bool bench = false;
  bool errors = false;
  std::vector<int> error_ranks{2, 4, 8, 16, 32};
  int seeds = 3;
  int curve = 0;
  std::string curve_optimizer = "adamw";  ///< --curve's: AdamW (lr 1e-3) or SGD with momentum 0.9 (lr 0.05)
};

// A stage 05 DDP of `cap` MB buckets with the hook `name`; `sent` (if given) receives its byte counter.
std::unique_ptr<BucketedDdp> make_ddp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m, const Options& o,
                                      const std::string& name, std::function<int64_t()>* sent = nullptr) {
  auto ddp = std::make_unique<BucketedDdp>(pg, std::move(m), o.cap);
  auto h = make_low_byte_hook(name, pg, *ddp, o.hook);
  ddp->register_comm_hook(h.hook);
  if (sent) *sent = h.sent_bytes;
  return ddp;
}

// PowerSGD's books, over 4 steps of one bucket (a 24 x 40 matrix, a vector of 24, rank 2: well below full rank):
// what was applied plus what every rank still owes (its error memory), averaged, equals what was produced (the
// exact average of the gradients). Each side is a sum of at most 8 fp32 results of size up to S = max |gradient| +
// max |error| (steps x (applied, owed) and the products behind them); 64 u32 S covers their roundings with margin.
void check_powersgd_books(ProcessGroup& pg, const Options& o) {
  const int W = pg.world_size();
  PowerSgdOptions p;
  p.rank = std::min(2, o.hook.powersgd_rank);
  p.seed = o.hook.seed;
  PowerSgd state({{{24, 40}, {24}}}, p);
  auto applied = torch::zeros({24 * 40 + 24}, torch::kDouble);
  auto produced = torch::zeros_like(applied);
  double size = 0;
  for (int t = 0; t < 4; ++t) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 10 * t + pg.rank());
    auto g = torch::randn({24 * 40 + 24}, gen);
    auto avg = g.clone();
    pg.all_reduce(avg);
    produced += avg.to(torch::kDouble) / W;
    size = std::max(size, g.abs().max().item<double>() + state.error(0).abs().max().item<double>());
    auto bucket = g.clone();
    state.launch(pg, bucket, "powersgd check").wait();
    applied += bucket.to(torch::kDouble);
  }
  auto owed = state.error(0).clone();
  pg.all_reduce(owed);
  const double off = (applied + owed.to(torch::kDouble) / W - produced).abs().max().item<double>();
  const double bound = 64 * std::ldexp(1.0, -24) * size;
  if (off > bound)
    throw CheckFailed(
        fmt::format("PowerSGD: applied + owed differs from produced by {:.3g} (bound {:.3g})", off, bound));
  print0(
      "PASS hook powersgd (rank {}, error feedback): applied + owed = produced over 4 steps, within {:.2g} (bound "
      "{:.2g})",
      p.rank, off, bound);
}

// [checks]
// Each rounding hook's collective against its one-process model and its bound, on buffers of the sizes of
// `model`'s gradients; PowerSGD's books. Throws dp::CheckFailed on a mismatch.
void run_checks(ProcessGroup& pg, const Options& o, TransformerLM& model) {
  std::vector<int64_t> sizes;
  for (const auto& p : unique_parameters(*model)) sizes.push_back(p.numel());
  for (const auto& name : o.hooks) {
    const auto rounding = rounding_hook_options(name, o.hook.block);
    if (!rounding) continue;  // fp32, 05a's fp16 all-reduce, PowerSGD: no one-process model to compare with
    check_low_byte_all_reduce(pg, *rounding, sizes, "hook " + name);
    print0("PASS hook {} ({}): every gradient tensor's average equals the one-process model bit for bit{}", name,
           rounding->name(), rounding->sum == SumIn::wire ? "" : ", within the derived bound of the exact average");
  }
  if (std::find(o.hooks.begin(), o.hooks.end(), "powersgd") != o.hooks.end()) check_powersgd_books(pg, o);
}
// [checks]

// [errors]
// --errors: each format's error against the exact (fp64) average of W real gradients, W simulated (the one-process
// model is the collective bit for bit: run_checks). Rank 0 alone; a table, and the rows for the JSON.
nlohmann::json error_study(const Options& o, const TransformerConfig& mcfg, uint64_t seed) {
  const int most = *std::max_element(o.error_ranks.begin(), o.error_ranks.end());
  const std::vector<LowByteOptions> kinds{{parse_wire_format("bf16"), SumIn::fp32},
                                          {parse_wire_format("fp16"), SumIn::fp32},
                                          {parse_wire_format("int8", o.hook.block), SumIn::fp32},
                                          {parse_wire_format("bf16"), SumIn::wire},
                                          {parse_wire_format("fp16"), SumIn::wire}};
  nlohmann::json out = nlohmann::json::array();
  for (int s = 0; s < o.seeds; ++s) {
    std::vector<torch::Tensor> grads;  // rank k's: 2 sequences of its own
    for (int k = 0; k < most; ++k) grads.push_back(markov_gradient(mcfg, seed, 2, 1000 * s + k));
    for (int W : o.error_ranks) {
      std::vector<torch::Tensor> xs(grads.begin(), grads.begin() + W);
      auto exact = torch::zeros_like(xs[0], torch::kDouble);
      for (const auto& x : xs) exact += x.to(torch::kDouble) / W;
      for (const auto& k : kinds) {
        auto err = low_byte_average(xs, k).to(torch::kDouble) - exact;
        const double rel = (err.norm() / exact.norm()).item<double>();
        double worst = 0;  // the largest |error| / bound over the values, for fp32 sums (must be <= 1)
        // A value that is exactly 0 on every rank has bound 0 and error 0: 0 / tiny = 0, where 0 / 0 would be NaN,
        // which passes every comparison; a nonzero error there is huge and fails.
        if (k.sum == SumIn::fp32)
          worst = (err.abs() / low_byte_bound(xs, k.wire).to(torch::kDouble).clamp_min(1e-300)).max().item<double>();
        if (worst > 1)
          throw CheckFailed(fmt::format("{} at {} ranks: an error {:.2f} x its derived bound", k.name(), W, worst));
        out.push_back(
            {{"format", k.name()}, {"ranks", W}, {"seed", s}, {"relative_error", rel}, {"worst_over_bound", worst}});
      }
    }
  }
  std::vector<std::string> formats;
  for (const auto& k : kinds) formats.push_back(k.name());
  const auto summary = error_summary(
      out, formats, o.error_ranks,
      fmt::format("relative error ||avg - exact|| / ||exact|| of {} gradients, median over {} draws:", mcfg.name,
                  o.seeds));
  return {{"draws", out}, {"summary", summary}};
}
// [errors]

// --curve N: N steps of AdamW (lr 1e-3), or SGD with momentum 0.9 (lr 0.05), on Markov-chain text with each hook from
// the same weights and data, and fp32 once more on other data: how far a hook moves the curve, against how far other
// data moves it.
nlohmann::json loss_curves(ProcessGroup& pg, const Options& o, const BenchConfig& cfg, uint64_t seed) {
  const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  std::vector<std::pair<std::string, uint64_t>> runs;  // (hook, data draw)
  for (const auto& h : o.hooks) runs.emplace_back(h, 0);
  runs.emplace_back("fp32", 1);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [hook, data] : runs) {
    torch::manual_seed(seed);
    TransformerLM model(mcfg);
    auto ddp = make_ddp(pg, model.ptr(), o, hook);
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (o.curve_optimizer == "sgd")
      opt =
          std::make_unique<torch::optim::SGD>(unique_parameters(*model), torch::optim::SGDOptions(0.05).momentum(0.9));
    else
      opt = std::make_unique<torch::optim::AdamW>(unique_parameters(*model), torch::optim::AdamWOptions(1e-3));
    std::vector<double> losses;
    for (int t = 0; t < o.curve; ++t) {
      auto [gx, gy] = markov_batch(cfg.global_batch, cfg.context, mcfg.vocab_size, 2000 + 7919 * data, t);
      auto x = shard_rows(gx, pg.rank(), pg.world_size());
      auto y = shard_rows(gy, pg.rank(), pg.world_size());
      ddp->on_train_batch_start();
      opt->zero_grad();
      auto loss = lm_loss(model->forward(x), y);
      loss.backward();
      ddp->finish_gradient_synchronization();
      opt->step();
      auto l = loss.detach().reshape({1}).clone();
      pg.all_reduce(l);
      losses.push_back(l.item<double>() / pg.world_size());
    }
    out.push_back({{"hook", hook}, {"data", data}, {"losses", losses}});
  }
  compare_curves(out, "hook");
  return out;
}

// After --bench: each hook's bytes per step, counted over 2 steps of a fresh DDP, and each row's step over the fp32
// lower bound, round by round: forward + max(backward, the round's fp32 all-reduce) + optimizer, the first three the
// medians of the no-communication row of the row's group. Where the variants were measured in groups (a model too
// large for all of them at once), the all-reduce's median over all rounds stands for each round's.
nlohmann::json bytes_and_bound(ProcessGroup& pg, const Options& o, const BenchConfig& cfg, const Results& results) {
  const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  const std::vector<double> flat = results.meta["flat_allreduce_samples_s"];
  int baselines = 0;
  for (const auto& r : results.rows()) baselines += r["variant"] == r["baseline"];
  auto bound_of = [&](const nlohmann::json& row) {
    const nlohmann::json* base = nullptr;
    for (const auto& r : results.rows())
      if (r["variant"] == row["baseline"] && r["group"] == row["group"]) base = &r;
    std::vector<double> bound;
    for (size_t i = 0; i < row["step_samples_s"].size(); ++i) {
      const double f = baselines == 1 && i < flat.size() ? flat[i] : summarize(flat).median;
      bound.push_back((*base)["forward_s"].get<double>() + std::max((*base)["backward_s"].get<double>(), f) +
                      (*base)["optimizer_s"].get<double>());
    }
    return bound;
  };
  nlohmann::json out = {{"rows", nlohmann::json::array()}};
  print0("\n{:<28} {:>12} {:>9} {:>22}", "hook", "MB sent/step", "x fp32", "x lower bound [min-max]");
  double fp32_bytes = 0;
  for (const auto& h : o.hooks) {
    torch::manual_seed(0);
    TransformerLM model(mcfg);
    std::function<int64_t()> sent;
    auto ddp = make_ddp(pg, model.ptr(), o, h, &sent);
    for (int t = 0; t < 2; ++t) {
      auto [gx, gy] = token_batch(cfg.global_batch, cfg.context, mcfg.vocab_size, 1, t);
      ddp->on_train_batch_start();
      lm_loss(model->forward(shard_rows(gx, pg.rank(), pg.world_size())), shard_rows(gy, pg.rank(), pg.world_size()))
          .backward();
      ddp->finish_gradient_synchronization();
    }
    const double mb = sent() / 2.0 / 1e6;
    if (h == "fp32") fp32_bytes = mb;
    std::vector<double> bound, ratio;
    for (const auto& r : results.rows())
      if (r["variant"].get<std::string>().rfind(h + " hook,", 0) == 0) {
        bound = bound_of(r);
        for (size_t i = 0; i < bound.size(); ++i) ratio.push_back(r["step_samples_s"][i].get<double>() / bound[i]);
      }
    const Stats s = summarize(ratio);
    print0("{:<28} {:>12.2f} {:>9} {:>10.3f} [{:.3f}-{:.3f}]", h, mb,
           fp32_bytes > 0 ? fmt::format("{:.3f}", mb / fp32_bytes) : "-", s.median, s.min, s.max);
    out["rows"].push_back({{"hook", h},
                           {"sent_MB_per_step", mb},
                           {"lower_bound_samples_s", bound},
                           {"ratio_to_lower_bound_samples", ratio}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Cli cli("ext05e_low_byte", "Extension 05e: gradients in fewer bytes, and the error they cost");
  Options o;
  BenchConfig cfg;
  cfg.preset = "tiny";
  add_bench_options(cli.app(), cfg);  // before --bench: --preset, --batch and --context serve every part
  cli.app().add_flag("--bench", o.bench, "After the checks, benchmark each hook on the Transformer");
  bench_only(cli.app(), {"--warmup", "--steps", "--budget", "--trace"});
  cli.app().add_flag("--errors", o.errors, "Measure each format's error against the exact average, 2-32 ranks");
  cli.app()
      .add_option("--curve", o.curve, "Train N steps with each hook and compare the losses with fp32's")
      ->check(PositiveInt);
  cli.app()
      .add_option("--hooks", o.hooks, fmt::format("Hooks to run: {}", fmt::join(low_byte_hook_names(), ", ")))
      ->delimiter(',');
  cli.app().add_option("--block", o.hook.block, "int8: values per scale")->check(PositiveInt);
  cli.app().add_option("--powersgd-rank", o.hook.powersgd_rank, "PowerSGD's rank r")->check(PositiveInt);
  cli.app()
      .add_option("--powersgd-start", o.hook.powersgd_start, "PowerSGD: plain fp32 steps before it starts")
      ->check(CLI::NonNegativeNumber);
  cli.app()
      .add_option("--curve-optimizer", o.curve_optimizer,
                  "--curve's optimizer: adamw (lr 1e-3) or sgd (momentum 0.9, lr 0.05)")
      ->check(CLI::IsMember({"adamw", "sgd"}));
  cli.app().add_option("--cap", o.cap, "Bucket cap in MB")->check(PositiveFinite);
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
    // Bad input before the group forms: unknown names, a block, PowerSGD's rank against the model's matrices.
    for (const auto& h : o.hooks) check_low_byte_hook_name(h);
    // A block longer than a bucket would pad every bucket up to W whole blocks: refuse it.
    const auto bucket_values = static_cast<int64_t>(o.cap * 1e6 / 4);
    if (o.hook.block > bucket_values)
      throw UsageError(
          fmt::format("--block {}: longer than a {:g} MB bucket ({} fp32 values); use a block of at most {} "
                      "or a larger --cap",
                      o.hook.block, o.cap, bucket_values, bucket_values));
    const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
    torch::manual_seed(cli.common().seed);
    TransformerLM model(mcfg);
    if (std::find(o.hooks.begin(), o.hooks.end(), "powersgd") != o.hooks.end()) {
      BucketShapes one;
      one.emplace_back();
      for (const auto& p : unique_parameters(*model)) one.back().push_back(p.sizes().vec());
      PowerSgdOptions p;
      p.rank = o.hook.powersgd_rank;
      PowerSgd check(one, p);  // throws dp::UsageError for a rank above a matrix's smaller side
    }
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    torch::manual_seed(cli.common().seed + 1 + pg.rank());
    run_checks(pg, o, model);

    Results results("ext05e");
    if (o.bench) {
      std::vector<Variant> variants;
      for (const auto& h : o.hooks)
        variants.emplace_back(
            fmt::format("{} hook, {:g} MB buckets", h, o.cap),
            MakeGradSync([=](ProcessGroup& g, std::shared_ptr<torch::nn::Module> m) -> std::unique_ptr<GradSync> {
              return make_ddp(g, std::move(m), o, h);
            }));
      print_bench_header(pg, cfg);
      record(results, bench_variants(pg, cfg, variants), cfg, pg.world_size());
      print0("\n{}", ddp_table(results));
      results.meta["low_byte"] = bytes_and_bound(pg, o, cfg, results);
    }
    if (o.errors && pg.rank() == 0) {
      auto e = error_study(o, mcfg, cli.common().seed);
      results.meta["errors"] = e["draws"];
      results.meta["error_summary"] = e["summary"];
    }
    if (o.curve > 0) results.meta["curves"] = loss_curves(pg, o, cfg, cli.common().seed);
    results.meta["preset"] = cfg.preset;
    results.meta["context"] = cfg.context;
    results.meta["global_batch"] = cfg.global_batch;
    results.meta["hooks"] = o.hooks;
    results.meta["block"] = o.hook.block;
    results.meta["powersgd_rank"] = o.hook.powersgd_rank;
    results.meta["powersgd_start"] = o.hook.powersgd_start;
    results.meta["curve_optimizer"] = o.curve_optimizer;
    if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    pg.barrier();
    print0("PASS extension 05e: every hook checked");
    pg.shutdown();
    return 0;
  });
}
