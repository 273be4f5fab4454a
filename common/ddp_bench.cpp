// The shared DDP benchmark loop. Timing rules: warm up first (allocator, thread pools, Gloo buffers),
// then per step read the clock around the whole step and around the gradient sync, and report the
// median of the slowest rank, because the next step cannot start before the slowest rank is done.
// Variants take turns step by step, so slow drift of a shared machine cannot favour one of them.
#include "common/ddp_bench.hpp"

#include "common/cli.hpp"
#include "common/data.hpp"
#include "common/runtime.hpp"
#include "common/transformer.hpp"

#include <unistd.h>

namespace dp {

void validate_bench_config(const BenchConfig& cfg, int world) {
  TransformerConfig::preset(cfg.preset, cfg.context).validate();
  if (cfg.global_batch % world != 0)
    throw UsageError(fmt::format("--batch {} cannot be split evenly over {} ranks; use a multiple of {}",
                                 cfg.global_batch, world, world));
}

namespace {

// One model in training: its own parameters, gradient sync and AdamW state.
struct Trainee {
  std::string name;
  TransformerLM model{nullptr};
  std::unique_ptr<GradSync> sync;  // nullptr: the no-communication baseline
  std::unique_ptr<torch::optim::AdamW> opt;
  std::vector<double> step_s, comm_s;

  Trainee(ProcessGroup& pg, const TransformerConfig& mcfg, const Variant& v) : name(v.name) {
    torch::manual_seed(0);  // every variant trains the same model
    model = TransformerLM(mcfg);
    model->to(pg.device());
    if (v.make) sync = v.make(pg, model.ptr());
    opt = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-4));
  }

  // [step]
  void step(const torch::Tensor& x, const torch::Tensor& y, const torch::Device& device, bool timed) {
    Timer step(device);
    if (sync) sync->on_train_batch_start();
    opt->zero_grad();
    lm_loss(model->forward(x), y).backward();
    Timer comm(device);
    if (sync) sync->after_backward();  // stages 02/03 communicate here; 04/05 wait for what is left
    double c = comm.seconds();
    opt->step();
    if (timed) step_s.push_back(step.seconds()), comm_s.push_back(c);
  }
  // [step]
};

// How many models (parameters, gradients, AdamW state, a gradient-sized buffer: ~20 bytes per
// parameter) the ranks of this machine can hold at once in 70% of its RAM.
size_t models_that_fit(const TransformerConfig& mcfg, int local_ranks) {
  const double per_model = 20.0 * static_cast<double>(mcfg.num_parameters()) * local_ranks;
  const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  return std::max<size_t>(2, static_cast<size_t>(0.7 * ram / per_model));
}

}  // namespace

std::vector<BenchRow> bench_variants(ProcessGroup& pg, const BenchConfig& cfg, const std::vector<Variant>& variants) {
  const int W = pg.world_size();
  validate_bench_config(cfg, W);
  const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  const char* lws = std::getenv("LOCAL_WORLD_SIZE");
  const size_t per_group = models_that_fit(mcfg, lws ? std::max(1, std::atoi(lws)) : W) - 1;  // + baseline

  std::vector<BenchRow> rows;
  for (size_t first = 0, group = 0; first < variants.size(); first += per_group, ++group) {
    // The baseline and the next few variants, all in memory at once.
    std::vector<std::unique_ptr<Trainee>> ts;
    ts.push_back(std::make_unique<Trainee>(pg, mcfg, Variant{"no communication", nullptr}));
    for (size_t v = first; v < std::min(variants.size(), first + per_group); ++v)
      ts.push_back(std::make_unique<Trainee>(pg, mcfg, variants[v]));
    print0("  group {}: {} models trained in turn, step by step", group + 1, ts.size());

    Timer budget(pg.device());
    for (int i = 0; i < cfg.warmup + cfg.steps; ++i) {
      // Each rank trains on its own B/W sequences of the global batch of step i; so does every variant.
      auto [x, y] = token_batch(cfg.global_batch, cfg.context, mcfg.vocab_size, 1234, i);
      x = shard_rows(x, pg.rank(), W).to(pg.device());
      y = shard_rows(y, pg.rank(), W).to(pg.device());
      for (auto& t : ts) t->step(x, y, pg.device(), i >= cfg.warmup);
      if (i == 0) maybe_inject_fault(pg.rank());  // hardening tests: a rank dies or hangs mid-training
      // Agree on stopping: every rank must run the same number of steps or the collectives mismatch.
      bool over = budget.seconds() > cfg.budget_s && i >= cfg.warmup;
      auto votes = pg.all_gather(over ? 1.0 : 0.0);
      if (std::find(votes.begin(), votes.end(), 1.0) != votes.end()) break;
    }
    // Each step counts as long as its slowest rank took; ratios are taken round by round.
    std::vector<std::vector<double>> slowest;
    for (auto& t : ts) slowest.push_back(max_over_ranks(pg, t->step_s));
    const double base_median = summarize(slowest[0]).median;
    for (size_t k = (group == 0 ? 0 : 1); k < ts.size(); ++k) {
      std::vector<double> ratios;
      for (size_t i = 0; i < slowest[k].size(); ++i) ratios.push_back(slowest[k][i] / slowest[0][i]);
      BenchRow row;
      row.variant = ts[k]->name;
      row.step = summarize(slowest[k]);
      row.comm = summarize(max_over_ranks(pg, ts[k]->comm_s));
      row.calls = ts[k]->sync ? ts[k]->sync->calls_per_step() : 0;
      row.ratio = summarize(ratios).median;
      row.group = static_cast<int>(group);
      row.exposed_s = row.step.median - base_median;
      rows.push_back(row);
    }
  }
  return rows;
}

void add_bench_options(CLI::App& app, BenchConfig& cfg, std::string& budget_text) {
  app.add_option("--preset", cfg.preset, "Transformer size: tiny, small, medium, large, xl, 2.7b");
  app.add_option("--batch", cfg.global_batch, "Global batch (sequences per step, split over ranks)")->check(PositiveInt);
  app.add_option("--context", cfg.context, "Context length (tokens per sequence)")->check(PositiveInt);
  app.add_option("--warmup", cfg.warmup, "Untimed steps per variant")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", cfg.steps, "Timed steps per variant")->check(PositiveInt);
  app.add_option("--budget", budget_text, "Stop timing a variant after this long (e.g. 60s, 5m)");
}

void print_bench_header(const ProcessGroup& pg, const BenchConfig& cfg) {
  print0("\nbenchmark: {}", describe(TransformerConfig::preset(cfg.preset, cfg.context)));
  print0("global batch {} ({} per rank), context {}, AdamW, {} ranks ({}), {} warm-up + {} timed steps per variant",
         cfg.global_batch, cfg.global_batch / pg.world_size(), cfg.context, pg.world_size(), pg.backend(), cfg.warmup,
         cfg.steps);
}

void record(Results& results, const std::vector<BenchRow>& rows, const BenchConfig& cfg, int world) {
  for (const auto& row : rows) {
    results.add({{"variant", row.variant}, {"preset", cfg.preset}, {"world_size", world},
                 {"global_batch", cfg.global_batch}, {"context", cfg.context}, {"steps", row.step.n},
                 {"group", row.group}, {"step_s", row.step.median}, {"step_min_s", row.step.min},
                 {"step_max_s", row.step.max}, {"comm_s", row.comm.median},
                 {"compute_s", row.step.median - row.comm.median}, {"exposed_comm_s", row.exposed_s},
                 {"ratio_to_no_comm", row.ratio}, {"calls_per_step", row.calls}});
    print0("  {:<26} step {:7.3f} s (min {:.3f})  in sync {:6.3f} s  exposed comm {:+6.3f} s  x{:.3f} of no-comm",
           row.variant, row.step.median, row.step.min, row.comm.median, row.exposed_s, row.ratio);
  }
}

std::string ddp_table(const Results& results) {
  return results.markdown({"variant", "calls_per_step", "step_s", "comm_s", "exposed_comm_s", "ratio_to_no_comm"},
                          {"variant", "collectives/step", "step (s)", "in sync (s)", "exposed comm (s)",
                           "step / no-comm step"});
}

}  // namespace dp
