// FSDP on the Transformer against single-process training: the model extension 07a times.
#include "extensions/07a_fsdp_bench/transformer_check.hpp"

#include "common/base/format.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/tolerance.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "stages/07_fsdp/strategies.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace dp {

namespace optim = torch::optim;

namespace {

// With bf16 compute, the reference continues from FSDP's weights after every step: a weight that differs
// by a little can round to a different bf16 value, a flip of 2u relative that no first-order bound
// foresees, and momentum would carry it on. Each step is then checked on its own: the weights start
// equal, only the velocity carries the earlier steps' differences (resync in the bound).
double compare_and_resync(const std::vector<std::pair<std::string, torch::Tensor>>& full, torch::nn::Module& ref,
                          torch::ScalarType dtype) {
  const double d = max_full_diff(full, ref);
  if (dtype != torch::kFloat32) {
    torch::NoGradGuard no_grad;
    auto r = unique_named_parameters(ref, /*trainable_only=*/true);
    for (size_t i = 0; i < r.size(); ++i) r[i].second.copy_(full[i].second);
  }
  return d;
}

}  // namespace

Margin check_transformer_fsdp(ProcessGroup& pg, FsdpOptions opts, int accumulate, uint64_t seed) {
  const TransformerConfig cfg = TransformerConfig::toy(/*d_model=*/32, /*context_length=*/16);
  const int W = pg.world_size(), r = pg.rank();
  const int64_t rows = 2, T = cfg.context_length;
  if (accumulate < 1 || rows % accumulate != 0)
    throw std::invalid_argument(
        fmt::format("check_transformer_fsdp: accumulate {} does not divide {} rows", accumulate, rows));
  const int64_t micro = rows / accumulate;
  TransformerLM ref{nullptr}, cmp{nullptr}, shd{nullptr};
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    torch::manual_seed(3 + seed);
    ref = TransformerLM(cfg);
    cmp = TransformerLM(cfg);
    shd = TransformerLM(cfg);
  }
  copy_parameters(*shd, *ref);
  ref->to(pg.device());
  cmp->to(pg.device());
  shd->to(pg.device());
  Fsdp fsdp(pg, shd.ptr(), shd->units(), opts);
  // SGD with momentum: a gradient's rounding reaches the weights scaled by lr, where AdamW's normalised
  // step can turn a 1e-9 difference in a near-zero gradient into a sizeable fraction of lr.
  const double lr = 0.05, momentum = 0.9;
  constexpr int kSteps = 3;
  const auto o = optim::SGDOptions(lr).momentum(momentum);
  optim::SGD ref_opt(ref->parameters(), o), opt(fsdp.parameters(), o);
  double G = 0;
  Margin result;
  for (int step = 0; step < kSteps; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(99 + 1000 * seed + step);  // alike on every rank
    auto tokens = torch::randint(0, cfg.vocab_size, {rows * W, T + 1}, gen).to(pg.device());
    auto x = tokens.narrow(1, 0, T), y = tokens.narrow(1, 1, T);
    ref_opt.zero_grad();  // the reference computes as FSDP does (dp::reference_backward())
    reference_backward(
        *ref, *cmp, [&](const torch::nn::Module& m) { return compute_dtype_of(m, opts); },
        [&](torch::nn::Module& m) {
          return lm_loss(static_cast<TransformerLMImpl&>(m).forward(x).to(torch::kFloat32), y);
        });
    ref_opt.step();
    G = std::max(G, max_abs_grad(ref->parameters()));
    opt.zero_grad();
    for (int64_t k = 0; k < accumulate; ++k) {  // the mean of equal micro-batch means, each scaled by 1/K
      const int64_t first = r * rows + k * micro;
      auto logits = shd->forward_units(x.narrow(0, first, micro), fsdp.runner()).to(torch::kFloat32);
      (lm_loss(logits, y.narrow(0, first, micro)) / accumulate).backward();
      fsdp.finish_gradient_synchronization();
    }
    opt.step();
    result.diff = std::max(result.diff, compare_and_resync(fsdp.gather_full_parameters(), *ref, opts.compute_dtype));
  }
  // rows * W sequences of T tokens summed (micro-batches only regroup them); the chain from the first
  // layer's weights to the loss: embedding, per layer 10 ops (norm, q/k/v, scores, softmax, the
  // weighted sum, out-projection, norm, w1/w3, SiLU x gate, w2), final norm, lm_head, cross-entropy.
  const int depth = 1 + 10 * int(cfg.num_layers) + 3;
  double n = 0;
  const double rel = gradient_rounding_error(double(rows * W * T), W, depth, opts.compute_dtype, &n);
  const bool resync = opts.compute_dtype != torch::kFloat32;  // see compare_and_resync
  const double w = max_abs(ref->parameters());
  result.bound = sgd_weight_bound(lr, momentum, kSteps, rel * G, w, resync);
  result.derivation = fmt::format(
      "lr {} x {:.3g} (momentum {}, {} steps{}) x ({} sums x u(fp32) + {:.0f} roundings x "
      "u({})) x max|g| {:.3g}, plus ulps of max|w| {:.3g}",
      lr, sgd_weight_bound(1, momentum, kSteps, 1, 0, resync), momentum, kSteps, resync ? ", weights resynced" : "",
      rows * W * T + W, n, dtype_name(opts.compute_dtype), G, w);
  return worst_over_ranks(pg, result);
}

bool run_transformer_checks(ProcessGroup& pg, const std::vector<bool>& reshard_modes, uint64_t seed) {
  bool all_ok = true;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})  // the modes of stage 07's checks, in their order
    for (bool reshard : reshard_modes) {
      const FsdpOptions f{reshard, dtype};
      const bool ok = report_margin(
          check_transformer_fsdp(pg, f, 1, seed),
          fmt::format("FSDP == one process on a 2-layer Transformer ({}; 3 SGD steps)", fsdp_mode_name(f)));
      const bool ok2 = report_margin(check_transformer_fsdp(pg, f, /*accumulate=*/2, seed),  // shard gradients add up
                                     fmt::format("FSDP, 2 micro-batches accumulated per step == one process on the "
                                                 "Transformer ({})",
                                                 fsdp_mode_name(f)));
      all_ok = all_ok && ok && ok2;
    }
  return all_ok;
}

}  // namespace dp
