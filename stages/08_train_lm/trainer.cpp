// The three synchronization schemes behind LmTrainer: each is its stage's training loop.
#include "stages/08_train_lm/trainer.hpp"

#include "common/optim_state.hpp"
#include "common/runtime.hpp"
#include "common/timing.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/06_sharded_opt/zero1_optimizer.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <fmt/format.h>

#include <optional>

namespace dp {

namespace optim = torch::optim;

static void set_lr(optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) static_cast<optim::AdamWOptions&>(g.options()).lr(lr);
}

optim::AdamWOptions lm_adamw(const TrainerOptions& o) {
  // The betas of most LM recipes (GPT-2, CS336): 0.95 forgets a noisy second moment faster.
  return optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(o.weight_decay);
}

// Forward and backward of one micro-batch of K, timing each phase; returns its mean loss. Scaling by
// 1/K makes K accumulated gradients of b rows each the gradient of the mean over all K * b rows.
template <typename Forward>
static double micro_step(const Batch& b, double K, StepTimes& t, Forward&& fwd) {
  Timer f;
  torch::Tensor loss = lm_loss(fwd(b.first), b.second);  // mean over the micro-batch's tokens
  t.forward += f.seconds();
  Timer bw;
  (loss / K).backward();
  t.backward += bw.seconds();
  return loss.item<double>();
}

// Every parameter and its AdamW moments, copied (zeros before the first step).
static FullState state_of(optim::Optimizer& opt, const std::vector<torch::Tensor>& params) {
  FullState s;
  for (const auto& p : params) {
    auto st = get_param_state(opt, p);
    s.params.push_back(p.detach().clone());
    s.exp_avg.push_back(st.present ? st.tensors.at("exp_avg").clone() : torch::zeros_like(p));
    s.exp_avg_sq.push_back(st.present ? st.tensors.at("exp_avg_sq").clone() : torch::zeros_like(p));
    s.adam_step = st.step;
  }
  return s;
}

// Validation loss of a model every rank holds whole (DDP, ZeRO-1): no gradients, no communication.
static double whole_model_loss(TransformerLM& model, const Batch& b) {
  torch::NoGradGuard no_grad;
  return lm_loss(model->forward(b.first), b.second).item<double>();
}

static ParamState adam_state(const FullState& s, const torch::Tensor& avg, const torch::Tensor& avg_sq) {
  ParamState st;
  st.present = s.adam_step > 0;
  st.step = s.adam_step;
  st.tensors = {{"exp_avg", avg.clone()}, {"exp_avg_sq", avg_sq.clone()}};
  return st;
}

// [ddp]
class DdpTrainer : public LmTrainer {
 public:
  DdpTrainer(ProcessGroup& pg, TransformerLM model, const TrainerOptions& o)
      : model_(model), ddp_(pg, model.ptr(), o.bucket_mb), opt_(model->parameters(), lm_adamw(o)), cap_(o.bucket_mb) {}

  double step(const std::vector<Batch>& micro, double lr, StepTimes& t) override {
    const double K = static_cast<double>(micro.size());
    auto fwd = [&](const torch::Tensor& x) { return model_->forward(x); };
    ddp_.on_train_batch_start();
    opt_.zero_grad();
    double loss = 0;
    {
      // Micro-batches 0..K-2 accumulate locally under no_sync(); the last one's backward launches the
      // buckets with the sum of all K gradients.
      std::optional<BucketedDdp::NoSyncGuard> local;
      if (micro.size() > 1) local.emplace(ddp_.no_sync());
      for (size_t k = 0; k + 1 < micro.size(); ++k) loss += micro_step(micro[k], K, t, fwd);
    }
    loss += micro_step(micro.back(), K, t, fwd);
    Timer s;
    ddp_.finish_gradient_synchronization();  // waits for the buckets still on the wire: exposed communication
    t.sync += s.seconds();
    Timer o;
    set_lr(opt_, lr);
    opt_.step();
    t.optimizer += o.seconds();
    return loss / K;
  }
  double eval_loss(const Batch& b) override { return whole_model_loss(model_, b); }
  FullState full_state() override { return state_of(opt_, model_->parameters()); }  // every rank holds it all
  void load_full_state(const FullState& s) override {
    torch::NoGradGuard no_grad;
    auto params = model_->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].copy_(s.params[i]);
      set_param_state(opt_, "adamw", params[i], adam_state(s, s.exp_avg[i], s.exp_avg_sq[i]));
    }
  }
  std::string describe() const override { return fmt::format("bucketed DDP (stage 05, {:g} MB buckets)", cap_); }

 private:
  TransformerLM model_;
  BucketedDdp ddp_;
  optim::AdamW opt_;
  double cap_;
};
// [ddp]

// [zero1]
class Zero1Trainer : public LmTrainer {
 public:
  Zero1Trainer(ProcessGroup& pg, TransformerLM model, const TrainerOptions& o) : pg_(pg), model_(model) {
    broadcast_parameters(pg, *model);  // ZeRO-1 has no DDP wrapper to do it
    zero_ = Zero1Optimizer::make<optim::AdamW>(pg, model->parameters(), lm_adamw(o));
  }
  double step(const std::vector<Batch>& micro, double lr, StepTimes& t) override {
    const double K = static_cast<double>(micro.size());
    auto fwd = [&](const torch::Tensor& x) { return model_->forward(x); };
    zero_->zero_grad();
    double loss = 0;
    for (const auto& b : micro) loss += micro_step(b, K, t, fwd);  // accumulates in the flat gradient buffer
    Timer o;
    set_lr(zero_->local(), lr);
    zero_->step();  // reduce-scatter the gradients, step this rank's chunk, all-gather the parameters
    t.optimizer += o.seconds();
    return loss / K;
  }
  double eval_loss(const Batch& b) override { return whole_model_loss(model_, b); }
  FullState full_state() override {
    // The moments of one flat chunk per rank: gather the chunks, cut the padding, split per parameter.
    FullState s = state_of(zero_->local(), {zero_->shard()});
    const auto& params = zero_->parameters();
    auto whole = [&](const torch::Tensor& chunk) { return torch::cat(pg_.all_gather(chunk.contiguous())); };
    auto avg = whole(s.exp_avg[0]), avg_sq = whole(s.exp_avg_sq[0]);
    s.params.clear(), s.exp_avg.clear(), s.exp_avg_sq.clear();
    int64_t off = 0;
    for (const auto& p : params) {
      s.params.push_back(p.detach().clone());
      s.exp_avg.push_back(avg.narrow(0, off, p.numel()).view(p.sizes()).clone());
      s.exp_avg_sq.push_back(avg_sq.narrow(0, off, p.numel()).view(p.sizes()).clone());
      off += p.numel();
    }
    return s;
  }
  void load_full_state(const FullState& s) override {
    torch::NoGradGuard no_grad;
    const auto& params = zero_->parameters();
    std::vector<torch::Tensor> avg, avg_sq;
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].copy_(s.params[i]);  // writes the flat buffer, and so this rank's shard too
      avg.push_back(s.exp_avg[i].reshape(-1)), avg_sq.push_back(s.exp_avg_sq[i].reshape(-1));
    }
    // This world's layout: pad to a multiple of N, keep this rank's chunk.
    const auto& L = zero_->layout();
    auto chunk = [&](std::vector<torch::Tensor>& v) {
      auto flat = torch::zeros({L.padded}, torch::kFloat32);
      flat.narrow(0, 0, L.numel).copy_(torch::cat(v));
      return flat.narrow(0, L.offset(pg_.rank()), L.chunk);
    };
    set_param_state(zero_->local(), "adamw", zero_->shard(), adam_state(s, chunk(avg), chunk(avg_sq)));
  }
  std::string describe() const override { return "true ZeRO-1 (stage 06: reduce-scatter, chunk step, all-gather)"; }

 private:
  ProcessGroup& pg_;
  TransformerLM model_;
  std::unique_ptr<Zero1Optimizer> zero_;
};
// [zero1]

// [fsdp]
class FsdpTrainer : public LmTrainer {
 public:
  FsdpTrainer(ProcessGroup& pg, TransformerLM model, const TrainerOptions& o)
      : model_(model), fsdp_(pg, model.ptr(), model->units(), {}), opt_(fsdp_.parameters(), lm_adamw(o)) {}
  double step(const std::vector<Batch>& micro, double lr, StepTimes& t) override {
    const double K = static_cast<double>(micro.size());
    auto fwd = [&](const torch::Tensor& x) { return model_->forward_units(x, fsdp_.runner()); };
    opt_.zero_grad();
    double loss = 0;
    for (const auto& b : micro) {  // no no_sync() here: each micro-batch gathers and reduce-scatters, and
      loss += micro_step(b, K, t, fwd);  // its shard gradients add up; nothing full-size outlives a round
      Timer s;
      fsdp_.finish_gradient_synchronization();
      t.sync += s.seconds();
    }
    loss /= K;
    Timer o;
    set_lr(opt_, lr);
    opt_.step();
    t.optimizer += o.seconds();
    return loss;
  }
  double eval_loss(const Batch& b) override {
    torch::NoGradGuard no_grad;
    return lm_loss(model_->forward_units(b.first, fsdp_.runner()), b.second).item<double>();
  }
  // Parameters and moments live in shards: gather them whole (and cut each unit's padding) to save,
  // cut them into this world's shards to load.
  FullState full_state() override {
    const auto pieces = fsdp_.parameters();
    std::vector<torch::Tensor> avg, avg_sq;
    int64_t step = 0;
    for (const auto& p : pieces) {
      const auto st = get_param_state(opt_, p);
      avg.push_back(st.present ? st.tensors.at("exp_avg") : torch::zeros_like(p));
      avg_sq.push_back(st.present ? st.tensors.at("exp_avg_sq") : torch::zeros_like(p));
      step = st.step;
    }
    FullState s;
    s.params = fsdp_.gather_full(pieces), s.exp_avg = fsdp_.gather_full(avg), s.exp_avg_sq = fsdp_.gather_full(avg_sq);
    s.adam_step = step;
    return s;
  }
  void load_full_state(const FullState& s) override {
    torch::NoGradGuard no_grad;
    auto pieces = fsdp_.parameters();
    const auto values = fsdp_.shard_full(s.params), avg = fsdp_.shard_full(s.exp_avg),
               avg_sq = fsdp_.shard_full(s.exp_avg_sq);
    for (size_t i = 0; i < pieces.size(); ++i) {
      pieces[i].copy_(values[i]);  // a shard (gathered again before each use) or a replicated gain
      set_param_state(opt_, "adamw", pieces[i], adam_state(s, avg[i], avg_sq[i]));
    }
  }
  std::string describe() const override { return "FSDP (stage 07: units gathered before use, gradients reduce-scattered)"; }

 private:
  TransformerLM model_;
  Fsdp fsdp_;
  optim::AdamW opt_;
};
// [fsdp]

std::vector<std::string> sync_names() { return {"ddp", "zero1", "fsdp"}; }

std::unique_ptr<LmTrainer> make_trainer(ProcessGroup& pg, TransformerLM model, const TrainerOptions& o) {
  if (o.sync == "ddp") return std::make_unique<DdpTrainer>(pg, model, o);
  if (o.sync == "zero1") return std::make_unique<Zero1Trainer>(pg, model, o);
  if (o.sync == "fsdp") return std::make_unique<FsdpTrainer>(pg, model, o);
  throw UsageError(fmt::format("--sync {}: unknown; choose ddp, zero1 or fsdp", o.sync));
}

}  // namespace dp
