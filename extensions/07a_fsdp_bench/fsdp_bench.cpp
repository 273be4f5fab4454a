// Extension 07a's benchmark: bucketed DDP (stage 05) and flat ZeRO-1 (stage 06) against FSDP (stage 07)
// in both resharding modes, on the Transformer.
// All variants are built first and then take turns step by step, so each round's ratio compares steps
// run back to back. Memory is counted tensor by tensor; peak RSS only means something for one variant
// per process (--variants fsdp), which is how scripts/bench/bench_docs.sh measures it.
#include "extensions/07a_fsdp_bench/fsdp_bench.hpp"

#include "common/base/format.hpp"  // dtype_name
#include "common/base/trace.hpp"
#include "common/contract/strategy.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/accounting.hpp"
#include "common/measure/memory.hpp"
#include "common/measure/results.hpp"
#include "common/measure/timing.hpp"
#include "common/measure/trace_write.hpp"
#include "common/model/models.hpp"
#include "common/model/transformer.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"   // bucketed_ddp_strategy
#include "stages/06_sharded_opt/strategies.hpp"  // zero1_strategy
#include "stages/07_fsdp/strategies.hpp"         // fsdp_strategy

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

namespace dp {

namespace optim = torch::optim;

double estimated_bytes_per_rank(const FsdpBenchOptions& o, const std::string& variant, int world) {
  const int e = o.compute_dtype == torch::kFloat32 ? 4 : 2;  // bytes per gathered value
  return peak_training_bytes(TransformerConfig::preset(o.cfg.preset, o.cfg.context), variant, world,
                             o.cfg.global_batch / world, e);
}

void check_memory(FsdpBenchOptions& o, int world) {
  // Where the tensors live: this machine's memory, shared by its ranks, or one GPU's, shared by those bound to it.
  const MemoryPool pool = memory_pool(LaunchEnv::from_environment().ranks_on_this_machine(), o.cuda);
  const std::string remedy = o.compute_dtype == torch::kFloat32
                                 ? "use more ranks (more machines), a smaller --preset or --compute-dtype bf16"
                                 : "use more ranks (more machines) or a smaller --preset";
  for (const auto& v : o.variants)
    if (v != "ddp")
      check_fits_in_memory(estimated_bytes_per_rank(o, v, world), pool.ranks, "FSDP (" + v + ")", remedy,
                           pool.available, pool.where);
  // The variants train side by side: keep those that fit together, FSDP first, and say what was left out.
  std::vector<std::string> order = o.variants, kept;
  std::stable_partition(order.begin(), order.end(), [](const std::string& v) { return v == "fsdp"; });
  double total = 0;
  for (const auto& v : order) {
    const double need = estimated_bytes_per_rank(o, v, world) * pool.ranks;
    if (pool.available > 0 && total + need > 0.9 * pool.available) {
      print0(
          "note: {} left out: it needs about {:.1f} GB per rank ({:.1f} GB for {} ranks here) beside the others, "
          "and {} has {:.1f} GB available",
          v, need / pool.ranks / 1e9, need / 1e9, pool.ranks, pool.where, pool.available / 1e9);
      continue;
    }
    total += need;
    kept.push_back(v);
  }
  if (kept.empty())  // nothing left to measure: an empty table is no result
    throw UsageError(
        fmt::format("no variant of --variants fits in {} with a tenth of it to spare ({:.1f} GB "
                    "available): {}",
                    pool.where, pool.available / 1e9, remedy));
  std::vector<std::string> in_order;  // back to the requested order
  for (const auto& v : o.variants)
    if (std::count(kept.begin(), kept.end(), v)) in_order.push_back(v);
  o.variants = in_order;
}

namespace {

// A variant's way of training, as its stage gives it: stage 05's DDP with PyTorch's default 25 MB buckets,
// stage 06's ZeRO-1, stage 07's FSDP (resharding after forward, or keeping the gathered weights).
MakeStrategy strategy_of(const std::string& variant, const FsdpBenchOptions& o) {
  if (variant == "ddp") return bucketed_ddp_strategy(25.0);
  if (variant == "zero1") return zero1_strategy();
  FsdpOptions f;
  f.reshard_after_forward = variant == "fsdp";
  f.compute_dtype = o.compute_dtype;
  return fsdp_strategy(f);
}

// What a rank holds between steps by the formulas of common/measure/accounting.hpp.
double expected_bytes(const std::string& variant, int64_t params, int world) {
  if (variant == "ddp") return fp32_training_bytes(params).total();            // 16P
  if (variant == "zero1") return zero1_expected_bytes(params, world).total();  // 8P + 8P/N
  return fsdp_expected_bytes(params, world).total();                           // 16P/N
}

// One model in training with one variant's Strategy and AdamW, and what it measured.
struct Trainee {
  std::string name;
  TransformerLM model{nullptr};
  std::unique_ptr<Strategy> strategy;
  std::vector<double> step_s;
  TrainingBytes bytes;         // after the first step (AdamW state allocated)
  double sent_per_step = 0;    // the Strategy's figure after the first step (FSDP: counted in it)
  int64_t step_peak_cuda = 0;  // CUDA: the most a step (after the first) allocated above what was allocated before it

  Trainee(ProcessGroup& pg, const TransformerConfig& mcfg, const FsdpBenchOptions& o, const std::string& variant)
      : name(variant) {
    torch::manual_seed(0);  // every variant trains the same model
    model = TransformerLM(mcfg);
    model->to(pg.device());
    const auto adamw = optim::AdamWOptions(1e-4);
    const MakeOptimizer make = [adamw](std::vector<torch::Tensor> params) {
      return std::make_unique<optim::AdamW>(std::move(params), adamw);
    };
    strategy = strategy_of(variant, o)(pg, model.ptr(), make);  // every rank starts from rank 0's weights
  }

  // [step]
  double step(const torch::Tensor& x, const torch::Tensor& y, const torch::Device& device, int round) {
    trace::Span whole("step", {{"variant", name}, {"round", round}});
    Timer t(device);
    strategy->zero_grad();
    torch::Tensor loss;
    {
      trace::Span f("forward");  // FSDP gathers each unit's weights in its runner; the others run plain forward
      auto logits = model->forward_units(x, strategy->runner());
      loss = lm_loss(logits.to(torch::kFloat32), y);
    }
    {
      trace::Span b("backward");
      loss.backward();  // DDP's buckets and FSDP's reduce-scatters leave from in here
    }
    {
      trace::Span s("sync");
      strategy->after_backward();  // waits for them; ZeRO-1 has nothing to wait for yet
    }
    {
      trace::Span s("optimizer");
      strategy->step();  // ZeRO-1: reduce-scatter, step this rank's chunk, all-gather
    }
    return t.seconds();
  }
  // [step]
};

}  // namespace

void run_benchmark(ProcessGroup& pg, const FsdpBenchOptions& o, Results& results) {
  const auto mcfg = TransformerConfig::preset(o.cfg.preset, o.cfg.context);
  const int W = pg.world_size();
  const bool alone = o.variants.size() == 1;  // then the peak RSS is this variant's
  const bool reset_ok = reset_peak_rss();
  // On CUDA the training state lives in GPU memory: the caching allocator's figures, not the host's RSS.
  const torch::Device dev = pg.device();
  const bool cuda = dev.is_cuda();
  reset_cuda_peak(dev);
  int64_t cuda_peak = 0;  // the process's peak allocated (each step resets the allocator's own peak)
  auto cuda_note = [&] {
    return cuda ? fmt::format(", CUDA allocated {:.2f} GB", cuda_allocated_bytes(dev) / 1e9) : std::string();
  };
  std::vector<std::unique_ptr<Trainee>> ts;
  for (const auto& v : o.variants) ts.push_back(std::make_unique<Trainee>(pg, mcfg, o, v));
  print0("  built: RSS {:.2f} GB, peak {:.2f} GB{} (rank 0)", current_rss_bytes() / 1e9, peak_rss_bytes() / 1e9,
         cuda_note());
  if (!o.cfg.trace.empty()) {
    pg.barrier();
    trace::enable();
  }
  const int64_t rows = o.cfg.global_batch / W, T = o.cfg.context;
  for (int it = 0; it < o.cfg.warmup + o.cfg.steps; ++it) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + it * W + pg.rank());  // each rank its own batch
    auto tokens = torch::randint(0, mcfg.vocab_size, {rows, T + 1}, gen).to(pg.device());
    auto x = tokens.narrow(1, 0, T), y = tokens.narrow(1, 1, T);
    const bool timed = it >= o.cfg.warmup;
    trace::set_recording(timed);  // no-op without --trace
    for (auto& t : ts) {
      const int64_t allocated = cuda_allocated_bytes(dev);  // every variant's resident state (0 on the CPU)
      cuda_peak = std::max(cuda_peak, cuda_peak_allocated_bytes(dev));
      reset_cuda_peak(dev);
      const double s = t->step(x, y, dev, it);
      if (it > 0) t->step_peak_cuda = std::max(t->step_peak_cuda, cuda_peak_allocated_bytes(dev) - allocated);
      if (timed) t->step_s.push_back(s);
      if (it == 0) {
        t->bytes = t->strategy->bytes();
        t->sent_per_step = t->strategy->sent_bytes_per_step();
      }
    }
    print0("  step {} of {} done: RSS {:.2f} GB, peak {:.2f} GB{} (rank 0)", it + 1, o.cfg.warmup + o.cfg.steps,
           current_rss_bytes() / 1e9, peak_rss_bytes() / 1e9, cuda_note());
  }
  cuda_peak = std::max(cuda_peak, cuda_peak_allocated_bytes(dev));
  trace::set_recording(false);
  if (!o.cfg.trace.empty()) {
    trace::write(pg, o.cfg.trace);
    print0("trace of the timed steps written to {}", o.cfg.trace);
  }
  auto max_all = [&](double v) {
    auto a = pg.all_gather(v);
    return *std::max_element(a.begin(), a.end());
  };
  const double rss = max_all(static_cast<double>(peak_rss_bytes()));
  const double cuda_peak_all = cuda ? max_all(static_cast<double>(cuda_peak)) : 0.0;
  std::vector<double> first;  // the first variant's per-round steps: the ratios' denominator
  for (auto& t : ts) {
    const auto per_round = max_over_ranks(pg, t->step_s);
    if (first.empty()) first = per_round;
    std::vector<double> ratio;
    for (size_t k = 0; k < per_round.size(); ++k) ratio.push_back(per_round[k] / first[k]);
    const Stats st = summarize(per_round), rt = summarize(ratio);
    const bool fsdp = t->name != "ddp" && t->name != "zero1";
    nlohmann::json row{{"variant", t->name},
                       {"vs", ts.front()->name},
                       {"world_size", W},
                       {"link", link_description()},
                       {"preset", o.cfg.preset},
                       {"context", o.cfg.context},
                       {"batch", o.cfg.global_batch},
                       {"params", mcfg.num_parameters()},
                       {"compute_dtype", fsdp ? dtype_name(o.compute_dtype) : "float32"},
                       {"param_MB", max_all(t->bytes.params) / 1e6},
                       {"grad_MB", max_all(t->bytes.grads) / 1e6},
                       {"state_MB", max_all(t->bytes.state) / 1e6},
                       {"total_MB", max_all(t->bytes.total()) / 1e6},
                       {"expected_MB", expected_bytes(t->name, mcfg.num_parameters(), W) / 1e6},
                       {"gathered_peak_MB", max_all(t->strategy->gathered_peak_bytes()) / 1e6},
                       {"peak_rss_MB", alone && reset_ok ? rss / 1e6 : -1.0},
                       {"sent_MB_per_step", t->sent_per_step / 1e6},
                       {"steps", st.n},
                       {"step_median_s", st.median},
                       {"step_min_s", st.min},
                       {"step_max_s", st.max},
                       {"ratio_median", rt.median},
                       {"ratio_min", rt.min},
                       {"ratio_max", rt.max},
                       {"step_s", per_round},
                       {"ratio", ratio}};
    if (cuda) {  // GPU memory, from CUDA's caching allocator (max over ranks)
      row["device"] = dev.str();
      row["peak_cuda_MB"] = alone ? cuda_peak_all / 1e6 : -1.0;
      row["step_peak_cuda_MB"] = max_all(static_cast<double>(t->step_peak_cuda)) / 1e6;
    }
    results.add(row);
  }
  if (!alone) print0("note: peak RSS is reported for one variant per process only (--variants fsdp)");
}

void print_tables(const Results& r) {
  std::vector<std::string> keys{"variant",  "world_size", "compute_dtype", "param_MB",         "grad_MB",
                                "state_MB", "total_MB",   "expected_MB",   "gathered_peak_MB", "peak_rss_MB"};
  std::vector<std::string> heads{"variant",     "ranks", "compute",    "params",          "grads",
                                 "AdamW state", "total", "by formula", "gathered (peak)", "peak RSS"};
  std::string cuda_note;
  if (!r.rows().empty() && r.rows().front().contains("peak_cuda_MB")) {  // run on CUDA: GPU memory beside
    keys.insert(keys.end(), {"peak_cuda_MB", "step_peak_cuda_MB"});
    heads.insert(heads.end(), {"peak CUDA", "step peak CUDA"});
    cuda_note =
        "; on the GPU, CUDA's caching allocator: the process's peak allocated (-1: several variants ran), and\n"
        "the most one step allocated above what was allocated before it (after the first step)";
  }
  print0(
      "\nmemory per rank in MB (10^6 B), counted tensor by tensor after the first step (max over ranks): DDP keeps\n"
      "16P, ZeRO-1 8P + 8P/N, FSDP 16P/N plus the gathered units at their peak; peak RSS of the process (-1: several\n"
      "variants ran){}\n{}",
      cuda_note, r.markdown(keys, heads, 4));
  print0(
      "\ntime per step (slowest rank): median and range over the rounds; ratio to the first variant taken round\n"
      "by round; bytes each rank sends per step (ring arithmetic: DDP and ZeRO-1 2(N-1)/N x 4P, FSDP as launched)\n{}",
      r.markdown({"variant", "vs", "world_size", "preset", "steps", "sent_MB_per_step", "step_median_s", "step_min_s",
                  "step_max_s", "ratio_median", "ratio_min", "ratio_max"},
                 {"variant", "ratio to", "ranks", "preset", "steps", "sent per step (MB)", "step (s)", "min", "max",
                  "ratio", "ratio min", "ratio max"},
                 4));
}

}  // namespace dp
