// The shared DDP benchmark loop. Timing rules: warm up first (allocator, thread pools, Gloo buffers),
// then per step read the clock around the whole step and around the gradient sync, and report the
// median of the slowest rank, because the next step cannot start before the slowest rank is done.
#include "common/ddp_bench.hpp"

#include "common/cli.hpp"
#include "common/data.hpp"
#include "common/runtime.hpp"
#include "common/transformer.hpp"

namespace dp {

void validate_bench_config(const BenchConfig& cfg, int world) {
  TransformerConfig::preset(cfg.preset, cfg.context).validate();
  if (cfg.global_batch % world != 0)
    throw UsageError(fmt::format("--batch {} cannot be split evenly over {} ranks; use a multiple of {}",
                                 cfg.global_batch, world, world));
}

BenchRow bench_ddp(ProcessGroup& pg, const BenchConfig& cfg, const std::string& variant, const MakeGradSync& make,
                   int64_t calls_per_step) {
  const int W = pg.world_size();
  validate_bench_config(cfg, W);
  auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  torch::manual_seed(0);
  auto model = TransformerLM(mcfg);
  model->to(pg.device());
  std::unique_ptr<GradSync> sync;
  if (make) sync = make(pg, model.ptr());
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));

  std::vector<double> step_s, comm_s;
  Timer budget(pg.device());
  for (int i = 0; i < cfg.warmup + cfg.steps; ++i) {
    // Each rank trains on its own B/W sequences of the global batch of step i.
    auto [x, y] = token_batch(cfg.global_batch, cfg.context, mcfg.vocab_size, 1234, i);
    x = shard_rows(x, pg.rank(), W).to(pg.device());
    y = shard_rows(y, pg.rank(), W).to(pg.device());
    Timer step(pg.device());
    if (sync) sync->on_train_batch_start();
    opt.zero_grad();
    lm_loss(model->forward(x), y).backward();
    Timer comm(pg.device());
    if (sync) sync->after_backward();
    double c = comm.seconds();
    opt.step();
    double s = step.seconds();
    if (i >= cfg.warmup) step_s.push_back(s), comm_s.push_back(c);
    if (i == 0) maybe_inject_fault(pg.rank());  // hardening tests: a rank dies or hangs mid-training
    // Agree on stopping: every rank must run the same number of steps or the collectives mismatch.
    bool over = budget.seconds() > cfg.budget_s && i + 1 >= cfg.warmup + 1;
    auto votes = pg.all_gather(over ? 1.0 : 0.0);
    if (std::find(votes.begin(), votes.end(), 1.0) != votes.end()) break;
  }
  BenchRow row{variant, summarize(max_over_ranks(pg, step_s)), summarize(max_over_ranks(pg, comm_s)),
               calls_per_step};
  return row;
}

void add_bench_options(CLI::App& app, BenchConfig& cfg, std::string& budget_text) {
  app.add_option("--preset", cfg.preset, "Transformer size: tiny, small, medium, large, xl, 2.7b");
  app.add_option("--batch", cfg.global_batch, "Global batch (sequences per step, split over ranks)")->check(PositiveInt);
  app.add_option("--context", cfg.context, "Context length (tokens per sequence)")->check(PositiveInt);
  app.add_option("--warmup", cfg.warmup, "Untimed steps per variant")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", cfg.steps, "Timed steps per variant")->check(PositiveInt);
  app.add_option("--budget", budget_text, "Stop timing a variant after this long (e.g. 60s, 5m)");
}

void record(Results& results, const BenchRow& row, const BenchRow& baseline, const BenchConfig& cfg, int world) {
  double exposed = row.step.median - baseline.step.median;
  results.add({{"variant", row.variant}, {"preset", cfg.preset}, {"world_size", world},
               {"global_batch", cfg.global_batch}, {"context", cfg.context}, {"steps", row.step.n},
               {"step_s", row.step.median}, {"step_min_s", row.step.min}, {"step_max_s", row.step.max},
               {"comm_s", row.comm.median}, {"compute_s", row.step.median - row.comm.median},
               {"exposed_comm_s", exposed}, {"ratio_to_no_comm", row.step.median / baseline.step.median},
               {"calls_per_step", row.calls}});
  print0("  {:<22} step {:8.3f} s   in sync {:7.3f} s   exposed comm {:+7.3f} s   x{:.3f} of no-comm", row.variant,
         row.step.median, row.comm.median, exposed, row.step.median / baseline.step.median);
}

std::string ddp_table(const Results& results) {
  return results.markdown({"variant", "calls_per_step", "step_s", "comm_s", "exposed_comm_s", "ratio_to_no_comm"},
                          {"variant", "collectives/step", "step (s)", "in sync (s)", "exposed comm (s)",
                           "step / no-comm step"});
}

}  // namespace dp
