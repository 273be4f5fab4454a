// Stage 05's features beyond buckets, checked and measured by the program: the optimizer overlapped with
// communication (its bit-identity check) and gradient accumulation (its benchmark). Kept out of main.cpp so
// that main reads as a small diff of stage 04's.
#include "stages/05_bucketed/feature_bench.hpp"

#include "common/data.hpp"
#include "common/ddp_check.hpp"
#include "common/models.hpp"
#include "common/params.hpp"
#include "common/runtime.hpp"
#include "common/transformer.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/05_bucketed/comm_hooks.hpp"

#include <fmt/format.h>

namespace dp {

// --overlap-optimizer: stepping AdamW bucket by bucket inside finish must give exactly (bitwise) what one
// AdamW step after finish gives, since AdamW updates each parameter from its own gradient and state only.
// A tiny Transformer, arrival-order buckets of 1 kB (many buckets, rebuilt after step 1), 3 steps.
void check_overlapped_optimizer(ProcessGroup& pg) {
  // [check overlap]
  TransformerConfig c;
  c.vocab_size = 64, c.context_length = 8, c.d_model = 16, c.d_ff = 32, c.num_layers = 2, c.num_heads = 2;
  const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  torch::manual_seed(3);
  TransformerLM a(c), b(c);
  copy_parameters(*b, *a);
  BucketedDdp after(pg, a.ptr(), 0.001, BucketOrder::arrival), inside(pg, b.ptr(), 0.001, BucketOrder::arrival);
  torch::optim::AdamW opt(unique_parameters(*a), adamw);
  inside.overlap_optimizer([&](std::vector<torch::Tensor> p) { return std::make_unique<torch::optim::AdamW>(p, adamw); });
  for (int64_t step = 0; step < 3; ++step) {
    auto [gx, gy] = token_batch(2 * pg.world_size(), c.context_length, c.vocab_size, 99, step);
    auto x = shard_rows(gx, pg.rank(), pg.world_size()), y = shard_rows(gy, pg.rank(), pg.world_size());
    opt.zero_grad(), b->zero_grad();
    lm_loss(a->forward(x), y).backward(), lm_loss(b->forward(x), y).backward();
    after.finish_gradient_synchronization(), inside.finish_gradient_synchronization();
    opt.step();  // `inside` has stepped already, bucket by bucket
  }
  const auto pa = unique_parameters(*a), pb = unique_parameters(*b);
  for (size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i])) throw CheckFailed("optimizer overlapped: parameters differ from one AdamW step after finish");
  // [check overlap]
  print0("PASS optimizer overlapped with communication ({} buckets): bit-identical to one AdamW step after finish, "
         "3 steps", inside.bucket_count());
}

// Gradient accumulation on the Transformer: K micro-batches of --batch sequences (split over the ranks) per
// AdamW step, the first K-1 backward passes under no_sync(), against K = 1, interleaved step by step.
nlohmann::json bench_accumulation(ProcessGroup& pg, const BenchConfig& cfg, int K, double cap,
                                         const std::string& hook, BucketOrder order) {
  const auto mcfg = TransformerConfig::preset(cfg.preset, cfg.context);
  struct Run {
    int k = 1;
    TransformerLM model{nullptr};
    std::unique_ptr<BucketedDdp> ddp;
    std::unique_ptr<torch::optim::AdamW> opt;
    std::vector<double> step_s;
  };
  std::vector<Run> runs;
  for (int k : {1, K}) {
    Run r;
    r.k = k;
    torch::manual_seed(0);
    r.model = TransformerLM(mcfg);
    r.model->to(pg.device());
    r.ddp = std::make_unique<BucketedDdp>(pg, r.model.ptr(), cap, order);
    r.ddp->register_comm_hook(make_comm_hook(hook, pg), hook);
    r.opt = std::make_unique<torch::optim::AdamW>(unique_parameters(*r.model), torch::optim::AdamWOptions(1e-4));
    runs.push_back(std::move(r));
  }
  for (int i = 0; i < cfg.warmup + cfg.steps; ++i)
    for (auto& r : runs) {
      pg.barrier();
      Timer t(pg.device());
      // [accumulate]
      r.ddp->on_train_batch_start();
      r.opt->zero_grad();
      for (int k = 0; k < r.k; ++k) {
        auto [gx, gy] = token_batch(cfg.global_batch, cfg.context, mcfg.vocab_size, 1234, int64_t{i} * K + k);
        auto x = shard_rows(gx, pg.rank(), pg.world_size()).to(pg.device());
        auto y = shard_rows(gy, pg.rank(), pg.world_size()).to(pg.device());
        // Mean over this micro-batch's tokens, divided by K: the gradient of the mean over all K micro-batches.
        auto loss = lm_loss(r.model->forward(x), y) / r.k;
        if (k + 1 < r.k) {
          auto local_only = r.ddp->no_sync();
          loss.backward();
        } else {
          loss.backward();  // launches the buckets, holding the sum of all K backward passes
        }
      }
      r.ddp->finish_gradient_synchronization();
      r.opt->step();
      // [accumulate]
      if (i >= cfg.warmup) r.step_s.push_back(t.seconds());
    }
  nlohmann::json out = nlohmann::json::array();
  print0("\ngradient accumulation ({} MB buckets, {} hook), {} sequences per micro-batch:", cap, hook, cfg.global_batch);
  for (auto& r : runs) {
    const Stats s = summarize(max_over_ranks(pg, r.step_s));
    const double seqs = static_cast<double>(r.k * cfg.global_batch);
    print0("  K = {}: step {:.3f} s [{:.3f}-{:.3f}], {:.2f} ms per sequence, {} collectives per step = {:.3f} per sequence",
           r.k, s.median, s.min, s.max, 1e3 * s.median / seqs, r.ddp->calls_per_step(), r.ddp->calls_per_step() / seqs);
    out.push_back({{"accumulate", r.k}, {"step_s", s.median}, {"per_sequence_s", s.median / seqs},
                   {"collectives_per_step", r.ddp->calls_per_step()}, {"step_samples_s", max_over_ranks(pg, r.step_s)}});
  }
  return out;
}

}  // namespace dp
