// Stage 06: optimizer-state sharding (ZeRO stage 1).
//
// What it adds: AdamW keeps two float32 moments per parameter, twice the model's own size, and plain
// data parallelism keeps them on every rank. ShardedOptimizer gives every parameter tensor one owner
// (largest first, to the least-loaded rank); each rank runs an ordinary torch::optim optimizer over the
// tensors it owns, then every tensor is broadcast from its owner. Weights and gradients stay replicated
// (4P + 4P bytes), the optimizer state shrinks to 8P/N per rank. Checkpoints gather the shards to rank 0
// and can be loaded at another world size (checkpoint.hpp).
//
// Run it (two ranks on this machine, through the launcher):
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage06_sharded_opt
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage06_sharded_opt --bench --preset tiny --checkpoint /tmp/s6
//   (--preset small is CS336's 128M-parameter model: about 2 GB of fp32 training state per rank unsharded)
// Correct output: the partition of each toy model, then "PASS sharded AdamW == AdamW on toy ..." and the same
// for "tied" (bit-identical after every one of 10 steps). With --bench: per optimizer the measured bytes of
// parameters, gradients and optimizer state next to 4P + 4P + 8P/N, peak RSS at start, before and after
// the first step, and median step times; the sharded state is about 1/N of the plain one. The tensor
// counts are exact; RSS is the process's view and also holds allocator caches and the first variant's
// leftovers (run --optimizer adamw and --optimizer sharded separately for the cleanest peaks).
//
// What it leaves: gradients are still all-reduced in full and kept on every rank, and the step adds a
// broadcast of every parameter (about 1.5x the traffic of plain DDP). ZeRO-2 would reduce-scatter the
// gradients so each rank keeps only its shard; ZeRO-3 (FSDP) shards the parameters too.
#include "common/cli.hpp"
#include "common/ddp_check.hpp"
#include "common/dist.hpp"
#include "common/models.hpp"
#include "common/results.hpp"
#include "common/runtime.hpp"
#include "common/timing.hpp"
#include "common/trace.hpp"
#include "common/transformer.hpp"
#include "stages/06_sharded_opt/checkpoint.hpp"
#include "stages/06_sharded_opt/sharded_optimizer.hpp"

#include <filesystem>
#include <fstream>

using namespace dp;
namespace optim = torch::optim;


// CS336's test: every rank seeds 42, so models and data agree without a broadcast; no DDP, every rank
// computes full gradients. After every step the sharded model must equal plain AdamW's bit for bit.
static bool cs336_check(ProcessGroup& pg, const std::string& model_name) {
  // [check]
  torch::manual_seed(42);
  auto ref = make_toy_model(model_name), shd = make_toy_model(model_name);
  copy_parameters(*shd, *ref);
  ref->to(pg.device());  // before the optimizers: they key their state by the tensors
  shd->to(pg.device());
  const auto opts = optim::AdamWOptions(0.1).weight_decay(0.1).betas(std::make_tuple(0.9, 0.999)).eps(1e-8);
  optim::AdamW plain(unique_parameters(*ref), opts);
  auto sharded = ShardedOptimizer::adamw(pg, shd->parameters(), opts);  // tied weights listed twice: deduped
  print0("{}: {}", model_name, sharded.describe());
  for (int step = 1; step <= 10; ++step) {
    auto x = torch::rand({32, 10}).to(pg.device()), y = torch::rand({32, 5}).to(pg.device());
    plain.zero_grad();
    sharded.zero_grad();
    (y - ref->forward(x)).pow(2).sum().backward();
    (y - shd->forward(x)).pow(2).sum().backward();
    plain.step();
    sharded.step();  // local AdamW on the owned tensors, then a broadcast from every owner
    // [check]
    auto a = unique_named_parameters(*ref), b = unique_named_parameters(*shd);
    for (size_t i = 0; i < a.size(); ++i) {
      if (torch::equal(a[i].second, b[i].second)) continue;
      print_rank("FAIL {} step {}: {} differs by {:.3g}", model_name, step, a[i].first,
                 (a[i].second - b[i].second).abs().max().item<double>());
      return false;
    }
  }
  return parameters_identical_across_ranks(pg, *shd);
}

struct BenchOptions {
  std::string preset = "tiny";
  int context = 64, batch = 2, warmup = 1, steps = 5;
  std::string checkpoint_dir;
  std::string which = "both";  // adamw | sharded | both
  std::string trace;           // --trace FILE: Chrome trace of the timed steps
};

// One training run of the Transformer with DDP gradient averaging and either plain or sharded AdamW:
// memory at start, right before and after the first optimizer step (when AdamW allocates its state),
// and the median time of a step and of optimizer.step().
static void bench_variant(ProcessGroup& pg, const BenchOptions& o, bool shard, Results& results) {
  const bool reset_ok = reset_peak_rss();  // forget the previous variant's peak
  if (!reset_ok && shard) print0("note: cannot reset the peak RSS here; the sharded run's peaks include the plain run's");
#ifdef DP_WITH_CUDA
  int64_t cuda_before = 0, cuda_after = 0;
  if (pg.device().is_cuda()) reset_cuda_peak(pg.device().index());
#endif
  auto cfg = TransformerConfig::preset(o.preset, o.context);
  torch::manual_seed(1234);
  TransformerLM model(cfg);
  model->to(pg.device());
  broadcast_parameters(pg, *model);
  const auto params = unique_parameters(*model);
  const auto opts = optim::AdamWOptions(1e-3).weight_decay(0.1);
  std::unique_ptr<optim::AdamW> plain;
  std::unique_ptr<ShardedOptimizer> sharded;
  if (shard) sharded = std::make_unique<ShardedOptimizer>(ShardedOptimizer::adamw(pg, params, opts));
  else plain = std::make_unique<optim::AdamW>(params, opts);
  optim::Optimizer& local = shard ? sharded->local() : *plain;
  const int64_t rss_start = peak_rss_bytes();
  int64_t rss_before = 0, rss_after = 0;
  TrainingBytes before, after;

  torch::manual_seed(99 + pg.rank());  // each rank its own batches
  std::vector<double> step_s, opt_s;
  for (int it = 0; it < o.warmup + o.steps; ++it) {
    auto tokens = torch::randint(0, cfg.vocab_size, {o.batch, o.context + 1}, torch::kInt64).to(pg.device());
    trace::set_recording(it >= o.warmup);  // no-op without --trace
    trace::Span whole("step", {{"variant", shard ? "sharded AdamW" : "AdamW"}, {"round", it}});
    Timer t(pg.device());
    shard ? sharded->zero_grad() : plain->zero_grad();
    torch::Tensor loss;
    { trace::Span f("forward"); loss = lm_loss(model->forward(tokens.narrow(1, 0, o.context)), tokens.narrow(1, 1, o.context)); }
    { trace::Span b("backward"); loss.backward(); }
    {
      trace::Span sync("sync");
      // [ddp] Plain DDP averaging: all-reduce every gradient (sum), then divide; ZeRO-1 keeps this part.
      std::vector<Work> pending;
      std::vector<torch::Tensor> grads;
      for (auto& p : params) grads.push_back(p.grad());
      for (auto& g : grads) pending.push_back(pg.all_reduce_async(g));
      for (auto& w : pending) w.wait();
      for (auto& g : grads) g.div_(pg.world_size());
      // [ddp]
    }
    if (it == 0) rss_before = peak_rss_bytes(), before = count_training_bytes(*model, local);
#ifdef DP_WITH_CUDA
    if (it == 0 && pg.device().is_cuda()) cuda_before = cuda_peak_allocated_bytes(pg.device().index());
#endif
    Timer ts(pg.device());
    {
      trace::Span step_span("optimizer");  // for the sharded optimizer: its step and the broadcasts
      shard ? sharded->step() : static_cast<void>(plain->step());
    }
    const double opt_time = ts.seconds(), step_time = t.seconds();
    if (it == 0) rss_after = peak_rss_bytes(), after = count_training_bytes(*model, local);
#ifdef DP_WITH_CUDA
    if (it == 0 && pg.device().is_cuda()) cuda_after = cuda_peak_allocated_bytes(pg.device().index());
#endif
    if (it >= o.warmup) step_s.push_back(step_time), opt_s.push_back(opt_time);
  }
  trace::set_recording(false);
  const auto step = summarize(max_over_ranks(pg, step_s)), opt = summarize(max_over_ranks(pg, opt_s));
  auto max_all = [&](double v) { auto all = pg.all_gather(v); return *std::max_element(all.begin(), all.end()); };
  const int64_t P = count_elements(params);
  const auto expect = zero1_expected_bytes(P, shard ? pg.world_size() : 1);
  results.add({{"optimizer", shard ? "sharded AdamW" : "AdamW"}, {"world_size", pg.world_size()},
               {"preset", o.preset}, {"context", o.context}, {"params", P},
               {"param_MB", after.params / 1e6}, {"grad_MB", after.grads / 1e6},
               {"state_MB_max_rank", max_all(after.state) / 1e6}, {"state_MB_before_step", before.state / 1e6},
               {"expected_MB", expect.total() / 1e6}, {"expected_state_MB", expect.state / 1e6},
               {"peak_rss_start_MB", max_all(rss_start) / 1e6}, {"peak_rss_before_step_MB", max_all(rss_before) / 1e6},
               {"peak_rss_after_step_MB", max_all(rss_after) / 1e6}, {"peak_reset", reset_ok},
               {"rss_growth_MB", max_all(static_cast<double>(rss_after - rss_start)) / 1e6},
               {"step_median_s", step.median}, {"opt_step_median_s", opt.median}, {"steps", step.n}});
#ifdef DP_WITH_CUDA
  // On a GPU the caching allocator's peak is the number that matters, not the host's RSS.
  if (pg.device().is_cuda())
    print0("{}: CUDA peak allocated before step {:.1f} MB, after step {:.1f} MB", shard ? "sharded AdamW" : "AdamW",
           max_all(cuda_before) / 1e6, max_all(cuda_after) / 1e6);
#endif
  if (shard) print0("{}", sharded->describe());

  if (shard && !o.checkpoint_dir.empty()) {
    // [checkpoint] Save, load into a fresh replica, and check that both take the same next step.
    std::filesystem::create_directories(o.checkpoint_dir);
    const std::string path = o.checkpoint_dir + "/stage06_" + o.preset + ".ckpt";
    save_checkpoint(path, pg, *model, *sharded);
    torch::manual_seed(5);
    TransformerLM fresh(cfg);
    fresh->to(pg.device());
    auto fresh_opt = ShardedOptimizer::adamw(pg, unique_parameters(*fresh), opts);
    auto info = load_checkpoint(path, pg, *fresh, fresh_opt);
    auto tokens = torch::randint(0, cfg.vocab_size, {o.batch, o.context + 1}, torch::kInt64).to(pg.device());
    for (auto* pair : {&model, &fresh}) {
      auto& m = *pair;
      (pair == &model ? *sharded : fresh_opt).zero_grad();
      lm_loss(m->forward(tokens.narrow(1, 0, o.context)), tokens.narrow(1, 1, o.context)).backward();
      for (auto& p : unique_parameters(*m)) pg.all_reduce(p.mutable_grad()), p.mutable_grad().div_(pg.world_size());
      (pair == &model ? *sharded : fresh_opt).step();
    }
    // [checkpoint]
    const bool same = max_param_diff(*model, *fresh) == 0.0;
    print0("{} checkpoint {} ({}, saved by {} ranks, step {}): resumed step {} the uninterrupted one",
           same ? "PASS" : "FAIL", path, format_bytes(static_cast<double>(std::filesystem::file_size(path))),
           info.world_size, info.max_step, same ? "equals" : "DIFFERS from");
    if (!same) throw CheckFailed("resuming from the checkpoint changed the training");
  }
}

int main(int argc, char** argv) {
  Cli cli("stage06_sharded_opt", "Stage 06: sharded AdamW (ZeRO-1) checked against AdamW, memory and speed");
  bool run_bench = false;
  BenchOptions bo;
  cli.app().add_flag("--bench", run_bench, "After the checks, train the Transformer with AdamW and sharded AdamW");
  cli.app().add_option("--preset", bo.preset, "Transformer size for --bench (tiny, small, medium, ...)")
      ->check(CLI::IsMember(TransformerConfig::preset_names()));
  cli.app().add_option("--context", bo.context, "Sequence length for --bench")->check(PositiveInt);
  cli.app().add_option("--batch", bo.batch, "Sequences per rank per step for --bench")->check(PositiveInt);
  cli.app().add_option("--warmup", bo.warmup, "Untimed steps for --bench")->check(CLI::NonNegativeNumber);
  cli.app().add_option("--steps", bo.steps, "Timed steps for --bench")->check(PositiveInt);
  cli.app().add_option("--optimizer", bo.which,
                       "With --bench: adamw, sharded or both (one per process gives the cleanest peak RSS)")
      ->check(CLI::IsMember({"adamw", "sharded", "both"}));
  cli.app().add_option("--trace", bo.trace, "With --bench: write a Chrome trace (Perfetto) of the timed steps to FILE")
      ->type_name("FILE")->needs("--bench");
  cli.app().add_option("--checkpoint", bo.checkpoint_dir,
                       "With --bench: save a checkpoint of the sharded run to this directory, load it, compare");
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    if (!bo.trace.empty() && !std::ofstream(bo.trace, std::ios::app))
      throw UsageError(fmt::format("--trace {}: cannot write there; give a path in an existing, writable folder", bo.trace));
    configure_cpu_threads();
    auto pg = ProcessGroup::init_from_env({cli.common().backend, std::chrono::milliseconds(cli.timeout_ms())});
    print0("process group: backend {}, world size {}, device {}", pg.backend(), pg.world_size(), pg.device().str());

    bool all_ok = true;
    for (const std::string name : {"toy", "tied"}) {
      const bool ok = cs336_check(pg, name);
      auto votes = pg.all_gather(ok ? 1.0 : 0.0);
      const bool everyone = std::count(votes.begin(), votes.end(), 1.0) == pg.world_size();
      print0("{} sharded AdamW == AdamW on {} (10 steps, {} ranks, bit-identical after every step)",
             everyone ? "PASS" : "FAIL", name, pg.world_size());
      all_ok = all_ok && everyone;
    }
    if (!all_ok) throw CheckFailed("sharded AdamW differs from AdamW");

    if (run_bench) {
      print0("\n{}", describe(TransformerConfig::preset(bo.preset, bo.context)));
      Results results("sharded_optimizer");
      if (!bo.trace.empty()) pg.barrier(), trace::enable();
      if (bo.which != "sharded") bench_variant(pg, bo, /*shard=*/false, results);
      if (bo.which != "adamw") bench_variant(pg, bo, /*shard=*/true, results);
      if (!bo.trace.empty()) trace::write(pg, bo.trace), print0("trace of the timed steps written to {}", bo.trace);
      print0("\nmemory per rank in MB (10^6 B): params/grads/state counted tensor by tensor after the first step, "
             "the arithmetic 8P/N and 4P+4P+8P/N beside them, peak RSS of the process (max over ranks)\n{}",
             results.markdown({"optimizer", "world_size", "param_MB", "grad_MB", "state_MB_max_rank",
                               "expected_state_MB", "expected_MB", "peak_rss_start_MB", "peak_rss_before_step_MB",
                               "peak_rss_after_step_MB", "rss_growth_MB"},
                              {"optimizer", "ranks", "params", "grads", "state (max rank)", "8P/N", "4P+4P+8P/N",
                               "peak RSS start", "peak RSS before step", "peak RSS after step", "RSS growth"},
                              4));
      print0("\ntime per step (slowest rank, median)\n{}",
             results.markdown({"optimizer", "world_size", "preset", "steps", "step_median_s", "opt_step_median_s"},
                              {"optimizer", "ranks", "preset", "steps", "step (s)", "optimizer.step (s)"}, 4));
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    pg.shutdown();
    return 0;
  });
}
