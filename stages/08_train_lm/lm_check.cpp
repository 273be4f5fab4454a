// The capstone's self-check against single-process training.
#include "stages/08_train_lm/lm_check.hpp"

#include "stages/08_train_lm/trainer.hpp"

#include <algorithm>

namespace dp {

static TransformerLM small_lm(int64_t context, uint64_t seed) {
  TransformerConfig cfg;
  cfg.name = "check", cfg.vocab_size = TextCorpus::kVocab, cfg.context_length = context;
  cfg.d_model = 64, cfg.d_ff = 128, cfg.num_layers = 2, cfg.num_heads = 2;
  torch::manual_seed(seed);
  return TransformerLM(cfg);
}

LmCheck check_against_one_process(ProcessGroup& pg, const RunOptions& o, const TextCorpus& corpus) {
  constexpr int kSteps = 2;
  const double lr = 1e-3;
  DistributedSampler sampler(window_count(corpus.train, o.context), o.batch, o.seed, pg.rank(), pg.world_size());
  auto model = small_lm(o.context, o.seed);
  auto trainer = make_trainer(pg, model, o.trainer);
  auto ref = small_lm(o.context, o.seed);
  torch::optim::AdamW ref_opt(ref->parameters(), lm_adamw(o.trainer).lr(lr));
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto ids = sampler.local_ids(step);
    StepTimes t;
    trainer->step(micro_batches(corpus, ids, o.accumulate, o.context), lr, t);
    // One process, the whole global batch, one mean.
    auto [x, y] = windows(corpus.train, sampler.global_ids(step), o.context);
    ref_opt.zero_grad();
    lm_loss(ref->forward(x), y).backward();
    ref_opt.step();
  }
  const FullState s = trainer->full_state();  // a collective (ZeRO-1 gathers)
  const auto ref_params = ref->parameters();
  LmCheck c;
  c.tolerance = 2e-6;
  for (size_t i = 0; i < ref_params.size(); ++i)
    c.max_abs_diff = std::max(c.max_abs_diff, (s.params[i] - ref_params[i]).abs().max().item<double>());
  const auto all = pg.all_gather(c.max_abs_diff);  // one verdict for all ranks
  c.max_abs_diff = *std::max_element(all.begin(), all.end());
  return c;
}

}  // namespace dp
