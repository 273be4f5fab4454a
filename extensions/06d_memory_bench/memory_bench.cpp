// Extension 06d's benchmark: plain AdamW after stage 05's DDP, the CS336 design (the same DDP, step the owned
// tensors, broadcast them) and true ZeRO-1 (reduce-scatter, step a flat chunk, all-gather), each the
// dp::Strategy its stage gives, on the Transformer: memory around the first step, then step times.
#include "extensions/06d_memory_bench/memory_bench.hpp"

#include "common/base/format.hpp"
#include "common/base/trace.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/accounting.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/memory.hpp"
#include "common/measure/timing.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "extensions/06b_cs336_design/cs336_design.hpp"  // cs336_strategy, selected_designs
#include "stages/05_bucketed/bucketed_ddp.hpp"           // bucketed_ddp_strategy
#include "stages/06_sharded_opt/strategies.hpp"          // zero1_strategy

#include <filesystem>

namespace dp {

namespace optim = torch::optim;
using Options = MemoryBenchOptions;

// [designs]
// A design's way of training, as its stage or extension gives it: plain AdamW after stage 05's bucketed DDP
// (PyTorch's 25 MB buckets), extension 06b's CS336 design (the same DDP, then each rank steps the tensors
// it owns and broadcasts them), stage 06's true ZeRO-1 (reduce-scatter, step a flat chunk, all-gather).
static MakeStrategy strategy_of(const std::string& design) {
  if (design == "cs336") return cs336_strategy(25.0);
  if (design == "zero1") return zero1_strategy();
  return bucketed_ddp_strategy(25.0);
}
// [designs]

static std::string name_of(const std::string& design) {
  if (design == "cs336") return "sharded AdamW";
  if (design == "zero1") return "ZeRO-1 AdamW";
  return "AdamW";
}

// The Transformer trained with one design ("adamw", "cs336", "zero1") through the training-step contract.
struct Trainee {
  ProcessGroup& pg;
  std::string design;
  TransformerConfig mcfg;
  TransformerLM model;
  std::unique_ptr<Strategy> strategy;

  Trainee(ProcessGroup& g, const Options& o, const std::string& which, uint64_t seed)
      : pg(g), design(which), mcfg(TransformerConfig::preset(o.cfg.preset, o.cfg.context)), model(nullptr) {
    torch::manual_seed(seed);
    model = TransformerLM(mcfg);
    model->to(pg.device());
    const auto opts = optim::AdamWOptions(1e-3).weight_decay(0.1);
    const MakeOptimizer make = [opts](std::vector<torch::Tensor> params) {
      return std::make_unique<optim::AdamW>(std::move(params), opts);
    };
    strategy = strategy_of(design)(pg, model.ptr(), make);  // every rank starts from rank 0's weights
  }
  std::string name() const { return name_of(design); }
  // Tensor bytes: parameters and gradients of the model, the state of every optimizer this rank steps.
  TrainingBytes count() const { return strategy->bytes(); }
  // This rank's sequences for one step: each rank draws its own (seeded per rank by the caller).
  torch::Tensor tokens(const Options& o) const {
    const int64_t rows = o.cfg.global_batch / pg.world_size();
    return torch::randint(0, mcfg.vocab_size, {rows, o.cfg.context + 1}, torch::kInt64).to(pg.device());
  }
  // One training step; `before_opt` runs between after_backward() (DDP's all-reduce done) and step(), where
  // the memory part takes its readings. Returns the seconds of the whole step and of step(), which for
  // ZeRO-1 holds all its communication (reduce-scatter, then all-gather) and for the CS336 design its
  // broadcasts.
  std::pair<double, double> step(const torch::Tensor& tokens, int round, const std::function<void()>& before_opt = {}) {
    trace::Span whole("step", {{"variant", name()}, {"round", round}});
    Timer t(pg.device());
    strategy->zero_grad();
    const int64_t T = tokens.size(1) - 1;
    torch::Tensor loss;
    {
      trace::Span f("forward");
      loss = lm_loss(model->forward_units(tokens.narrow(1, 0, T), strategy->runner()), tokens.narrow(1, 1, T));
    }
    {
      trace::Span b("backward");
      loss.backward();  // the buckets' all-reduces leave from in here
    }
    {
      trace::Span s("sync");
      strategy->after_backward();  // waits for them; ZeRO-1 has nothing to wait for yet
    }
    if (before_opt) before_opt();
    Timer ts(pg.device());
    {
      trace::Span s("optimizer");
      strategy->step();
    }
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
    m.rss_before = peak_rss_bytes();
    m.before = t.count();
    m.cuda_before = cuda_peak_allocated_bytes(t.pg.device());
  });
  m.rss_after = peak_rss_bytes();
  m.after = t.count();
  m.cuda_after = cuda_peak_allocated_bytes(t.pg.device());
  return m;
}

// Speed: the remaining steps; timed from --warmup on (the first step too when --warmup is 0).
static std::pair<Stats, Stats> time_steps(Trainee& t, const Options& o, const FirstStep& first) {
  std::vector<double> step_s, opt_s;
  if (o.cfg.warmup == 0) {
    step_s.push_back(first.seconds.first);
    opt_s.push_back(first.seconds.second);
  }
  for (int it = 1; it < o.cfg.warmup + o.cfg.steps; ++it) {
    auto tokens = t.tokens(o);
    trace::set_recording(it >= o.cfg.warmup);  // no-op without --trace
    auto [s, opt] = t.step(tokens, it);
    if (it >= o.cfg.warmup) {
      step_s.push_back(s);
      opt_s.push_back(opt);
    }
  }
  trace::set_recording(false);
  return {summarize(max_over_ranks(t.pg, step_s)), summarize(max_over_ranks(t.pg, opt_s))};
}

// One variant's run: memory, then speed; one row of results.
static void bench_optimizer(ProcessGroup& pg, const Options& o, const std::string& design, Results& results) {
  const bool reset_ok = reset_peak_rss();  // forget the previous variant's peak
  if (!reset_ok && design != "adamw")
    print0("note: cannot reset the peak RSS here; this run's peaks include the previous run's");
  reset_cuda_peak(pg.device());
  Trainee t(pg, o, design, 1234);
  const bool shard = design != "adamw";
  const double rss_start = peak_rss_bytes();
  torch::manual_seed(99 + pg.rank());  // each rank its own batches
  const FirstStep mem = measure_first_step(t, o);
  const auto [step, opt] = time_steps(t, o, mem);
  auto max_all = [&](double v) {
    auto all = pg.all_gather(v);
    return *std::max_element(all.begin(), all.end());
  };
  const int64_t P = count_elements(unique_parameters(*t.model));
  const auto expect = zero1_expected_bytes(P, shard ? pg.world_size() : 1);
  const int N = pg.world_size();
  const double sent = t.strategy->sent_bytes_per_step();  // the ring arithmetic of each design
  const double buffers = t.strategy->buffer_bytes();      // DDP's buckets; ZeRO-1's chunk gradient and receive buffer
  results.add({{"optimizer", t.name()},
               {"design", design},
               {"world_size", N},
               {"preset", o.cfg.preset},
               {"context", o.cfg.context},
               {"params", P},
               {"param_MB", mem.after.params / 1e6},
               {"grad_MB", mem.after.grads / 1e6},
               {"state_MB_max_rank", max_all(mem.after.state) / 1e6},
               {"state_MB_before_step", mem.before.state / 1e6},
               {"expected_MB", expect.total() / 1e6},
               {"expected_state_MB", expect.state / 1e6},
               {"peak_rss_start_MB", max_all(rss_start) / 1e6},
               {"peak_rss_before_step_MB", max_all(mem.rss_before) / 1e6},
               {"peak_rss_after_step_MB", max_all(mem.rss_after) / 1e6},
               {"peak_reset", reset_ok},
               {"rss_growth_MB", max_all(mem.rss_after - rss_start) / 1e6},
               {"sent_MB_per_step", sent / 1e6},
               {"buffer_MB", buffers / 1e6},
               {"step_median_s", step.median},
               {"opt_step_median_s", opt.median},
               {"steps", step.n}});
  if (pg.device().is_cuda())
    print0("{}: CUDA peak allocated before step {:.1f} MB, after step {:.1f} MB", t.name(),
           max_all(mem.cuda_before) / 1e6, max_all(mem.cuda_after) / 1e6);
  print0("{}", t.strategy->describe());
}

void run_benchmark(ProcessGroup& pg, const Options& o, Results& results) {
  if (o.which != "sharded") bench_optimizer(pg, o, "adamw", results);
  if (o.which != "adamw")
    for (const auto& design : selected_designs(o.design)) bench_optimizer(pg, o, design, results);
}

void print_tables(const Results& r) {
  print0(
      "\nmemory per rank in MB (10^6 B): params/grads/state counted tensor by tensor after the first step, "
      "the arithmetic 8P/N and 4P+4P+8P/N beside them, peak RSS of the process (max over ranks)\n{}",
      r.markdown(
          {"optimizer", "world_size", "param_MB", "grad_MB", "state_MB_max_rank", "expected_state_MB", "expected_MB",
           "peak_rss_start_MB", "peak_rss_before_step_MB", "peak_rss_after_step_MB", "buffer_MB", "rss_growth_MB"},
          {"optimizer", "ranks", "params", "grads", "state (max rank)", "8P/N", "4P+4P+8P/N", "peak RSS start",
           "peak RSS before step", "peak RSS after step", "comm buffers", "RSS growth"},
          4));
  print0(
      "\ntime per step (slowest rank, median); bytes each rank sends per step, ring arithmetic: DDP and\n"
      "ZeRO-1 2(N-1)/N x 4P, the CS336 design 3(N-1)/N x 4P; ZeRO-1's optimizer.step holds all its communication\n{}",
      r.markdown(
          {"optimizer", "world_size", "preset", "steps", "sent_MB_per_step", "step_median_s", "opt_step_median_s"},
          {"optimizer", "ranks", "preset", "steps", "sent per step (MB)", "step (s)", "optimizer.step (s)"}, 4));
}

}  // namespace dp
