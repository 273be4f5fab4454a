// The shared DDP benchmark loop. Timing rules: warm up first (allocator, thread pools, Gloo buffers),
// then per step read the clock around each phase, and let the slowest rank set each round's time,
// because the next step cannot start before the slowest rank is done. Variants take turns step by
// step, so slow drift of a shared machine cannot favour one of them, and every ratio is taken within
// one round. Statistics over the rounds (medians, bootstrap intervals) are left to the reader of the
// JSON (scripts/pages/make_tables.py); the program keeps every sample.
#include "common/harness/ddp_bench.hpp"

#include "common/base/format.hpp"
#include "common/base/trace.hpp"
#include "common/dist/fault.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/accounting.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/memory.hpp"
#include "common/measure/trace_write.hpp"
#include "common/model/data.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <thread>

namespace dp {

void validate_bench_config(BenchConfig& cfg, int world) {
  TransformerConfig::preset(cfg.preset, cfg.context).validate();
  if (cfg.global_batch % world != 0)
    throw UsageError(fmt::format("--batch {} cannot be split evenly over {} ranks; use a multiple of {}",
                                 cfg.global_batch, world, world));
  if (cfg.accumulate < 1 || (cfg.global_batch / world) % cfg.accumulate != 0)
    throw UsageError(
        fmt::format("--accumulate {} does not divide the {} sequences per rank (--batch {} over {} ranks); "
                    "use a divisor of {}",
                    cfg.accumulate, cfg.global_batch / world, cfg.global_batch, world, cfg.global_batch / world));
  cfg.budget_s = cfg.budget.empty() ? 0 : parse_seconds(cfg.budget, "--budget");
  // Whole replicas on every rank: a model too large is refused now, not killed by the kernel later. With
  // bytes_per_param 0 the program checks its own needs: this check's remedy (shard the parameters) would
  // name what it already does.
  const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  if (cfg.bytes_per_param > 0)
    check_fits_in_memory(
        cfg.bytes_per_param * static_cast<double>(mcfg.num_parameters()) +
            activation_bytes(mcfg, cfg.global_batch / world, cfg.context),
        LaunchEnv::from_environment().ranks_on_this_machine(),
        fmt::format("--preset {} ({} parameters, {:.0f} bytes each on every rank) with --context {} "
                    "and --batch {}",
                    cfg.preset, with_commas(mcfg.num_parameters()), cfg.bytes_per_param, cfg.context, cfg.global_batch),
        "use a smaller --preset, --context or --batch, fewer ranks on this machine, or shard the "
        "parameters too (FSDP, stage 07; its extension 07a, ext07a_fsdp_bench, trains it with no "
        "whole replica beside it)");
  if (!cfg.trace.empty()) check_writable("--trace", cfg.trace);  // fails now, not after the whole benchmark
}

namespace {

// One model in training: its own parameters, and its strategy with its AdamW state.
struct Trainee {
  std::string name;
  TransformerLM model{nullptr};
  bool communicates = false;  // false: the no-communication baseline
  std::unique_ptr<Strategy> strategy;
  std::vector<double> step_s, sync_s, fwd_s, bwd_s, opt_s;
  TrainingBytes bytes;  // after the first step, when the optimizer's state exists

  Trainee(ProcessGroup& pg, const TransformerConfig& mcfg, const Variant& v)
      : name(v.name), communicates(v.make != nullptr) {
    torch::manual_seed(0);  // every variant trains the same model
    model = TransformerLM(mcfg);
    model->to(pg.device());
    const MakeOptimizer adamw = [](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<torch::optim::AdamW>(std::move(p), torch::optim::AdamWOptions(1e-4));
    };
    strategy = (communicates ? v.make : no_communication())(pg, model.ptr(), adamw);
  }

  // [step]
  void step(const torch::Tensor& x, const torch::Tensor& y, const torch::Device& device, bool timed, int round,
            int accumulate = 1) {
    trace::set_recording(timed);
    trace::Span whole("step", {{"variant", name}, {"round", round}});
    Timer step(device), phase(device);
    strategy->zero_grad();
    double f = 0, b = 0, c = 0;
    const int64_t rows = x.size(0) / accumulate;
    for (int k = 0; k < accumulate; ++k) {  // K micro-batches (BenchConfig::accumulate); 1 but in stage 10
      strategy->set_requires_gradient_sync(k == accumulate - 1);
      torch::Tensor loss;
      {  // through the strategy's runner where it has one (FSDP, ZeRO-1 gathering behind forward): unit by unit
        trace::Span s("forward");
        const UnitRunner run = strategy->runner();
        const torch::Tensor xk = x.narrow(0, k * rows, rows), yk = y.narrow(0, k * rows, rows);
        loss = lm_loss(run ? model->forward_units(xk, run) : model->forward(xk), yk) / accumulate;
      }
      f += phase.seconds();
      phase.start();
      {
        trace::Span s("backward");
        loss.backward();
      }  // gradient hooks launch their all-reduces from in here
      b += phase.seconds();
      phase.start();
      if (communicates) {
        trace::Span s("sync");
        strategy->after_backward();
      }  // 02/03 communicate; 04/05 wait
      c += phase.seconds();
      phase.start();
    }
    {
      trace::Span s("optimizer");
      strategy->step();
    }  // nothing left to do where after_backward() stepped
    const double o = phase.seconds();
    if (timed) {
      step_s.push_back(step.seconds());
      sync_s.push_back(c);
      fwd_s.push_back(f);
      bwd_s.push_back(b);
      opt_s.push_back(o);
    }
  }
  // [step]
};

// How many models (parameters, gradients, AdamW state, a gradient-sized buffer: ~20 bytes per
// parameter) the ranks of this machine can hold at once in 70% of its RAM; on CUDA, in 70% of one GPU's
// memory, shared by the ranks bound to that GPU.
size_t models_that_fit(const TransformerConfig& mcfg, int local_ranks, const torch::Device& device) {
  const bool gpu = device.is_cuda();
  const int sharing = gpu ? ranks_per_gpu(local_ranks) : local_ranks;
  const double per_model = 20.0 * static_cast<double>(mcfg.num_parameters()) * sharing;
  const double ram = gpu ? static_cast<double>(cuda_total_memory_bytes(device))
                         : static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  return std::max<size_t>(2, static_cast<size_t>(0.7 * ram / per_model));
}

// What communication costs when nothing hides it: one all-reduce of every gradient byte at once.
double time_flat_allreduce(ProcessGroup& pg, torch::Tensor& all_grads, bool timed) {
  pg.barrier();  // the baseline step has no collective: ranks may have drifted apart
  trace::set_recording(timed);
  trace::Span s("step", {{"variant", "reference: one flat all-reduce"}});
  Timer t(pg.device());
  pg.all_reduce(all_grads, "all gradients");
  const double dt = t.seconds();
  trace::set_recording(false);
  return dt;
}

}  // namespace

BenchRun bench_variants(ProcessGroup& pg, const BenchConfig& cfg, const std::vector<Variant>& variants) {
  const int W = pg.world_size();
  const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  const LaunchEnv env = LaunchEnv::from_environment();
  // + baseline, + the single-process model on rank 0
  const size_t fit = models_that_fit(mcfg, env.ranks_on_this_machine(), pg.device());
  const size_t per_group = std::max<size_t>(1, fit > 2 ? fit - 2 : 1);
  if (!cfg.trace.empty()) {
    pg.barrier();
    trace::enable();
  }

  BenchRun run;
  run.steps_requested = cfg.steps;
  run.device = pg.device().str();
  // Rank 0's single-process model: the whole global batch, every core.
  std::unique_ptr<Trainee> solo;
  if (pg.rank() == 0) solo = std::make_unique<Trainee>(pg, mcfg, Variant{"single process", nullptr});
  for (size_t first = 0, group = 0; first < variants.size(); first += per_group, ++group) {
    // The baseline and the next few variants, all in memory at once.
    std::vector<std::unique_ptr<Trainee>> ts;
    const std::string base_name =
        group == 0 ? "no communication" : fmt::format("no communication (group {})", group + 1);
    ts.push_back(std::make_unique<Trainee>(pg, mcfg, Variant{base_name, nullptr}));
    for (size_t v = first; v < std::min(variants.size(), first + per_group); ++v)
      ts.push_back(std::make_unique<Trainee>(pg, mcfg, variants[v]));
    print0("  group {}: {} models trained in turn, step by step", group + 1, ts.size());
    const int64_t trainable = count_elements(unique_parameters(*ts[0]->model, /*trainable_only=*/true));
    auto all_grads = torch::zeros({trainable}, torch::TensorOptions().device(pg.device()));

    std::vector<double> flat, single;
    Timer budget(pg.device());
    for (int i = 0; i < cfg.warmup + cfg.steps; ++i) {
      const bool timed = i >= cfg.warmup;
      // Each rank trains on its own B/W sequences of the global batch of step i; so does every variant.
      auto [gx, gy] = token_batch(cfg.global_batch, cfg.context, mcfg.vocab_size, 1234, i);
      auto x = shard_rows(gx, pg.rank(), W).to(pg.device());
      auto y = shard_rows(gy, pg.rank(), W).to(pg.device());
      for (auto& t : ts) {
        t->step(x, y, pg.device(), timed, i, cfg.accumulate);
        if (i == 0) t->bytes = t->strategy->bytes();
      }
      trace::set_recording(false);
      if (i == 0) maybe_inject_fault(pg.rank());  // hardening tests: a rank dies or hangs mid-training
      const double f = time_flat_allreduce(pg, all_grads, timed);
      // Rank 0 trains the whole global batch alone, the others wait: the single-process run that data
      // parallelism must beat, timed in the same round. On every core of its machine; or, where each rank
      // owns K cores (ddp_launch --cpus-per-rank K, as a GPU per rank), on rank 0's K cores, so that N ranks
      // have N times its compute.
      pg.barrier();
      Timer solo_t(pg.device());
      if (solo) {
        const int mine = torch::get_num_threads();
        set_cpu_threads(single_process_threads());
        solo->step(gx.to(pg.device()), gy.to(pg.device()), pg.device(), false, i, cfg.accumulate);
        set_cpu_threads(mine);
      }
      const double s = solo_t.seconds();
      if (timed) {
        flat.push_back(f);
        single.push_back(s);
      }
      // Agree on stopping: every rank must run the same number of steps or the collectives mismatch.
      const bool over = cfg.budget_s > 0 && budget.seconds() > cfg.budget_s && timed && i + 1 < cfg.warmup + cfg.steps;
      if (pg.first_rank_with(over) >= 0) {
        run.cut_by_budget = true;
        print0("  note: --budget {} reached after {} of {} timed steps; every figure below uses {} rounds", cfg.budget,
               i + 1 - cfg.warmup, cfg.steps, i + 1 - cfg.warmup);
        break;
      }
    }
    flat = max_over_ranks(pg, flat);
    auto single_all = pg.all_gather(single);  // only rank 0's entries mean anything
    single = single_all[0];
    std::vector<std::vector<double>> slowest, bwd;
    for (auto& t : ts) {
      slowest.push_back(max_over_ranks(pg, t->step_s));
      bwd.push_back(max_over_ranks(pg, t->bwd_s));
    }
    for (size_t k = 0; k < ts.size(); ++k) {
      BenchRow row;
      row.variant = ts[k]->name;
      row.baseline = base_name;
      row.group = static_cast<int>(group);
      row.calls = ts[k]->strategy->calls_per_step();
      row.sent_bytes = ts[k]->strategy->sent_bytes_per_step();
      const TrainingBytes& b = ts[k]->bytes;  // the largest over ranks (shards differ by their padding)
      const auto most = max_over_ranks(pg, {double(b.params), double(b.grads), double(b.state)});  // one collective
      row.bytes.params = int64_t(most[0]);
      row.bytes.grads = int64_t(most[1]);
      row.bytes.state = int64_t(most[2]);
      row.step_s = slowest[k];
      row.baseline_s = slowest[0];
      row.step = summarize(slowest[k]);
      row.sync = summarize(max_over_ranks(pg, ts[k]->sync_s));
      row.forward = summarize(max_over_ranks(pg, ts[k]->fwd_s));
      row.backward = summarize(bwd[k]);
      row.optimizer = summarize(max_over_ranks(pg, ts[k]->opt_s));
      for (size_t i = 0; i < slowest[k].size(); ++i) {
        const double s = slowest[k][i], b = slowest[0][i];
        row.ratio.push_back(s / b);
        row.speedup.push_back(single[i] / s);
        // Overlap efficiency: of the communication that could have been hidden (all of it, or as much
        // as backward lasts), the share that was: (flat all-reduce - exposed) / min(flat, backward).
        if (k > 0) row.overlap.push_back((flat[i] - (s - b)) / std::min(flat[i], bwd[0][i]));
      }
      run.rows.push_back(std::move(row));
    }
    run.flat_allreduce.insert(run.flat_allreduce.end(), flat.begin(), flat.end());
    run.single_process.insert(run.single_process.end(), single.begin(), single.end());
  }
  if (!cfg.trace.empty()) {
    trace::write(pg, cfg.trace);
    print0(
        "  trace of the timed steps written to {} (open it in ui.perfetto.dev, or: python3 scripts/trace/timeline.py "
        "{})",
        cfg.trace, cfg.trace);
  }
  return run;
}

void add_checkpoint_options(CLI::App& app, BenchConfig& cfg, std::string& dir, bool& resume_only,
                            const std::string& folder_help, const std::string& resume_help) {
  cfg.preset = "tiny";
  cfg.context = 32;
  cfg.steps = 3;
  cfg.global_batch = 12;
  app.add_option("--checkpoint", dir, folder_help)->required();
  auto* resume = app.add_flag("--resume-only", resume_only, resume_help);
  app.add_option("--preset", cfg.preset, "Transformer size")->check(CLI::IsMember(TransformerConfig::preset_names()));
  app.add_option("--steps", cfg.steps, "Steps before the checkpoint (not with --resume-only: one step)")
      ->check(PositiveInt)
      ->excludes(resume);
}

void add_bench_options(CLI::App& app, BenchConfig& cfg) {
  app.add_option("--preset", cfg.preset, "Transformer size: nano, tiny, small, medium, large, xl, 2.7b");
  app.add_option("--batch", cfg.global_batch, "Global batch (sequences per step, split over ranks)")
      ->check(PositiveInt);
  app.add_option("--context", cfg.context, "Context length (tokens per sequence)")->check(PositiveInt);
  app.add_option("--warmup", cfg.warmup, "Untimed steps per variant")->check(NonNegativeFinite);
  app.add_option("--steps", cfg.steps, "Timed steps per variant")->check(PositiveInt);
  app.add_option("--budget", cfg.budget, "Stop timing after this long (e.g. 60s, 5m); reported when it cuts steps");
  app.add_option("--trace", cfg.trace, "Write a Chrome trace (Perfetto) of the timed steps to FILE")->type_name("FILE");
  bench_only(app, {"--preset", "--batch", "--context", "--warmup", "--steps", "--budget", "--trace"});
}

void print_bench_header(const ProcessGroup& pg, const BenchConfig& cfg) {
  print0("\nbenchmark: {}", describe(TransformerConfig::preset(cfg.preset, cfg.context)));
  const std::string comm = pg.device().is_cuda() ? pg.backend() + " on " + pg.device().str() : pg.backend();
  print0("global batch {} ({} per rank), context {}, AdamW, {} ({}, {}), {} warm-up + {} timed steps per variant",
         cfg.global_batch, cfg.global_batch / pg.world_size(), cfg.context, count_of(pg.world_size(), "rank"), comm,
         link_description(), cfg.warmup, cfg.steps);
}

void record(Results& results, const BenchRun& run, const BenchConfig& cfg, int world) {
  results.meta["link"] = link_description();
  results.meta["single_process_threads"] = single_process_threads();
  if (cpus_per_rank() > 0) results.meta["cpus_per_rank"] = cpus_per_rank();
  results.meta["steps_requested"] = run.steps_requested;
  results.meta["cut_by_budget"] = run.cut_by_budget;
  results.meta["flat_allreduce_samples_s"] = run.flat_allreduce;
  results.meta["single_process_samples_s"] = run.single_process;
  const double tokens = static_cast<double>(cfg.global_batch * cfg.context);
  const Stats single = summarize(run.single_process), flat = summarize(run.flat_allreduce);
  for (const auto& row : run.rows) {
    const Stats ratio = summarize(row.ratio), base = summarize(row.baseline_s), speed = summarize(row.speedup);
    // Exposed communication from the same statistic as the ratio, so their signs always agree.
    const double exposed = (ratio.median - 1) * base.median;
    nlohmann::json j = {{"variant", row.variant},
                        {"baseline", row.baseline},
                        {"group", row.group},
                        {"preset", cfg.preset},
                        {"world_size", world},
                        {"link", link_description()},
                        {"global_batch", cfg.global_batch},
                        {"accumulate", cfg.accumulate},
                        {"context", cfg.context},
                        {"steps_requested", run.steps_requested},
                        {"steps", row.step.n},
                        {"cut_by_budget", run.cut_by_budget},
                        {"calls_per_step", row.calls},
                        {"step_s", row.step.median},
                        {"step_min_s", row.step.min},
                        {"step_max_s", row.step.max},
                        {"sync_s", row.sync.median},
                        {"forward_s", row.forward.median},
                        {"backward_s", row.backward.median},
                        {"optimizer_s", row.optimizer.median},
                        {"ratio_to_no_comm", ratio.median},
                        {"ratio_min", ratio.min},
                        {"ratio_max", ratio.max},
                        {"exposed_comm_s", exposed},
                        {"flat_allreduce_s", flat.median},
                        {"single_process_step_s", single.median},
                        {"tokens_per_s", tokens / row.step.median},
                        {"speedup_vs_1proc", speed.median},
                        {"scaling_efficiency", speed.median / world},
                        {"step_samples_s", row.step_s},
                        {"baseline_samples_s", row.baseline_s},
                        {"ratio_samples", row.ratio},
                        {"speedup_samples", row.speedup},
                        {"param_MB", row.bytes.params / 1e6},
                        {"grad_MB", row.bytes.grads / 1e6},
                        {"state_MB", row.bytes.state / 1e6},
                        {"total_MB", row.bytes.total() / 1e6},
                        {"sent_MB_per_step", row.sent_bytes / 1e6}};
    if (run.device != "cpu") j["device"] = run.device;  // the GPU's figures (CPU rows stay as they were)
    if (!row.overlap.empty()) {
      j["overlap_efficiency"] = summarize(row.overlap).median;
      j["overlap_samples"] = row.overlap;
    }
    results.add(j);
    print0("  {:<30} step {:7.3f} s [{:.3f}-{:.3f}]  x{:.3f} of no-comm [{:.3f}-{:.3f}]  exposed {:+.3f} s{}",
           row.variant, row.step.median, row.step.min, row.step.max, ratio.median, ratio.min, ratio.max, exposed,
           row.overlap.empty() ? "" : fmt::format("  overlap {:.2f}", summarize(row.overlap).median));
  }
  print0(
      "  one flat all-reduce of all gradients: {:.3f} s [{:.3f}-{:.3f}]; one process, whole batch, {}: "
      "{:.3f} s [{:.3f}-{:.3f}]",
      flat.median, flat.min, flat.max, count_of(single_process_threads(), "thread"), single.median, single.min,
      single.max);
}

std::string ddp_table(const Results& results) {
  return results.markdown({"variant", "calls_per_step", "step_s", "ratio_to_no_comm", "exposed_comm_s",
                           "overlap_efficiency", "tokens_per_s", "speedup_vs_1proc"},
                          {"variant", "collectives/step", "step (s)", "step / no-comm step", "exposed comm (s)",
                           "overlap efficiency", "tokens/s", "speedup vs 1 process"});
}

std::string memory_table(const Results& results) {
  return results.markdown(
      {"variant", "param_MB", "grad_MB", "state_MB", "total_MB", "sent_MB_per_step"},
      {"variant", "params (MB)", "grads (MB)", "AdamW state (MB)", "total (MB)", "sent per step (MB)"});
}

}  // namespace dp
