#include "extensions/05c_optimizer_overlap/overlapped_optimizer.hpp"

#include "common/base/trace.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/memory.hpp"
#include "common/model/data.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "common/state/full_state.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <unordered_map>

namespace dp {

OverlappedOptimizer::OverlappedOptimizer(BucketedDdp& ddp, const MakeOptimizer& make)
    : ddp_(ddp), optimizers_(std::make_shared<Optimizers>()) {
  if (!make) throw std::logic_error("OverlappedOptimizer: empty optimizer factory");
  optimizers_->resize(ddp_.parameters().size());
  for (size_t i = 0; i < optimizers_->size(); ++i)
    if (ddp_.parameters()[i].requires_grad()) (*optimizers_)[i] = make({ddp_.parameters()[i]});
  // [overlap optimizer]
  // Bucket b's gradients are final: step its parameters now, while the buckets after it are still on the
  // wire (Gloo's threads move them; this thread computes). One step after the last bucket would add the
  // whole optimizer time to the step; here only the last bucket's share stays after the wire.
  BucketedDdp* ddp_ptr = &ddp_;
  ddp_.on_bucket_averaged([ddp_ptr, opts = optimizers_](size_t b) {
    trace::Span span(fmt::format("optimizer bucket {}", b));
    torch::NoGradGuard no_grad;
    for (size_t i : ddp_ptr->buckets()[b]) (*opts)[i]->step();
  });
  // [overlap optimizer]
}

OverlappedOptimizer::~OverlappedOptimizer() {
  try {
    ddp_.on_bucket_averaged(nullptr);
  } catch (const std::logic_error&) {
    // In the middle of a step (an exception is unwinding a training loop): the callback stays, and with
    // it the optimizers it shares; the BucketedDdp is on its way out too.
  }
}

void OverlappedOptimizer::zero_grad() {
  for (auto& opt : *optimizers_)
    if (opt) opt->zero_grad();
}

OverlappedOptimizerDdp::OverlappedOptimizerDdp(std::unique_ptr<BucketedDdp> ddp, const MakeOptimizer& make)
    : ddp_(std::move(ddp)) {
  if (!ddp_) throw std::invalid_argument("OverlappedOptimizerDdp: no BucketedDdp");
  overlapped_ = std::make_unique<OverlappedOptimizer>(*ddp_, make);
}

void OverlappedOptimizerDdp::zero_grad() {
  ddp_->on_train_batch_start();
  overlapped_->zero_grad();
}

TrainingBytes OverlappedOptimizerDdp::bytes() const {
  TrainingBytes b;
  for (const auto& p : unique_parameters(*ddp_->module)) {  // as count_training_bytes(): frozen ones too
    b.params += p.nbytes();
    if (p.grad().defined()) b.grads += p.grad().nbytes();
  }
  for (const auto& opt : overlapped_->optimizers())
    if (opt) b.state += optimizer_state_bytes(*opt);
  return b;
}

double OverlappedOptimizerDdp::sent_bytes_per_step() const {
  return ddp_bytes_per_step(count_elements(unique_parameters(*ddp_->module, true)), ddp_->world_size());
}

std::string OverlappedOptimizerDdp::describe() const {
  return fmt::format("DDP in {} buckets of at most {} MB, each bucket's parameters stepped as it arrives",
                     ddp_->bucket_count(), ddp_->bucket_cap_mb());
}

// The per-parameter optimizers of the model's trainable parameters, in unique_parameters() order.
std::vector<torch::optim::Optimizer*> OverlappedOptimizerDdp::optimizers() {
  std::unordered_map<const void*, torch::optim::Optimizer*> by_param;
  const auto& params = ddp_->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    if (overlapped_->optimizers()[i]) by_param[params[i].unsafeGetTensorImpl()] = overlapped_->optimizers()[i].get();
  std::vector<torch::optim::Optimizer*> out;
  for (const auto& p : unique_parameters(*ddp_->module, /*trainable_only=*/true))
    out.push_back(by_param.at(p.unsafeGetTensorImpl()));
  return out;
}

FullState OverlappedOptimizerDdp::full_state() {
  FullState s;
  s.params = whole_parameters(*ddp_->module, /*copy=*/true);
  const auto params = unique_parameters(*ddp_->module, /*trainable_only=*/true);
  const auto opts = optimizers();
  for (size_t i = 0; i < params.size(); ++i) s.optimizer.push_back(local_states(*opts[i], {params[i]}).at(0));
  return s;
}

void OverlappedOptimizerDdp::load_full_state(const FullState& s) {
  const auto params = load_parameters(*ddp_->module, s);
  const auto opts = optimizers();
  for (size_t i = 0; i < params.size(); ++i) set_local_states(*opts[i], {params[i]}, {s.optimizer[i]});
}

// Stepping AdamW bucket by bucket inside finish must give exactly (bitwise) what one AdamW step after
// finish gives, since AdamW updates each parameter from its own gradient and state only. A tiny
// Transformer, 3 steps.
void check_overlapped_optimizer(ProcessGroup& pg, const MakeBucketedDdp& make_ddp) {
  // [check overlap]
  const TransformerConfig c = TransformerConfig::toy();
  const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  torch::manual_seed(3);
  TransformerLM a(c), b(c);
  // NCCL sends CUDA tensors only; Gloo ranks may compute on a GPU too
  a->to(pg.device());
  b->to(pg.device());
  copy_parameters(*b, *a);
  auto after = make_ddp(pg, a.ptr()), inside = make_ddp(pg, b.ptr());
  torch::optim::AdamW opt(unique_parameters(*a), adamw);
  OverlappedOptimizer overlapped(
      *inside, [&](std::vector<torch::Tensor> p) { return std::make_unique<torch::optim::AdamW>(p, adamw); });
  for (int64_t step = 0; step < 3; ++step) {
    auto [gx, gy] = token_batch(2 * pg.world_size(), c.context_length, c.vocab_size, 99, step);
    auto x = shard_rows(gx, pg.rank(), pg.world_size()).to(pg.device());
    auto y = shard_rows(gy, pg.rank(), pg.world_size()).to(pg.device());
    opt.zero_grad();
    overlapped.zero_grad();
    lm_loss(a->forward(x), y).backward();
    lm_loss(b->forward(x), y).backward();
    after->finish_gradient_synchronization();
    inside->finish_gradient_synchronization();
    opt.step();  // `inside` has stepped already, bucket by bucket
  }
  const auto pa = unique_parameters(*a), pb = unique_parameters(*b);
  for (size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i]))
      throw CheckFailed("optimizer overlapped: parameters differ from one AdamW step after finish");
  // [check overlap]
  print0(
      "PASS optimizer overlapped with communication ({} buckets): bit-identical to one AdamW step after finish, "
      "3 steps",
      inside->bucket_count());
}

}  // namespace dp
