// The capstone's self-check against single-process training.
#include "stages/08_train_lm/lm_check.hpp"

#include "common/measure/tolerance.hpp"
#include "common/model/params.hpp"
#include "stages/08_train_lm/trainer.hpp"

#include <fmt/format.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cmath>

namespace dp {

static TransformerLM small_lm(int64_t context, uint64_t seed, torch::Device device) {
  TransformerConfig cfg;
  cfg.name = "check";
  cfg.vocab_size = TextCorpus::kVocab;
  cfg.context_length = context;
  cfg.d_model = 64;
  cfg.d_ff = 128;
  cfg.num_layers = 2;
  cfg.num_heads = 2;
  torch::manual_seed(seed);
  TransformerLM lm(cfg);
  lm->to(device);  // before the trainer and the reference's AdamW take its parameters
  return lm;
}

LmCheck check_against_one_process(ProcessGroup& pg, const RunOptions& o, const TextCorpus& corpus) {
  constexpr int kSteps = 2;
  const double lr = 1e-3;
  DistributedSampler sampler(window_count(corpus.train, o.context), o.batch, o.seed, pg.rank(), pg.world_size());
  auto model = small_lm(o.context, o.seed, pg.device());
  auto trainer = std::make_unique<LmTrainer>(pg, model, o.trainer);
  auto ref = small_lm(o.context, o.seed, pg.device());
  const auto adamw = lm_adamw(o.trainer).lr(lr);
  torch::optim::AdamW ref_opt(ref->parameters(), adamw);
  // The roundings a gradient entry can differ by: batch x context tokens summed in another grouping
  // (micro-batches, ranks), the W rank partials, and 2 per op between a weight and the loss (embedding,
  // 10 per layer, final norm, lm_head, cross-entropy: they round differently when the loss's scale
  // 1/(rows) differs from 1/(rows W) by more than a power of two).
  const int depth = 1 + 10 * 2 + 3;
  const double roundings = double(o.batch * o.context) + pg.world_size() + 2.0 * depth;
  const double u = unit_roundoff(torch::kFloat32);
  AdamWeightBound bound(lr, std::get<1>(adamw.betas()), adamw.eps());
  const double clip = o.trainer.max_grad_norm, P = static_cast<double>(count_elements(ref->parameters()));
  double G = 0, norm_ratio = 0;  // norm_ratio: |norm - one process's| / its bound, worst step
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto ids = sampler.local_ids(step);
    StepTimes t;
    trainer->step(micro_batches(corpus, ids, o.accumulate, o.context, pg.device()), lr, t);
    // One process, the whole global batch, one mean.
    auto [x, y] = windows(corpus.train, sampler.global_ids(step), o.context, pg.device());
    ref_opt.zero_grad();
    lm_loss(ref->forward(x), y).backward();
    double g = max_abs_grad(ref->parameters()), rel = roundings * u;  // rel: of the gradient AdamW takes
    if (clip > 0) {
      // As common/harness/ddp_check.cpp's check_strategy: the norms differ by ||g - g_ref||_2 <= sqrt(P) x rel x G
      // plus the reference's fp32 sum of P squares; the scale max / norm, and every clipped entry, by that / norm.
      const double ref_norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), clip);
      const double norm_bound = std::sqrt(P) * rel * g + P * u * ref_norm;
      const double norm = trainer->last_grad_norm();  // NaN when the trainer did not clip: that fails
      norm_ratio = std::max(norm_ratio, std::isnan(norm) ? INFINITY : std::abs(norm - ref_norm) / norm_bound);
      rel += norm_bound / ref_norm;
      g *= std::min(1.0, clip / (ref_norm + 1e-6));
    }
    G = std::max(G, g);
    bound.add_step(ref->parameters(), rel * g);
    ref_opt.step();
  }
  std::vector<torch::Tensor> got;
  for (const auto& [name, p] : trainer->full_state().params) got.push_back(p);  // a collective (ZeRO-1 gathers)
  const auto ref_params = ref->parameters();
  LmCheck c;
  for (size_t i = 0; i < ref_params.size(); ++i)
    c.max_abs_diff = std::max(c.max_abs_diff, (got[i] - ref_params[i]).abs().max().item<double>());
  c.worst_ratio = std::max(bound.worst_ratio(got, ref_params), norm_ratio);
  const auto diffs = pg.all_gather(c.max_abs_diff), ratios = pg.all_gather(c.worst_ratio);  // one verdict for all
  c.max_abs_diff = *std::max_element(diffs.begin(), diffs.end());
  c.worst_ratio = *std::max_element(ratios.begin(), ratios.end());
  c.derivation = fmt::format(
      "per entry, AdamW (lr {}) applied to gradient differences of {:.0f} roundings x u(fp32) "
      "{:.2g} x max|g| {:.3g}{}",
      lr, roundings, u, G, clip > 0 ? "; clipped: plus the norm's bound (sqrt(P) x that + P x u x norm) / norm" : "");
  return c;
}

}  // namespace dp
