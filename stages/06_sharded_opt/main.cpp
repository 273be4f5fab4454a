// Stage 06: ZeRO-1 optimizer-state sharding, checked bit for bit against AdamW; memory, speed, resume.
//
// What it adds: AdamW keeps two float32 moments per parameter, twice the model, and plain data
// parallelism keeps them on every rank. ShardedOptimizer gives every parameter tensor one owner (largest
// first, to the least-loaded rank); each rank steps only what it owns with an ordinary torch::optim
// optimizer, then broadcasts it. Weights and gradients stay replicated (4P + 4P bytes), the optimizer
// state shrinks to 8P/N per rank. Checkpoints gather the shards and load at any world size.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage06_sharded_opt                      # checks only
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage06_sharded_opt --bench --preset tiny --checkpoint /tmp/s6
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage06_sharded_opt --bench --preset small --context 128
// --batch is the global batch, split over the ranks as in stages 02-05: the default 4 is 2 sequences per
// rank with 2 ranks (other defaults keep a run short: --preset tiny --context 64 --warmup 1 --steps 5).
// Correct output: "PASS sharded AdamW == AdamW on toy" and "on tied" (bit-identical after each of 10
// steps); with --bench, per optimizer the bytes of parameters, gradients and state beside 4P + 4P + 8P/N
// (the sharded state is 1/N of the plain one), peak RSS (the process's view: run --optimizer adamw and
// sharded separately for the cleanest peaks) and step times; with --checkpoint "PASS checkpoint ...
// resumed step equals the uninterrupted one"; last, "PASS stage 06".
//
// What it leaves: gradients are still all-reduced in full and kept on every rank, and the broadcast
// after the step adds (N-1)/N x 4P bytes of traffic. True ZeRO-1 reduce-scatters the gradients and
// all-gathers the parameters (plain DDP's bytes); FSDP (ZeRO-3) shards the parameters too.
#include "common/cli.hpp"
#include "common/ddp_bench.hpp"
#include "common/ddp_check.hpp"
#include "common/memory.hpp"
#include "common/models.hpp"
#include "common/runtime.hpp"
#include "common/trace.hpp"
#include "common/transformer.hpp"
#include "stages/06_sharded_opt/checkpoint.hpp"
#include "stages/06_sharded_opt/sharded_optimizer.hpp"

#include <filesystem>

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
  auto sharded = ShardedOptimizer::make<optim::AdamW>(pg, shd->parameters(), opts);  // tied weights: deduped
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

// The DDP part that ZeRO-1 keeps: every gradient all-reduced (summed) in full, then divided by N.
static void average_gradients(ProcessGroup& pg, const std::vector<torch::Tensor>& params) {
  // [ddp]
  std::vector<torch::Tensor> grads;
  std::vector<Work> pending;
  for (const auto& p : params) grads.push_back(p.grad());
  for (auto& g : grads) pending.push_back(pg.all_reduce_async(g));
  for (auto& w : pending) w.wait();
  for (auto& g : grads) g.div_(pg.world_size());
  // [ddp]
}

struct Options {
  BenchConfig cfg;
  std::string which = "both";  // --optimizer: adamw | sharded | both
  std::string checkpoint_dir;  // --checkpoint
};

// The Transformer with DDP gradient averaging and plain or sharded AdamW.
struct Trainee {
  ProcessGroup& pg;
  TransformerConfig mcfg;
  TransformerLM model;
  std::vector<torch::Tensor> params;
  std::unique_ptr<optim::AdamW> plain;
  std::unique_ptr<ShardedOptimizer> sharded;

  Trainee(ProcessGroup& g, const Options& o, bool shard, uint64_t seed)
      : pg(g), mcfg(TransformerConfig::preset(o.cfg.preset, o.cfg.context)), model(nullptr) {
    torch::manual_seed(seed);
    model = TransformerLM(mcfg);
    model->to(pg.device());
    broadcast_parameters(pg, *model);
    params = unique_parameters(*model);
    const auto opts = optim::AdamWOptions(1e-3).weight_decay(0.1);
    if (shard) sharded = std::make_unique<ShardedOptimizer>(ShardedOptimizer::make<optim::AdamW>(pg, params, opts));
    else plain = std::make_unique<optim::AdamW>(params, opts);
  }
  std::string name() const { return sharded ? "sharded AdamW" : "AdamW"; }
  optim::Optimizer& local() { return sharded ? sharded->local() : *plain; }
  // This rank's sequences for one step: each rank draws its own (seeded per rank by the caller).
  torch::Tensor tokens(const Options& o) const {
    const int64_t rows = o.cfg.global_batch / pg.world_size();
    return torch::randint(0, mcfg.vocab_size, {rows, o.cfg.context + 1}, torch::kInt64).to(pg.device());
  }
  // One training step; `before_opt` runs between the gradient averaging and optimizer.step(), where the
  // memory part takes its readings. Returns the seconds of the whole step and of optimizer.step().
  std::pair<double, double> step(const torch::Tensor& tokens, int round, const std::function<void()>& before_opt = {}) {
    trace::Span whole("step", {{"variant", name()}, {"round", round}});
    Timer t(pg.device());
    sharded ? sharded->zero_grad() : plain->zero_grad();
    const int64_t T = tokens.size(1) - 1;
    torch::Tensor loss;
    { trace::Span f("forward"); loss = lm_loss(model->forward(tokens.narrow(1, 0, T)), tokens.narrow(1, 1, T)); }
    { trace::Span b("backward"); loss.backward(); }
    { trace::Span s("sync"); average_gradients(pg, params); }
    if (before_opt) before_opt();
    Timer ts(pg.device());
    { trace::Span s("optimizer"); sharded ? sharded->step() : static_cast<void>(plain->step()); }  // + broadcasts
    const double opt_s = ts.seconds();
    return {t.seconds(), opt_s};
  }
};

// Memory: right before and right after the first optimizer step, where AdamW allocates its state.
struct FirstStep {
  TrainingBytes before, after;
  double rss_before = 0, rss_after = 0, cuda_before = 0, cuda_after = 0;  // peaks, bytes
  std::pair<double, double> seconds;
};
static FirstStep measure_first_step(Trainee& t, const Options& o) {
  FirstStep m;
  auto tokens = t.tokens(o);
  trace::set_recording(o.cfg.warmup == 0);  // no-op without --trace
  m.seconds = t.step(tokens, 0, [&] {
    m.rss_before = peak_rss_bytes(), m.before = count_training_bytes(*t.model, t.local());
    m.cuda_before = cuda_peak_allocated_bytes(t.pg.device());
  });
  m.rss_after = peak_rss_bytes(), m.after = count_training_bytes(*t.model, t.local());
  m.cuda_after = cuda_peak_allocated_bytes(t.pg.device());
  return m;
}

// Speed: the remaining steps; timed from --warmup on (the first step too when --warmup is 0).
static std::pair<Stats, Stats> time_steps(Trainee& t, const Options& o, const FirstStep& first) {
  std::vector<double> step_s, opt_s;
  if (o.cfg.warmup == 0) step_s.push_back(first.seconds.first), opt_s.push_back(first.seconds.second);
  for (int it = 1; it < o.cfg.warmup + o.cfg.steps; ++it) {
    auto tokens = t.tokens(o);
    trace::set_recording(it >= o.cfg.warmup);  // no-op without --trace
    auto [s, opt] = t.step(tokens, it);
    if (it >= o.cfg.warmup) step_s.push_back(s), opt_s.push_back(opt);
  }
  trace::set_recording(false);
  return {summarize(max_over_ranks(t.pg, step_s)), summarize(max_over_ranks(t.pg, opt_s))};
}

// Resume: save a checkpoint, load it into a fresh replica, and check that both take the same next step.
static void check_resume(Trainee& t, const Options& o) {
  // [checkpoint]
  std::filesystem::create_directories(o.checkpoint_dir);
  const std::string path = o.checkpoint_dir + "/stage06_" + o.cfg.preset + ".ckpt";
  save_checkpoint(path, t.pg, *t.model, *t.sharded);
  Trainee fresh(t.pg, o, /*shard=*/true, /*seed=*/5);
  auto info = load_checkpoint(path, t.pg, *fresh.model, *fresh.sharded);
  auto tokens = fresh.tokens(o);
  t.step(tokens, -1);
  fresh.step(tokens, -1);
  // [checkpoint]
  const bool same = max_param_diff(*t.model, *fresh.model) == 0.0;
  print0("{} checkpoint {} ({}, saved by {} ranks, step {}): resumed step {} the uninterrupted one",
         same ? "PASS" : "FAIL", path, format_bytes(static_cast<double>(std::filesystem::file_size(path))),
         info.world_size, info.max_step, same ? "equals" : "DIFFERS from");
  if (!same) throw CheckFailed("resuming from the checkpoint changed the training");
}

// One optimizer's run: memory, speed, then (sharded, with --checkpoint) resume; one row of results.
static void bench_optimizer(ProcessGroup& pg, const Options& o, bool shard, Results& results) {
  const bool reset_ok = reset_peak_rss();  // forget the previous optimizer's peak
  if (!reset_ok && shard) print0("note: cannot reset the peak RSS here; the sharded run's peaks include the plain run's");
  reset_cuda_peak(pg.device());
  Trainee t(pg, o, shard, 1234);
  const double rss_start = peak_rss_bytes();
  torch::manual_seed(99 + pg.rank());  // each rank its own batches
  const FirstStep mem = measure_first_step(t, o);
  const auto [step, opt] = time_steps(t, o, mem);
  auto max_all = [&](double v) { auto all = pg.all_gather(v); return *std::max_element(all.begin(), all.end()); };
  const int64_t P = count_elements(t.params);
  const auto expect = zero1_expected_bytes(P, shard ? pg.world_size() : 1);
  results.add({{"optimizer", t.name()}, {"world_size", pg.world_size()}, {"preset", o.cfg.preset},
               {"context", o.cfg.context}, {"params", P}, {"param_MB", mem.after.params / 1e6},
               {"grad_MB", mem.after.grads / 1e6}, {"state_MB_max_rank", max_all(mem.after.state) / 1e6},
               {"state_MB_before_step", mem.before.state / 1e6}, {"expected_MB", expect.total() / 1e6},
               {"expected_state_MB", expect.state / 1e6}, {"peak_rss_start_MB", max_all(rss_start) / 1e6},
               {"peak_rss_before_step_MB", max_all(mem.rss_before) / 1e6},
               {"peak_rss_after_step_MB", max_all(mem.rss_after) / 1e6}, {"peak_reset", reset_ok},
               {"rss_growth_MB", max_all(mem.rss_after - rss_start) / 1e6},
               {"step_median_s", step.median}, {"opt_step_median_s", opt.median}, {"steps", step.n}});
  if (pg.device().is_cuda())
    print0("{}: CUDA peak allocated before step {:.1f} MB, after step {:.1f} MB", t.name(),
           max_all(mem.cuda_before) / 1e6, max_all(mem.cuda_after) / 1e6);
  if (shard) print0("{}", t.sharded->describe());
  if (shard && !o.checkpoint_dir.empty()) check_resume(t, o);
}

static void print_tables(const Results& r) {
  print0("\nmemory per rank in MB (10^6 B): params/grads/state counted tensor by tensor after the first step, "
         "the arithmetic 8P/N and 4P+4P+8P/N beside them, peak RSS of the process (max over ranks)\n{}",
         r.markdown({"optimizer", "world_size", "param_MB", "grad_MB", "state_MB_max_rank", "expected_state_MB",
                     "expected_MB", "peak_rss_start_MB", "peak_rss_before_step_MB", "peak_rss_after_step_MB",
                     "rss_growth_MB"},
                    {"optimizer", "ranks", "params", "grads", "state (max rank)", "8P/N", "4P+4P+8P/N",
                     "peak RSS start", "peak RSS before step", "peak RSS after step", "RSS growth"}, 4));
  print0("\ntime per step (slowest rank, median)\n{}",
         r.markdown({"optimizer", "world_size", "preset", "steps", "step_median_s", "opt_step_median_s"},
                    {"optimizer", "ranks", "preset", "steps", "step (s)", "optimizer.step (s)"}, 4));
}

int main(int argc, char** argv) {
  Cli cli("stage06_sharded_opt", "Stage 06: sharded AdamW (ZeRO-1) checked against AdamW, memory and speed");
  Options o;
  o.cfg.preset = "tiny", o.cfg.context = 64, o.cfg.warmup = 1, o.cfg.steps = 5;  // a short run by default
  bool bench = false;
  cli.app().add_flag("--bench", bench, "After the checks, train the Transformer with AdamW and sharded AdamW");
  add_bench_options(cli.app(), o.cfg);
  cli.app().remove_option(cli.app().get_option("--budget"));  // every step here is timed to its end
  cli.app().get_option("--steps")->description("Timed steps per optimizer");
  cli.app().add_option("--optimizer", o.which,
                       "With --bench: adamw, sharded or both (one per process gives the cleanest peak RSS)")
      ->check(CLI::IsMember({"adamw", "sharded", "both"}));
  cli.app().add_option("--checkpoint", o.checkpoint_dir,
                       "With --bench: save a checkpoint of the sharded run to this directory, load it, compare");
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    configure_cpu_threads();
    check_blas();
    auto pg = ProcessGroup::init_from_env({cli.common().backend, std::chrono::milliseconds(cli.timeout_ms())});
    if (bench) validate_bench_config(o.cfg, pg.world_size());  // fail fast on bad input
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

    if (bench) {
      print0("\n{}", describe(TransformerConfig::preset(o.cfg.preset, o.cfg.context)));
      Results results("sharded_optimizer");
      if (!o.cfg.trace.empty()) pg.barrier(), trace::enable();
      if (o.which != "sharded") bench_optimizer(pg, o, /*shard=*/false, results);
      if (o.which != "adamw") bench_optimizer(pg, o, /*shard=*/true, results);
      if (!o.cfg.trace.empty()) trace::write(pg, o.cfg.trace), print0("trace of the timed steps written to {}", o.cfg.trace);
      print_tables(results);
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS stage 06: sharded AdamW (ZeRO-1) matches plain AdamW bit for bit");
    pg.shutdown();
    return 0;
  });
}
