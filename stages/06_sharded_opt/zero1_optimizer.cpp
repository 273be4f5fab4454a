// Zero1Optimizer: flat buffers, the model's tensors re-pointed into them, reduce-scatter, a chunk's step,
// all-gather.
#include "stages/06_sharded_opt/zero1_optimizer.hpp"

#include "common/base/format.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/memory.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "common/state/optim_state.hpp"

#include <fmt/format.h>

#include <unordered_set>

namespace dp {

// [flatten]
Zero1Optimizer::Zero1Optimizer(ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                               const MakeOptimizer& make_local, ReduceScatterHow how)
    : pg_(&pg), algo_(std::move(how)) {
  int64_t total = 0;
  for (const auto& p : flattenable_parameters(params, pg.device(), "Zero1Optimizer")) {
    offsets_.push_back(total);
    params_.push_back(p);
    total += p.numel();
  }
  layout_ = FlatLayout::of(total, pg.world_size());
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(pg.device());
  flat_params_ = torch::zeros({layout_.padded}, fp32);
  flat_grads_ = torch::zeros({layout_.padded}, fp32);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    auto region = [&](const torch::Tensor& flat) { return flat.narrow(0, offsets_[i], p.numel()).view(p.sizes()); };
    region(flat_params_).copy_(p);
    if (p.grad().defined()) region(flat_grads_).copy_(p.grad());
    p.set_data(region(flat_params_));        // the model's tensor now lives in the flat buffer
    p.mutable_grad() = region(flat_grads_);  // and backward accumulates into the gradient buffer
  }
  // The local optimizer's one parameter: a leaf aliasing this rank's chunk, so its in-place update
  // writes the flat buffer (and through it the model's own tensors in that chunk).
  shard_ = flat_params_.narrow(0, layout_.offset(pg.rank()), layout_.chunk).detach().requires_grad_(true);
  shard_.mutable_grad() = torch::zeros({layout_.chunk}, fp32);
  // The all-to-all's buffer (reduce-scatter's receive side, all-gather's send side), where they run.
  if (!algo_.custom &&
      (!pg.has_native_reduce_scatter() || algo_.algo == ReduceScatterAlgo::all_to_all || pg.backend() == "gloo"))
    scratch_ = torch::empty({layout_.padded}, fp32);
  local_ = make_local({shard_});
  if (!local_) throw UsageError("Zero1Optimizer: make_local returned no optimizer");
  kind_ = optimizer_kind(*local_);
}
// [flatten]

void Zero1Optimizer::gather_gradients() {
  // Backward wrote into the buffer unless someone replaced or dropped a gradient (model.zero_grad() with
  // set_to_none, for one): copy such gradients in (a missing one is zero) and put the view back.
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    auto view = flat_grads_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
    const auto& g = p.grad();
    if (g.defined() && g.data_ptr() == view.data_ptr()) continue;
    if (g.defined())
      view.copy_(g);
    else
      view.zero_();
    p.mutable_grad() = view;
  }
}

// [step]
void Zero1Optimizer::step() {
  torch::NoGradGuard no_grad;
  // [exercise 06.1: reduce-scatter the gradients, step this rank's chunk, all-gather the parameters]
  gather_gradients();
  auto grad = shard_.mutable_grad();
  reduce_scatter(*pg_, flat_grads_, grad, algo_, "gradients", scratch_);  // my chunk of the sum
  grad.div_(pg_->world_size());                                           // the DDP average
  if (before_local_step_) before_local_step_();                           // (stage 10: clipping)
  local_->step();                                                         // 1/N of the optimizer's work
  all_gather_flat(*pg_, shard_, flat_params_, "parameters", AllGatherAlgo::automatic, scratch_);  // into the model
  // [/exercise 06.1]
}
// [step]

void Zero1Optimizer::zero_grad() {
  flat_grads_.zero_();
  gather_gradients();  // re-installs a view where a gradient was replaced
}

int64_t Zero1Optimizer::buffer_bytes() const { return tensor_bytes({shard_.grad(), scratch_}); }

std::string Zero1Optimizer::describe() const {
  return fmt::format(
      "ZeRO-1 {} over {}: {} tensors, {} elements in one flat buffer padded to {} ({} per "
      "rank); gradients by {}, parameters by {}",
      kind_, count_of(pg_->world_size(), "rank"), params_.size(), with_commas(layout_.numel),
      with_commas(layout_.padded), with_commas(layout_.chunk), reduce_scatter_name(*pg_, algo_), all_gather_name(*pg_));
}

std::vector<torch::Tensor> flattenable_parameters(const std::vector<torch::Tensor>& params, const torch::Device& device,
                                                  const std::string& who) {
  std::unordered_set<const void*> seen;
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    if (!p.defined() || !p.requires_grad()) continue;            // frozen: never changes, not sharded
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;  // tied weight listed twice
    if (!p.is_leaf() || p.scalar_type() != torch::kFloat32 || p.device() != device)
      throw UsageError(fmt::format("{}: a parameter of shape {} is not a float32 leaf on {}", who,
                                   shape_text(p.sizes()), device.str()));
    out.push_back(p);
  }
  return out;
}

}  // namespace dp
