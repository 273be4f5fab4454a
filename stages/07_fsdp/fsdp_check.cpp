// FSDP against single-process training: CS336 2026's two FSDP tests, and the common check of every Strategy.
#include "stages/07_fsdp/fsdp_check.hpp"

#include "common/ddp_check.hpp"
#include "common/log.hpp"
#include "common/models.hpp"
#include "common/params.hpp"
#include "common/runtime.hpp"
#include "common/tolerance.hpp"
#include "stages/07_fsdp/strategies.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <mutex>

namespace dp {

namespace optim = torch::optim;

// Data drawn from its own generator: every rank (and the reference) draws the same numbers, and ranks
// running as threads of one test process do not race on the global RNG.
static torch::Generator data_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// [toy]
// How far a gradient entry of FSDP and of the reference can differ, relative to the largest gradient
// entry (tolerance.hpp's model). The weight gradient sums `terms` products (rows x tokens) in another
// grouping, then the W rank partials (the reduce-scatter is fp32): gamma_{terms + W} in fp32, for
// ATen accumulates bf16 products and sums in fp32 too and rounds the result once. The loss's scale
// 1/rows differs from 1/(rows W): every op between the loss and the weight (`depth`) may then round its
// output differently, forward and backward (2 roundings of the compute dtype per op), and below fp32
// each run also rounds its weight gradient once to the compute dtype (2 more).
double fsdp_gradient_error(double terms, int W, int depth, torch::ScalarType dtype, double* roundings) {
  const double low = 2.0 * depth + (dtype == torch::kFloat32 ? 0 : 2);
  if (roundings) *roundings = low;
  return (terms + W) * unit_roundoff(torch::kFloat32) + low * unit_roundoff(dtype);
}

Margin check_toy_fsdp(ProcessGroup& pg, FsdpOptions opts, uint64_t seed) {
  const int W = pg.world_size(), r = pg.rank();
  const int64_t rows = 10, T = 8;  // per rank
  ToyFSDPModel ref{nullptr}, cmp{nullptr}, shd{nullptr};
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    torch::manual_seed(42 + seed);
    ref = ToyFSDPModel(), cmp = ToyFSDPModel(), shd = ToyFSDPModel();
  }
  copy_parameters(*shd, *ref);
  ref->to(pg.device()), cmp->to(pg.device()), shd->to(pg.device());
  Fsdp fsdp(pg, shd.ptr(), shd->units(), opts);
  optim::SGD ref_opt(ref->parameters(), optim::SGDOptions(0.01)), opt(fsdp.parameters(), optim::SGDOptions(0.01));
  auto last_token_loss = [](const torch::Tensor& logits, const torch::Tensor& labels) {
    return torch::nn::functional::cross_entropy(logits.select(1, -1).to(torch::kFloat32), labels);
  };
  constexpr int kSteps = 3;
  const double lr = 0.01;
  double G = 0;  // the largest |gradient| entry of any step: the scale of the bound
  Margin result;
  for (int step = 0; step < kSteps; ++step) {
    auto gen = data_generator(123 + 1000 * seed + step);  // reshuffled every step, identically on every rank
    auto tokens = torch::randint(0, 100, {rows * W, T}, gen).to(pg.device());
    auto labels = torch::randint(0, 100, {rows * W}, gen).to(pg.device());
    ref_opt.zero_grad();  // the reference computes as FSDP does: Linear/Embedding weights in the compute dtype
    reference_backward(*ref, *cmp, [&](const torch::nn::Module& m) { return compute_dtype_of(m, opts); },
                       [&](torch::nn::Module& m) { return last_token_loss(static_cast<ToyFSDPModelImpl&>(m).forward(tokens), labels); });
    ref_opt.step();
    G = std::max(G, max_abs_grad(ref->parameters()));
    opt.zero_grad();
    last_token_loss(shd->forward_units(tokens.narrow(0, r * rows, rows), fsdp.runner()), labels.narrow(0, r * rows, rows)).backward();
    fsdp.finish_gradient_synchronization();
    opt.step();
    result.diff = std::max(result.diff, max_full_diff(fsdp.gather_full_parameters(), *ref));
  }
  // The last token of rows * W rows is summed; the chain from a weight to the loss: embedding, 2 norms,
  // fc1, fc2, lm_head, the cross-entropy (7 ops). Plain SGD: the steps' differences add up.
  double n = 0;
  const double rel = fsdp_gradient_error(double(rows * W), W, 7, opts.compute_dtype, &n);
  const double w = max_abs(ref->parameters());
  result.bound = sgd_weight_bound(lr, 0.0, kSteps, rel * G, w);
  result.derivation = fmt::format("lr {} x {} steps x ({} sums x u(fp32) + {:.0f} roundings x u({})) x max|g| {:.3g}, "
                                  "plus {} ulps of max|w| {:.3g}", lr, kSteps, rows * W + W, n,
                                  dtype_name(opts.compute_dtype), G, kSteps, w);
  return worst_over_ranks(pg, result);
}
// [toy]

void check_fsdp_gradients(ProcessGroup& pg, FsdpOptions opts) {
  ToyFSDPModel model{nullptr};
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    torch::manual_seed(42);
    model = ToyFSDPModel();
  }
  model->to(pg.device());
  Fsdp fsdp(pg, model.ptr(), model->units(), opts);
  auto gen = data_generator(7 + pg.rank());  // every rank its own data
  auto tokens = torch::randint(0, 100, {4, 8}, gen).to(pg.device());
  model->forward_units(tokens, fsdp.runner()).to(torch::kFloat32).sum().backward();
  fsdp.finish_gradient_synchronization();
  auto params = fsdp.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& g = params[i].grad();
    if (!g.defined() || g.sizes() != params[i].sizes() || g.scalar_type() != torch::kFloat32)
      throw CheckFailed(fmt::format("optimizer tensor {} {}: gradient {} {}", i, shape_text(params[i].sizes()),
                                    g.defined() ? shape_text(g.sizes()) : "missing",
                                    g.defined() ? c10::toString(g.scalar_type()) : ""));
    if (i < fsdp.unit_count()) continue;  // shards differ across ranks by design
    for (const auto& other : pg.all_gather(g))
      if (!torch::equal(other, g)) throw CheckFailed(fmt::format("replicated gradient {} differs across ranks", i));
  }
}

std::vector<FsdpOptions> fsdp_check_modes(const std::vector<bool>& reshard_modes) {
  std::vector<FsdpOptions> modes;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (bool reshard : reshard_modes) {
      modes.emplace_back();
      modes.back().compute_dtype = dtype, modes.back().reshard_after_forward = reshard;
    }
  return modes;
}

std::vector<bool> FsdpFlags::modes() const {
  std::vector<bool> m;
  if (reshard != "false") m.push_back(true);
  if (reshard != "true") m.push_back(false);
  return m;
}

void add_fsdp_flags(CLI::App& app, FsdpFlags& flags) {
  app.add_option("--reshard-after-forward", flags.reshard,
                 "true: free gathered weights after forward (ZeRO-3); false: keep them until backward; both")
      ->check(CLI::IsMember({"true", "false", "both"}));
  app.add_option("--compute-dtype", flags.dtype, "With the benchmark: float32 or bfloat16 (bf16) for FSDP's gathered weights")
      ->check([](const std::string& v) {
        try { parse_compute_dtype(v); } catch (const UsageError& e) { return std::string(e.what()); }
        return std::string();
      });
}

std::string fsdp_mode_name(const FsdpOptions& f) {
  return fmt::format("{}, {}", dtype_name(f.compute_dtype), f.reshard_after_forward ? "reshard after forward"
                                                                                         : "keep until backward");
}

bool run_fsdp_checks(ProcessGroup& pg, const std::vector<bool>& reshard_modes, uint64_t seed) {
  // [checks]
  bool all_ok = true;
  for (const FsdpOptions& f : fsdp_check_modes(reshard_modes)) {
    bool ok = report_margin(check_toy_fsdp(pg, f, seed), fmt::format("FSDP == one process on ToyFSDPModel ({}; 3 SGD "
                                                                      "steps, {} ranks)", fsdp_mode_name(f), pg.world_size()));
    check_fsdp_gradients(pg, f);  // throws CheckFailed
    print0("PASS FSDP gradients ({}): fp32, shard-shaped, replicated ones equal on every rank", fsdp_mode_name(f));
    // The check every Strategy passes (common/ddp_check.hpp), with a reference computing in f's dtype:
    // SGD with momentum (state to shard), every rank starting from its own weights, micro-batches.
    for (int k : {1, 2})
      ok = report_margin(check_strategy(pg, fsdp_strategy(f), /*steps=*/3, seed, /*accumulate=*/k),
                         fmt::format("FSDP as a Strategy == one process ({}; 3 SGD steps with momentum, {} micro-batch{} "
                                     "per step)", fsdp_mode_name(f), k, k > 1 ? "es" : "")) && ok;
    all_ok = all_ok && ok;
  }
  // [checks]
  return all_ok;
}

}  // namespace dp
