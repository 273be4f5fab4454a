// FSDP against single-process training: CS336 2026's two FSDP tests, and the Transformer.
#include "stages/07_fsdp/fsdp_check.hpp"

#include "common/log.hpp"
#include "common/models.hpp"
#include "common/params.hpp"
#include "common/runtime.hpp"
#include "common/tolerance.hpp"
#include "common/transformer.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace dp {

namespace optim = torch::optim;

// Data drawn from its own generator: every rank (and the reference) draws the same numbers, and ranks
// running as threads of one test process do not race on the global RNG.
static torch::Generator data_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// The reference's mixed precision: `cmp` computes with `ref`'s weights, those FSDP would gather in the
// compute dtype cast to it (Linear, Embedding), the others (norms) as they are.
static void load_compute_copy(torch::nn::Module& cmp, torch::nn::Module& ref, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  std::unordered_set<const void*> cast;
  for (const auto& m : cmp.modules())
    if (is_sharded_module(*m))
      for (const auto& p : m->parameters(/*recurse=*/false)) cast.insert(p.unsafeGetTensorImpl());
  auto c = unique_parameters(cmp), r = unique_parameters(ref);
  for (size_t i = 0; i < c.size(); ++i)
    c[i].set_data(cast.count(c[i].unsafeGetTensorImpl()) ? r[i].detach().to(dtype) : r[i].detach().clone());
}

// One reference step: forward/backward through `cmp` (a compute-dtype copy) or `ref` itself, then SGD/AdamW.
template <typename Loss>
static void reference_step(torch::nn::Module& ref, torch::nn::Module& cmp, optim::Optimizer& opt,
                           torch::ScalarType dtype, const Loss& loss_of) {
  opt.zero_grad();
  if (dtype == torch::kFloat32) {
    loss_of(ref).backward();
  } else {
    load_compute_copy(cmp, ref, dtype);
    for (auto& p : cmp.parameters()) p.mutable_grad() = torch::Tensor();  // this step's gradient only
    loss_of(cmp).backward();
    auto c = unique_parameters(cmp), r = unique_parameters(ref);
    for (size_t i = 0; i < c.size(); ++i) r[i].mutable_grad() = c[i].grad().to(torch::kFloat32);
  }
  opt.step();
}

static double max_diff(const std::vector<std::pair<std::string, torch::Tensor>>& full, torch::nn::Module& ref) {
  auto r = unique_named_parameters(ref, /*trainable_only=*/true);
  double d = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (full[i].first != r[i].first) throw CheckFailed("parameter order differs: " + full[i].first + " vs " + r[i].first);
    d = std::max(d, (full[i].second - r[i].second.detach()).abs().max().item<double>());
  }
  return d;
}

// With bf16 compute on the Transformer, the reference continues from FSDP's weights after every step: a
// weight that differs by a little can round to a different bf16 value, a flip of 2u relative that no
// first-order bound foresees, and momentum would carry it on. Each step is then checked on its own: the
// weights start equal, only the velocity carries the earlier steps' differences (resync in the bound).
static double compare_and_resync(const std::vector<std::pair<std::string, torch::Tensor>>& full, torch::nn::Module& ref,
                                 torch::ScalarType dtype) {
  const double d = max_diff(full, ref);
  if (dtype != torch::kFloat32) {
    torch::NoGradGuard no_grad;
    auto r = unique_named_parameters(ref, /*trainable_only=*/true);
    for (size_t i = 0; i < r.size(); ++i) r[i].second.copy_(full[i].second);
  }
  return d;
}

// [toy]
// How far a gradient entry of FSDP and of the reference can differ, relative to the largest gradient
// entry (tolerance.hpp's model). The weight gradient sums `terms` products (rows x tokens) in another
// grouping, then the W rank partials (the reduce-scatter is fp32): gamma_{terms + W} in fp32, for
// ATen accumulates bf16 products and sums in fp32 too and rounds the result once. The loss's scale
// 1/rows differs from 1/(rows W): every op between the loss and the weight (`depth`) may then round its
// output differently, forward and backward (2 roundings of the compute dtype per op), and below fp32
// each run also rounds its weight gradient once to the compute dtype (2 more).
static double relative_gradient_error(double terms, int W, int depth, torch::ScalarType dtype, double* roundings) {
  const double low = 2.0 * depth + (dtype == torch::kFloat32 ? 0 : 2);
  if (roundings) *roundings = low;
  return (terms + W) * unit_roundoff(torch::kFloat32) + low * unit_roundoff(dtype);
}

FsdpCheck check_toy_fsdp(ProcessGroup& pg, FsdpOptions opts, uint64_t seed) {
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
  FsdpCheck result;
  for (int step = 0; step < kSteps; ++step) {
    auto gen = data_generator(123 + 1000 * seed + step);  // reshuffled every step, identically on every rank
    auto tokens = torch::randint(0, 100, {rows * W, T}, gen).to(pg.device());
    auto labels = torch::randint(0, 100, {rows * W}, gen).to(pg.device());
    reference_step(*ref, *cmp, ref_opt, opts.compute_dtype,
                   [&](torch::nn::Module& m) { return last_token_loss(static_cast<ToyFSDPModelImpl&>(m).forward(tokens), labels); });
    G = std::max(G, max_abs_grad(ref->parameters()));
    opt.zero_grad();
    last_token_loss(shd->forward_units(tokens.narrow(0, r * rows, rows), fsdp.runner()), labels.narrow(0, r * rows, rows)).backward();
    fsdp.finish_gradient_synchronization();
    opt.step();
    result.max_abs_diff = std::max(result.max_abs_diff, max_diff(fsdp.gather_full_parameters(), *ref));
  }
  // The last token of rows * W rows is summed; the chain from a weight to the loss: embedding, 2 norms,
  // fc1, fc2, lm_head, the cross-entropy (7 ops). Plain SGD: the steps' differences add up.
  double n = 0;
  const double rel = relative_gradient_error(double(rows * W), W, 7, opts.compute_dtype, &n);
  const double w = max_abs(ref->parameters());
  result.tolerance = sgd_weight_bound(lr, 0.0, kSteps, rel * G, w);
  result.derivation = fmt::format("lr {} x {} steps x ({} sums x u(fp32) + {:.0f} roundings x u({})) x max|g| {:.3g}, "
                                  "plus {} ulps of max|w| {:.3g}", lr, kSteps, rows * W + W, n,
                                  dtype_name(opts.compute_dtype), G, kSteps, w);
  return result;
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
    std::vector<torch::Tensor> all(pg.world_size());
    for (auto& t : all) t = torch::empty_like(g);
    torch::Tensor mine = g.clone();
    pg.all_gather_async(all, mine).wait();
    for (const auto& other : all)
      if (!torch::equal(other, g)) throw CheckFailed(fmt::format("replicated gradient {} differs across ranks", i));
  }
}

FsdpCheck check_transformer_fsdp(ProcessGroup& pg, FsdpOptions opts, int accumulate, uint64_t seed) {
  TransformerConfig cfg;
  cfg.vocab_size = 64, cfg.context_length = 16, cfg.d_model = 32, cfg.d_ff = 64, cfg.num_layers = 2, cfg.num_heads = 2;
  const int W = pg.world_size(), r = pg.rank();
  const int64_t rows = 2, T = cfg.context_length;
  if (accumulate < 1 || rows % accumulate != 0)
    throw std::invalid_argument(fmt::format("check_transformer_fsdp: accumulate {} does not divide {} rows", accumulate, rows));
  const int64_t micro = rows / accumulate;
  TransformerLM ref{nullptr}, cmp{nullptr}, shd{nullptr};
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    torch::manual_seed(3 + seed);
    ref = TransformerLM(cfg), cmp = TransformerLM(cfg), shd = TransformerLM(cfg);
  }
  copy_parameters(*shd, *ref);
  ref->to(pg.device()), cmp->to(pg.device()), shd->to(pg.device());
  Fsdp fsdp(pg, shd.ptr(), shd->units(), opts);
  // SGD with momentum: a gradient's rounding reaches the weights scaled by lr, where AdamW's normalised
  // step can turn a 1e-9 difference in a near-zero gradient into a sizeable fraction of lr.
  const double lr = 0.05, momentum = 0.9;
  constexpr int kSteps = 3;
  const auto o = optim::SGDOptions(lr).momentum(momentum);
  optim::SGD ref_opt(ref->parameters(), o), opt(fsdp.parameters(), o);
  double G = 0;
  FsdpCheck result;
  for (int step = 0; step < kSteps; ++step) {
    auto gen = data_generator(99 + 1000 * seed + step);
    auto tokens = torch::randint(0, cfg.vocab_size, {rows * W, T + 1}, gen).to(pg.device());
    auto x = tokens.narrow(1, 0, T), y = tokens.narrow(1, 1, T);
    reference_step(*ref, *cmp, ref_opt, opts.compute_dtype, [&](torch::nn::Module& m) {
      return lm_loss(static_cast<TransformerLMImpl&>(m).forward(x).to(torch::kFloat32), y);
    });
    G = std::max(G, max_abs_grad(ref->parameters()));
    opt.zero_grad();
    for (int64_t k = 0; k < accumulate; ++k) {  // the mean of equal micro-batch means, each scaled by 1/K
      const int64_t first = r * rows + k * micro;
      auto logits = shd->forward_units(x.narrow(0, first, micro), fsdp.runner()).to(torch::kFloat32);
      (lm_loss(logits, y.narrow(0, first, micro)) / accumulate).backward();
      fsdp.finish_gradient_synchronization();
    }
    opt.step();
    result.max_abs_diff = std::max(result.max_abs_diff, compare_and_resync(fsdp.gather_full_parameters(), *ref, opts.compute_dtype));
  }
  // rows * W sequences of T tokens summed (micro-batches only regroup them); the chain from the first
  // layer's weights to the loss: embedding, per layer 10 ops (norm, q/k/v, scores, softmax, the
  // weighted sum, out-projection, norm, w1/w3, SiLU x gate, w2), final norm, lm_head, cross-entropy.
  const int depth = 1 + 10 * int(cfg.num_layers) + 3;
  double n = 0;
  const double rel = relative_gradient_error(double(rows * W * T), W, depth, opts.compute_dtype, &n);
  const bool resync = opts.compute_dtype != torch::kFloat32;  // see compare_and_resync
  const double w = max_abs(ref->parameters());
  result.tolerance = sgd_weight_bound(lr, momentum, kSteps, rel * G, w, resync);
  result.derivation = fmt::format("lr {} x {:.3g} (momentum {}, {} steps{}) x ({} sums x u(fp32) + {:.0f} roundings x "
                                  "u({})) x max|g| {:.3g}, plus ulps of max|w| {:.3g}", lr,
                                  sgd_weight_bound(1, momentum, kSteps, 1, 0, resync), momentum, kSteps,
                                  resync ? ", weights resynced" : "", rows * W * T + W, n,
                                  dtype_name(opts.compute_dtype), G, w);
  return result;
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

// Every rank must pass: the verdict is gathered, so all ranks print and exit alike.
static bool everyone(ProcessGroup& pg, bool ok) {
  auto votes = pg.all_gather(ok ? 1.0 : 0.0);
  return std::count(votes.begin(), votes.end(), 1.0) == pg.world_size();
}

std::string fsdp_mode_name(const FsdpOptions& f) {
  return fmt::format("{}, {}", dtype_name(f.compute_dtype), f.reshard_after_forward ? "reshard after forward"
                                                                                         : "keep until backward");
}

static bool report(ProcessGroup& pg, const FsdpCheck& c, const std::string& what) {
  const bool ok = everyone(pg, c.ok());
  auto diffs = pg.all_gather(c.max_abs_diff), bounds = pg.all_gather(c.tolerance);
  Margin worst{0, 1};
  for (size_t i = 0; i < diffs.size(); ++i)
    if (Margin m{diffs[i], bounds[i]}; m.ratio() >= worst.ratio()) worst = m;
  print0("{} {}: max |diff| {:.3g} <= {:.3g} (ratio {:.2f}; bound = {})", ok ? "PASS" : "FAIL", what, c.max_abs_diff,
         c.tolerance, worst.ratio(), c.derivation);
  return ok;
}

bool run_fsdp_checks(ProcessGroup& pg, const std::vector<bool>& reshard_modes, uint64_t seed) {
  // [checks]
  bool all_ok = true;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (bool reshard : reshard_modes) {
      FsdpOptions f;
      f.compute_dtype = dtype, f.reshard_after_forward = reshard;
      const FsdpCheck toy = check_toy_fsdp(pg, f, seed);
      const bool ok = report(pg, toy, fmt::format("FSDP == one process on ToyFSDPModel ({}; 3 SGD steps, {} ranks)",
                                                  fsdp_mode_name(f), pg.world_size()));
      check_fsdp_gradients(pg, f);  // throws CheckFailed
      print0("PASS FSDP gradients ({}): fp32, shard-shaped, replicated ones equal on every rank", fsdp_mode_name(f));
      const FsdpCheck tf = check_transformer_fsdp(pg, f, 1, seed);
      const bool ok2 = report(pg, tf, fmt::format("FSDP == one process on a 2-layer Transformer ({}; 3 SGD steps)", fsdp_mode_name(f)));
      const FsdpCheck acc = check_transformer_fsdp(pg, f, /*accumulate=*/2, seed);  // shard gradients add up
      const bool ok3 = report(pg, acc, fmt::format("FSDP, 2 micro-batches accumulated per step == one process ({})", fsdp_mode_name(f)));
      all_ok = all_ok && ok && ok2 && ok3;
    }
  // [checks]
  return all_ok;
}

}  // namespace dp
