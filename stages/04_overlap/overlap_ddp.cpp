#include "stages/04_overlap/overlap_ddp.hpp"

#include "common/base/trace.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"

#include <algorithm>
#include <stdexcept>

namespace dp {

OverlapDdp::OverlapDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m)
    : OverlapDdp(pg, model_tensors(m, "OverlapDdp")) {
  module = std::move(m);
}

OverlapDdp::OverlapDdp(ProcessGroup& pg, const ModelTensors& model) : pg_(pg) {
  broadcast_parameters(pg_, model);  // every rank starts from rank 0's weights (frozen ones too)
  for (const auto& [name, p] : model.parameters) {
    if (!p.requires_grad()) continue;  // frozen: broadcast, never hooked
    names_.push_back(name);
    params_.push_back(p);
  }
  launched_.assign(params_.size(), 0);
  hooks_ = std::make_unique<AccumulateGradHooks>(
      params_, [this](size_t i) { check_not_ready(i); }, [this](size_t i) { on_gradient_ready(i); });
}

void OverlapDdp::on_train_batch_start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_step_) throw std::logic_error(std::string("OverlapDdp: ") + kStepUnfinishedMessage);
}

// Runs before AccumulateGrad adds the new gradient into .grad(). If this parameter's gradient was
// already ready this step, its all-reduce is launched and may still be reading and writing .grad() on
// Gloo's thread: adding into it now would corrupt both. Throwing here stops backward before it touches it.
// (LibTorch 1.13's engine stops the backward and rethrows this very std::logic_error from backward().)
void OverlapDdp::check_not_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (launched_[i])
    throw std::logic_error(std::string("OverlapDdp: ") + kBackwardTwiceMessage + "; parameter " + names_[i]);
}

void OverlapDdp::on_gradient_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!in_step_) {  // first gradient of a new backward
    in_step_ = true;
    log_.start_step();
  }
  if (trace::recording()) trace::instant("ready " + names_[i]);
  launch(i, /*during_backward=*/true);
}

// The order of launches matters: Gloo matches the k-th collective of one rank with the k-th of every
// other rank. It is the same on every rank because every rank runs the same graph, and autograd on CPU
// executes it in a deterministic order (a priority queue keyed by when each node was created), so the
// hooks fire in the same order everywhere.
void OverlapDdp::launch(size_t i, bool during_backward) {
  // [launch]
  // [exercise 04.1: launch this gradient's all-reduce without waiting, and keep its handle]
  torch::Tensor grad = params_[i].grad();  // shares storage with .grad(): reduced in place
  // The weakness left for stage 05: one collective per parameter tensor. Every collective has a fixed
  // cost however small the tensor (messages between the ranks, scheduling on Gloo's thread), and we pay
  // it N times per step; with hundreds of small tensors that overhead, not the bytes, dominates.
  // Stage 05 packs the gradients into a few buckets and launches one collective per bucket.
  Work work = pg_.all_reduce_async(grad, names_[i]);  // the name labels its span in a --trace timeline
  pending_.push_back({std::move(work), grad});        // finish_gradient_synchronization() waits on it
  // [/exercise 04.1]
  // [launch]
  launched_[i] = 1;
  log_.record(i, during_backward);
}

void OverlapDdp::finish_gradient_synchronization() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!in_step_) return;  // no backward since the last call: nothing to do
  // [finish]
  // A trainable parameter that took no part in this backward has had no hook call. The other ranks
  // expect an all-reduce for it too, so launch one now, in parameter order, with whatever .grad()
  // holds (zeros if undefined). This keeps every rank's sequence of collectives identical as long as
  // the *same* parameters are unused on every rank. (Parameters used on some ranks only would make the
  // sequences differ; PyTorch handles that with find_unused_parameters=True, we do not.)
  for (size_t i = 0; i < params_.size(); ++i) {
    if (launched_[i]) continue;
    if (!params_[i].grad().defined()) params_[i].mutable_grad() = torch::zeros_like(params_[i]);
    launch(i, /*during_backward=*/false);
  }
  // [exercise 04.2: wait for every launched all-reduce, then average]
  const int world = pg_.world_size();
  for (auto& p : pending_) {
    p.work.wait();       // Gloo: blocks until this sum arrived
    p.grad.div_(world);  // Gloo has no AVG: sum, then divide
  }
  // [/exercise 04.2]
  // [finish]
  pending_.clear();
  std::fill(launched_.begin(), launched_.end(), 0);
  in_step_ = false;
}

}  // namespace dp
