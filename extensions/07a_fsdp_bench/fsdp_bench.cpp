// Extension 07a's benchmark: bucketed DDP (stage 05) and flat ZeRO-1 (stage 06) against FSDP (stage 07)
// in both resharding modes, on the Transformer.
// All variants are built first and then take turns step by step, so each round's ratio compares steps
// run back to back. Memory is counted tensor by tensor; peak RSS only means something for one variant
// per process (--variants fsdp), which is how scripts/bench/bench_docs.sh measures it.
#include "extensions/07a_fsdp_bench/fsdp_bench.hpp"

#include "common/measure/accounting.hpp"
#include "common/dist/launch_env.hpp"
#include "common/measure/memory.hpp"
#include "common/model/models.hpp"
#include "common/measure/results.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/timing.hpp"
#include "common/base/format.hpp"  // dtype_name
#include "common/base/trace.hpp"
#include "common/measure/trace_write.hpp"
#include "common/model/transformer.hpp"
#include "common/contract/grad_sync.hpp"  // broadcast_parameters
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/06_sharded_opt/zero1_optimizer.hpp"

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
  const MemoryPool pool = memory_pool(LaunchEnv::from_environment().local_world_size, o.cuda);
  const std::string remedy = o.compute_dtype == torch::kFloat32
                                 ? "use more ranks (more machines), a smaller --preset or --compute-dtype bf16"
                                 : "use more ranks (more machines) or a smaller --preset";
  for (const auto& v : o.variants)
    if (v != "ddp")
      check_fits_in_memory(estimated_bytes_per_rank(o, v, world), pool.ranks, "FSDP (" + v + ")", remedy, pool.available,
                           pool.where);
  // The variants train side by side: keep those that fit together, FSDP first, and say what was left out.
  std::vector<std::string> order = o.variants, kept;
  std::stable_partition(order.begin(), order.end(), [](const std::string& v) { return v == "fsdp"; });
  double total = 0;
  for (const auto& v : order) {
    const double need = estimated_bytes_per_rank(o, v, world) * pool.ranks;
    if (pool.available > 0 && total + need > 0.9 * pool.available) {
      print0("note: {} left out: it needs about {:.1f} GB per rank ({:.1f} GB for {} ranks here) beside the others, "
             "and {} has {:.1f} GB available", v, need / pool.ranks / 1e9, need / 1e9, pool.ranks, pool.where,
             pool.available / 1e9);
      continue;
    }
    total += need, kept.push_back(v);
  }
  if (kept.empty())  // nothing left to measure: an empty table is no result
    throw UsageError(fmt::format("no variant of --variants fits in {} with a tenth of it to spare ({:.1f} GB "
                                 "available): {}", pool.where, pool.available / 1e9, remedy));
  std::vector<std::string> in_order;  // back to the requested order
  for (const auto& v : o.variants)
    if (std::count(kept.begin(), kept.end(), v)) in_order.push_back(v);
  o.variants = in_order;
}

namespace {

// One model in training with DDP, ZeRO-1 or FSDP, its AdamW, and what it measured.
struct Trainee {
  std::string name;
  TransformerLM model{nullptr};
  std::unique_ptr<BucketedDdp> ddp;
  std::unique_ptr<Zero1Optimizer> zero1;  // owns its AdamW (on this rank's chunk); opt stays empty
  UnitRunner run;                         // FSDP's
  std::unique_ptr<Fsdp> fsdp;
  std::unique_ptr<optim::AdamW> opt;
  std::vector<double> step_s;
  TrainingBytes bytes;      // after the first step (AdamW state allocated)
  double sent_per_step = 0;
  int64_t step_peak_cuda = 0;  // CUDA: the most a step (after the first) allocated above what was allocated before it

  Trainee(ProcessGroup& pg, const TransformerConfig& mcfg, const FsdpBenchOptions& o, const std::string& variant)
      : name(variant) {
    torch::manual_seed(0);  // every variant trains the same model
    model = TransformerLM(mcfg);
    model->to(pg.device());
    const auto adamw = optim::AdamWOptions(1e-4);
    if (variant == "ddp") {
      ddp = std::make_unique<BucketedDdp>(pg, model.ptr(), 25.0);  // PyTorch's default bucket cap
      opt = std::make_unique<optim::AdamW>(model->parameters(), adamw);
    } else if (variant == "zero1") {
      broadcast_parameters(pg, *model);  // no DDP wrapper to do it
      zero1 = Zero1Optimizer::make<optim::AdamW>(pg, model->parameters(), adamw);
    } else {
      FsdpOptions f;
      f.reshard_after_forward = variant == "fsdp", f.compute_dtype = o.compute_dtype;
      fsdp = std::make_unique<Fsdp>(pg, model.ptr(), model->units(), f);
      opt = std::make_unique<optim::AdamW>(fsdp->parameters(), adamw);
      run = fsdp->runner();
    }
  }

  // [step]
  double step(const torch::Tensor& x, const torch::Tensor& y, const torch::Device& device, int round) {
    trace::Span whole("step", {{"variant", name}, {"round", round}});
    Timer t(device);
    if (ddp) ddp->on_train_batch_start();
    if (zero1) zero1->zero_grad();
    else opt->zero_grad();
    torch::Tensor loss;
    {
      trace::Span f("forward");
      auto logits = run ? model->forward_units(x, run) : model->forward(x);
      loss = lm_loss(logits.to(torch::kFloat32), y);
    }
    { trace::Span b("backward"); loss.backward(); }  // FSDP: reduce-scatters leave from in here
    if (ddp || fsdp) {  // ZeRO-1 finishes its reduce-scatters in its step()
      trace::Span s("sync");
      if (ddp) ddp->finish_gradient_synchronization();
      else fsdp->finish_gradient_synchronization();
    }
    {
      trace::Span s("optimizer");
      if (zero1) zero1->step();  // reduce-scatter, step this rank's chunk, all-gather
      else opt->step();
    }
    return t.seconds();
  }
  // [step]

  TrainingBytes count() const {
    if (ddp) return count_training_bytes(*model, *opt);
    if (zero1) return count_training_bytes(*model, zero1->local());  // whole params and grads, 1/N of AdamW
    TrainingBytes b;  // FSDP: what the optimizer steps is what the rank keeps
    for (const auto& p : fsdp->parameters()) b.params += tensor_bytes({p}), b.grads += tensor_bytes({p.grad()});
    b.state = optimizer_state_bytes(*opt);
    return b;
  }
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
  if (!o.cfg.trace.empty()) pg.barrier(), trace::enable();
  const int64_t rows = o.cfg.global_batch / W, T = o.cfg.context;
  for (int it = 0; it < o.cfg.warmup + o.cfg.steps; ++it) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + it * W + pg.rank());  // each rank its own batch
    auto tokens = torch::randint(0, mcfg.vocab_size, {rows, T + 1}, gen).to(pg.device());
    auto x = tokens.narrow(1, 0, T), y = tokens.narrow(1, 1, T);
    const bool timed = it >= o.cfg.warmup;
    trace::set_recording(timed);  // no-op without --trace
    for (auto& t : ts) {
      const double sent0 = t->fsdp ? t->fsdp->sent_bytes() : 0;
      const int64_t allocated = cuda_allocated_bytes(dev);  // every variant's resident state (0 on the CPU)
      cuda_peak = std::max(cuda_peak, cuda_peak_allocated_bytes(dev));
      reset_cuda_peak(dev);
      const double s = t->step(x, y, dev, it);
      if (it > 0) t->step_peak_cuda = std::max(t->step_peak_cuda, cuda_peak_allocated_bytes(dev) - allocated);
      if (timed) t->step_s.push_back(s);
      if (it == 0) t->bytes = t->count(), t->sent_per_step = t->fsdp ? t->fsdp->sent_bytes() - sent0 : 0;
    }
    print0("  step {} of {} done: RSS {:.2f} GB, peak {:.2f} GB{} (rank 0)", it + 1, o.cfg.warmup + o.cfg.steps,
           current_rss_bytes() / 1e9, peak_rss_bytes() / 1e9, cuda_note());
  }
  cuda_peak = std::max(cuda_peak, cuda_peak_allocated_bytes(dev));
  trace::set_recording(false);
  if (!o.cfg.trace.empty()) trace::write(pg, o.cfg.trace), print0("trace of the timed steps written to {}", o.cfg.trace);
  auto max_all = [&](double v) { auto a = pg.all_gather(v); return *std::max_element(a.begin(), a.end()); };
  const double rss = max_all(static_cast<double>(peak_rss_bytes()));
  const double cuda_peak_all = cuda ? max_all(static_cast<double>(cuda_peak)) : 0.0;
  std::vector<double> first;  // the first variant's per-round steps: the ratios' denominator
  for (auto& t : ts) {
    const auto per_round = max_over_ranks(pg, t->step_s);
    if (first.empty()) first = per_round;
    std::vector<double> ratio;
    for (size_t k = 0; k < per_round.size(); ++k) ratio.push_back(per_round[k] / first[k]);
    const Stats st = summarize(per_round), rt = summarize(ratio);
    const bool zero = t->zero1 != nullptr;
    const int64_t np = mcfg.num_parameters();
    const double sent = t->ddp ? ddp_bytes_per_step(np, W) : zero ? zero1_bytes_per_step(np, W) : t->sent_per_step;
    nlohmann::json row{{"variant", t->name}, {"vs", ts.front()->name}, {"world_size", W}, {"link", link_description()},
                       {"preset", o.cfg.preset},
                       {"context", o.cfg.context}, {"batch", o.cfg.global_batch}, {"params", mcfg.num_parameters()},
                       {"compute_dtype", t->fsdp ? dtype_name(o.compute_dtype) : "float32"},
                       {"param_MB", max_all(t->bytes.params) / 1e6}, {"grad_MB", max_all(t->bytes.grads) / 1e6},
                       {"state_MB", max_all(t->bytes.state) / 1e6}, {"total_MB", max_all(t->bytes.total()) / 1e6},
                       {"expected_MB", double(t->ddp  ? fp32_training_bytes(np).total()        // 16P
                                              : zero ? zero1_expected_bytes(np, W).total()  // 8P + 8P/N
                                                     : fsdp_expected_bytes(np, W).total()) / 1e6},  // 16P/N
                       {"gathered_peak_MB", t->fsdp ? max_all(t->fsdp->peak_gathered_bytes()) / 1e6 : 0.0},
                       {"peak_rss_MB", alone && reset_ok ? rss / 1e6 : -1.0},
                       {"sent_MB_per_step", sent / 1e6}, {"steps", st.n}, {"step_median_s", st.median},
                       {"step_min_s", st.min}, {"step_max_s", st.max}, {"ratio_median", rt.median},
                       {"ratio_min", rt.min}, {"ratio_max", rt.max}, {"step_s", per_round}, {"ratio", ratio}};
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
  std::vector<std::string> keys{"variant", "world_size", "compute_dtype", "param_MB", "grad_MB", "state_MB", "total_MB",
                                "expected_MB", "gathered_peak_MB", "peak_rss_MB"};
  std::vector<std::string> heads{"variant", "ranks", "compute", "params", "grads", "AdamW state", "total", "by formula",
                                 "gathered (peak)", "peak RSS"};
  std::string cuda_note;
  if (!r.rows().empty() && r.rows().front().contains("peak_cuda_MB")) {  // run on CUDA: GPU memory beside
    keys.insert(keys.end(), {"peak_cuda_MB", "step_peak_cuda_MB"});
    heads.insert(heads.end(), {"peak CUDA", "step peak CUDA"});
    cuda_note = "; on the GPU, CUDA's caching allocator: the process's peak allocated (-1: several variants ran), and\n"
                "the most one step allocated above what was allocated before it (after the first step)";
  }
  print0("\nmemory per rank in MB (10^6 B), counted tensor by tensor after the first step (max over ranks): DDP keeps\n"
         "16P, ZeRO-1 8P + 8P/N, FSDP 16P/N plus the gathered units at their peak; peak RSS of the process (-1: several\n"
         "variants ran){}\n{}",
         cuda_note, r.markdown(keys, heads, 4));
  print0("\ntime per step (slowest rank): median and range over the rounds; ratio to the first variant taken round\n"
         "by round; bytes each rank sends per step (ring arithmetic: DDP and ZeRO-1 2(N-1)/N x 4P, FSDP as launched)\n{}",
         r.markdown({"variant", "vs", "world_size", "preset", "steps", "sent_MB_per_step", "step_median_s",
                     "step_min_s", "step_max_s", "ratio_median", "ratio_min", "ratio_max"},
                    {"variant", "ratio to", "ranks", "preset", "steps", "sent per step (MB)", "step (s)", "min",
                     "max", "ratio", "ratio min", "ratio max"}, 4));
}

}  // namespace dp
