// FSDP: shard each unit's weights, gather them just in time, reduce-scatter gradients as they are ready.
#include "stages/07_fsdp/fsdp.hpp"

#include "common/base/format.hpp"  // dtype_name
#include "common/base/storage.hpp"
#include "common/base/trace.hpp"
#include "common/contract/grad_sync.hpp"  // broadcast_parameters
#include "common/dist/runtime.hpp"
#include "common/model/params.hpp"

#include <fmt/format.h>
#include <torch/csrc/utils/tensor_flatten.h>  // flatten_dense_tensors

#include <stdexcept>

namespace dp {

bool is_sharded_module(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::LinearImpl*>(&m) || dynamic_cast<const torch::nn::EmbeddingImpl*>(&m);
}

torch::ScalarType compute_dtype_of(const torch::nn::Module& m, const FsdpOptions& opts) {
  return is_sharded_module(m) ? opts.compute_dtype : torch::kFloat32;
}

std::string fsdp_mode_name(const FsdpOptions& f) {
  return fmt::format("{}, {}", dtype_name(f.compute_dtype),
                     f.reshard_after_forward ? "reshard after forward" : "keep until backward");
}

Fsdp::Fsdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const ModuleUnits& units, FsdpOptions opts)
    : Fsdp(pg, model_tensors(model, "Fsdp"), tensor_units(model, units, is_sharded_module, "Fsdp"), opts) {
  model_ = std::move(model);
}

// [shard]
Fsdp::Fsdp(ProcessGroup& pg, const ModelTensors& model, std::vector<TensorUnit> units, FsdpOptions opts)
    : pg_(pg), opts_(opts) {
  if (units.empty()) throw std::invalid_argument("Fsdp: a model with at least one unit is needed");
  const auto dtype = opts_.compute_dtype;
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kHalf)
    throw UsageError("Fsdp: the compute dtype must be float32, bfloat16 or float16");
  broadcast_parameters(pg_, model);  // every rank starts from rank 0's weights
  for (const auto& [name, p] : model.parameters)
    if (p.requires_grad()) named_.emplace_back(name, p);
  for (auto& t : units) {
    Unit& u = units_.emplace_back();
    u.sharded = std::move(t.sharded);
    u.replicated = std::move(t.replicated);
  }

  // Per unit: one flat fp32 buffer of the sharded tensors, padded to a multiple of N; keep chunk `rank`.
  torch::NoGradGuard no_grad;
  const int W = pg_.world_size(), r = pg_.rank();
  for (auto& U : units_) {
    int64_t n = 0;
    for (const auto& p : U.sharded) {
      U.offsets.push_back(n);
      n += p.numel();
    }
    U.layout = FlatLayout::of(n, W);
    auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(pg_.device());
    U.shard = flat_chunk(U.sharded, U.layout, r, f32).set_requires_grad(true);
    U.grad_shard = torch::zeros({U.layout.chunk}, f32);
    // The gathered buffer, in the compute dtype. Each model parameter becomes a view of its storage
    // (set_data keeps the parameter's identity, autograd metadata and shape); freeing the storage
    // frees every one of them at once, and re-allocating it brings them back.
    U.full = torch::empty({U.layout.padded}, f32.dtype(opts_.compute_dtype));
    for (size_t i = 0; i < U.sharded.size(); ++i)
      U.sharded[i].set_data(U.full.narrow(0, U.offsets[i], U.sharded[i].numel()).view(U.sharded[i].sizes()));
    U.state = State::gathered;
    gathered_now_ += U.full.nbytes();
    free_full(&U - units_.data());
    sharded_numel_ += n;
    max_chunk_ = std::max(max_chunk_, U.layout.chunk);
    for (const auto& p : U.replicated) replicated_numel_ += p.numel();
  }
  gathered_peak_ = 0;
  // [shard]
  std::vector<torch::Tensor> hooked;
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t i = 0; i < units_[u].sharded.size(); ++i) {
      hooked.push_back(units_[u].sharded[i]);
      unit_of_hook_.push_back(u);
    }
  grad_seen_.assign(hooked.size(), 0);
  hooks_ = std::make_unique<AccumulateGradHooks>(
      hooked,
      [this](size_t h) {
        if (grad_seen_[h]) throw std::logic_error(std::string("Fsdp: ") + kBackwardTwiceMessage);
      },
      [this](size_t h) { on_gradient_ready(h); });
}

Fsdp::~Fsdp() {
  hooks_.reset();
  for (auto& U : units_) {  // collectives still writing into our buffers must end before they go
    if (U.gather.valid()) try {
        U.gather.wait();
      } catch (...) {
      }
    try {
      U.rs.wait();
    } catch (...) {
    }
  }
}

void Fsdp::free_full(size_t u) {
  Unit& U = units_[u];
  if (U.state == State::freed) return;
  wait_gathered(u);      // never free memory a collective is still writing into
  free_storage(U.full);  // every parameter view of it keeps its shape, and owns no memory
  gathered_now_ -= static_cast<int64_t>(U.full.nbytes());
  U.state = State::freed;
}

// [gather]
void Fsdp::launch_gather(size_t u) {
  Unit& U = units_[u];
  if (U.state != State::freed) return;  // gathered already, or on its way
  alloc_storage(U.full);                // the parameters' views have memory again; the gather fills it
  gathered_now_ += U.full.nbytes();
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
  torch::NoGradGuard no_grad;
  U.gather = gather_unit(u, U.shard.detach(), U.full);
  U.state = State::in_flight;
  ++gathers_;
}

Work Fsdp::gather_unit(size_t u, const torch::Tensor& shard, torch::Tensor& full) {
  torch::Tensor chunk = shard, flat = full;
  if (opts_.compute_dtype != torch::kFloat32) {
    // Cast the fp32 master chunk to the compute dtype, then gather raw bytes: Gloo has no bf16
    // collectives in LibTorch 1.13, and a gather does no arithmetic, so a byte view is exact.
    chunk = shard.to(opts_.compute_dtype).view(torch::kUInt8);
    flat = full.view(torch::kUInt8);
  }
  count_sent(ring_share() * static_cast<double>(full.nbytes()));
  // The handle keeps the cast copy alive until the gather has read it.
  return all_gather_flat_async(pg_, chunk, flat, fmt::format("gather unit {}", u)).then([chunk] {});
}

void Fsdp::wait_gathered(size_t u) {
  Unit& U = units_[u];
  if (U.state == State::freed) throw std::logic_error(fmt::format("Fsdp: unit {} is used before it was gathered", u));
  if (U.state != State::in_flight) return;
  if (U.gather.valid()) U.gather.wait();
  U.gather = Work();
  U.state = State::gathered;
}

torch::Tensor Fsdp::run_unit(size_t u, const std::function<torch::Tensor()>& body) {
  if (u >= units_.size()) throw std::invalid_argument(fmt::format("Fsdp: unit {} of {}", u, units_.size()));
  // [exercise 07.1: gather the unit (and prefetch the next) before its forward, free it after]
  torch::Tensor y;
  {
    trace::Span span("forward unit", {{"unit", u}});  // from when compute reached u: waiting counts
    launch_gather(u);
    // Prefetch: the next unit's gather runs while this one computes. (CS336: start gathering a layer once
    // the layer two before it has finished its forward; u + 1 is launched right after u - 1 finished.)
    if (u + 1 < units_.size()) launch_gather(u + 1);
    wait_gathered(u);
    y = body();
  }
  // Backward reaches this unit when y's gradient is complete: gather again then (if freed), first.
  if (y.requires_grad()) y.register_hook([this, u](const torch::Tensor&) { before_unit_backward(u); });
  const bool last = u + 1 == units_.size();
  if (!y.requires_grad() || (opts_.reshard_after_forward && !last)) free_full(u);
  return y;
  // [/exercise 07.1]
}

void Fsdp::before_unit_backward(size_t u) {
  launch_gather(u);
  if (u > 0) launch_gather(u - 1);  // prefetch: the unit whose backward comes next
  wait_gathered(u);
  if (trace::recording()) trace::instant("backward unit", {{"unit", u}});
}
// [gather]

// Whatever run_unit does, the unit's forward must find its weights whole: a rank holds only its shard.
void Fsdp::require_gathered(size_t u) const {
  if (units_[u].state == State::gathered) return;
  throw std::logic_error(fmt::format(
      "Fsdp: unit {}'s forward began while its weights were {}; hint [shard-not-gathered]: launch the unit's "
      "all-gather (launch_gather) and wait for it (wait_gathered) before its forward runs",
      u,
      units_[u].state == State::freed ? "not gathered (this rank holds only its shard)"
                                      : "still arriving (their all-gather launched, never waited on)"));
}

UnitRunner Fsdp::runner() {
  return [this](size_t u, const std::function<torch::Tensor()>& body) {
    return run_unit(u, [this, u, &body] {
      require_gathered(u);
      return body();
    });
  };
}

void Fsdp::on_gradient_ready(size_t h) {
  grad_seen_[h] = 1;
  const size_t u = unit_of_hook_[h];
  if (++units_[u].ready == units_[u].sharded.size() && reduce_this_backward()) launch_reduce_scatter(u);
}

// [reduce_scatter]
void Fsdp::launch_reduce_scatter(size_t u) {
  Unit& U = units_[u];
  // At most kReduceScattersInFlight units' full-size fp32 gradients in flight: complete the oldest first.
  // More would keep the link busier while backward waits less, and cost one unit's gradient each.
  while (scatter_order_.size() - scatters_done_ >= kReduceScattersInFlight)
    complete_reduce_scatter(scatter_order_[scatters_done_++]);
  torch::NoGradGuard no_grad;
  U.grad_flat = torch::zeros({U.layout.padded}, U.shard.options().requires_grad(false));
  for (size_t i = 0; i < U.sharded.size(); ++i) {
    auto& p = U.sharded[i];
    if (p.grad().defined()) U.grad_flat.narrow(0, U.offsets[i], p.numel()).copy_(p.grad().reshape(-1));  // to fp32
    p.mutable_grad() = torch::Tensor();  // the full-size gradient is not kept
  }
  free_full(u);  // the unit's backward is over: its weights are not needed until the next forward
  // Launch j writes into slot j % 2: the loop above has completed launch j - 2, the slot's last user.
  torch::Tensor& slot = scatter_out_[scatter_order_.size() % kReduceScattersInFlight];
  if (!slot.defined()) slot = torch::empty({max_chunk_}, U.shard.options().requires_grad(false));
  U.rs_out = slot.narrow(0, 0, U.layout.chunk);
  U.rs = reduce_scatter_unit(u, U.grad_flat, U.rs_out);
  U.scattered = true;
  scatter_order_.push_back(u);
  ++reduce_scatters_;
}

ReduceScatterWork Fsdp::reduce_scatter_unit(size_t u, torch::Tensor& flat, torch::Tensor& out) {
  count_sent(ring_share() * static_cast<double>(flat.nbytes()));
  return reduce_scatter_async(pg_, flat, out, ReduceScatterAlgo::automatic, fmt::format("reduce-scatter unit {}", u));
}

void Fsdp::complete_reduce_scatter(size_t u) {
  Unit& U = units_[u];
  if (!U.grad_flat.defined()) return;
  // [exercise 07.2: wait for the unit's reduce-scatter, average, add it to the shard's gradient]
  U.rs.wait();  // rs_out = sum over ranks of this rank's chunk
  U.grad_flat = torch::Tensor();
  torch::NoGradGuard no_grad;
  U.rs_out.div_(pg_.world_size());  // the mean, as DDP's
  torch::Tensor& g = U.shard.mutable_grad();
  if (g.defined())
    g.add_(U.rs_out);  // a later micro-batch, or zeroed by zero_grad(): 0 + x is x exactly
  else
    g = U.grad_shard.copy_(U.rs_out);
  U.rs_out = torch::Tensor();
  // [/exercise 07.2]
  after_shard_reduced(u);
}
// [reduce_scatter]

void Fsdp::finish_gradient_synchronization() {
  // A unit with a parameter that got no gradient this backward has not launched: do it now, in the
  // same order on every rank (reverse unit order, as backward would have).
  const bool reduce = reduce_this_backward();
  for (size_t u = units_.size(); u-- > 0;)
    if (reduce && !units_[u].scattered) launch_reduce_scatter(u);  // a unit no gradient reached: zeros
  // Replicated gradients (the norms): one flat all-reduce, then the mean.
  std::vector<torch::Tensor> rep;
  for (auto& U : units_)
    for (auto& p : U.replicated) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      rep.push_back(p.grad());
    }
  if (reduce && !rep.empty() && pg_.world_size() > 1) {
    auto flat = torch::utils::flatten_dense_tensors(rep);
    pg_.all_reduce(flat, "replicated");
    ++all_reduces_;
    sent_bytes_ += 2 * ring_share() * static_cast<double>(flat.nbytes());
    const auto mean = torch::utils::unflatten_dense_tensors(flat.div_(pg_.world_size()), rep);
    for (size_t i = 0; i < rep.size(); ++i) rep[i].copy_(mean[i]);
  }
  for (size_t u : scatter_order_) complete_reduce_scatter(u);
  for (size_t u = 0; u < units_.size(); ++u) {
    free_full(u);  // kept from forward but never reached by backward (reshard_after_forward false)
    units_[u].ready = 0;
    units_[u].scattered = false;
  }
  scatter_order_.clear();
  scatters_done_ = 0;
  std::fill(grad_seen_.begin(), grad_seen_.end(), 0);
}

ShardedParams Fsdp::sharding() const {
  ShardedParams s;
  for (const auto& U : units_) s.groups.push_back({U.layout, U.sharded, U.shard});
  for (const auto& U : units_) s.replicated.insert(s.replicated.end(), U.replicated.begin(), U.replicated.end());
  s.named = named_;
  return s;
}

std::string Fsdp::describe() const {
  return fmt::format("FSDP over {}, {} units ({} of {} parameters sharded), compute {}, reshard after forward {}",
                     count_of(pg_.world_size(), "rank"), units_.size(), with_commas(sharded_numel_),
                     with_commas(num_parameters()), dtype_name(opts_.compute_dtype), opts_.reshard_after_forward);
}

}  // namespace dp
