#include "stages/05_bucketed/bucketed_ddp.hpp"

#include "common/base/trace.hpp"
#include "common/model/params.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dp {

BucketedDdp::BucketedDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m, double bucket_cap_mb)
    : BucketedDdp(pg, model_tensors(m, "BucketedDdp"), bucket_cap_mb) {
  module = std::move(m);
}

BucketedDdp::BucketedDdp(ProcessGroup& pg, const ModelTensors& model, double bucket_cap_mb)
    : pg_(pg), cap_mb_(bucket_cap_mb), hook_(allreduce_hook()) {
  // Check the cap before the broadcast: a bad option fails fast and identically on every rank.
  std::vector<int64_t> bytes;
  std::vector<bool> trainable;
  std::vector<torch::Tensor> hooked_params;
  for (const auto& [name, p] : model.parameters) {
    if (p.requires_grad()) {
      hooked_.push_back(params_.size());
      hooked_params.push_back(p);
    }
    names_.push_back(name);
    params_.push_back(p);
    bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
    trainable.push_back(p.requires_grad());
  }
  assignment_ = assign_buckets(bytes, trainable, cap_mb_);
  broadcast_parameters(pg_, model);  // every rank starts from rank 0's weights (frozen ones too)
  build_buffers();
  ready_.assign(params_.size(), 0);
  hooks_ = std::make_unique<AccumulateGradHooks>(
      hooked_params, [this](size_t h) { check_not_ready(hooked_[h]); },
      [this](size_t h) { on_gradient_ready(hooked_[h]); });
}

void BucketedDdp::build_buffers() {
  buckets_.clear();
  // [buffers]
  slots_.assign(params_.size(), torch::Tensor());
  bucket_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < assignment_.size(); ++b) {
    Bucket bucket;
    bucket.params = assignment_[b];
    const auto& first = params_[bucket.params.front()];
    int64_t numel = 0;
    for (size_t i : bucket.params) numel += params_[i].numel();
    bucket.buffer = torch::zeros({numel}, first.options().requires_grad(false));
    int64_t offset = 0;  // in elements: the bucket's gradients lie back to back, in bucket order
    for (size_t i : bucket.params) {
      if (params_[i].scalar_type() != first.scalar_type() || params_[i].device() != first.device())
        throw std::invalid_argument(fmt::format("BucketedDdp: bucket {} mixes dtypes or devices ({} and {})", b,
                                                names_[bucket.params.front()], names_[i]));
      slots_[i] = bucket.buffer.narrow(0, offset, params_[i].numel()).view(params_[i].sizes());
      bucket_of_[i] = b;
      offset += params_[i].numel();
    }
    buckets_.push_back(std::move(bucket));
  }
  // [buffers]
}

void BucketedDdp::on_train_batch_start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_step_) throw std::logic_error(std::string("BucketedDdp: ") + kStepUnfinishedMessage);
}

// Before AccumulateGrad adds into .grad(). A parameter already copied into its bucket this step means
// a second backward: its bucket may be on the wire, and the sums would mix two backward passes. (With
// sync off nothing is ever marked ready: turning it off is refused while a step is unfinished.)
void BucketedDdp::check_not_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ready_[i])
    throw std::logic_error(std::string("BucketedDdp: ") + kBackwardTwiceMessage + "; parameter " + names_[i]);
}

// Copy, not view. PyTorch's gradient_as_bucket_view=True makes .grad() a view into the bucket, saving this
// copy and one gradient's worth of memory, but only while nothing replaces the .grad() tensor: AccumulateGrad
// installs a new one whenever .grad() is undefined (after zero_grad() in torch 2.x, which sets gradients to
// undefined by default), and the view is silently lost. A copy is correct whatever the loop does with .grad(),
// for one memcpy per gradient.
void BucketedDdp::copy_into_slot(size_t i) {
  gradient_copied(i);
  const auto grad = params_[i].grad();
  grad.defined() ? slots_[i].copy_(grad) : slots_[i].zero_();  // undefined only from finish: counts as zero
  ready_[i] = 1;
  ++buckets_[bucket_of_[i]].ready;
}

void BucketedDdp::on_gradient_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sync_off_) {  // accumulate: AccumulateGrad has already added into .grad(); nothing to send
    accumulated_locally_ = true;
    return;
  }
  if (!in_step_) {  // first gradient of a new backward
    in_step_ = true;
    log_.start_step();
  }
  // [ready]
  copy_into_slot(i);  // and count it: its bucket has one gradient fewer to wait for
  launch_complete_buckets_in_order(/*during_backward=*/true);
  // [ready]
}

// Launch bucket 0, 1, 2, ... strictly in index order: a complete bucket waits while an earlier one is still
// incomplete. Gloo matches collectives by their position in each rank's sequence, so every rank must issue the
// same all-reduces in the same order. Readiness order need not follow bucket order (a parameter registered late
// but used early in forward; a tied weight, ready only once its use nearest the input is differentiated) and is
// only as deterministic as the autograd engine; bucket order depends on nothing but the model. Launched in
// different orders, Gloo would add bucket 1 of one rank to bucket 2 of another: wrong sums, an error or a hang.
int64_t BucketedDdp::buffer_bytes() const {
  int64_t bytes = 0;
  for (const Bucket& b : buckets_) bytes += b.buffer.nbytes();
  return bytes;
}

void BucketedDdp::launch_complete_buckets_in_order(bool during_backward) {
  // [launch]
  // [exercise 05.2: launch every complete bucket, strictly in bucket order]
  while (next_to_launch_ < buckets_.size()) {
    const Bucket& b = buckets_[next_to_launch_];
    if (b.ready < b.params.size()) break;  // not complete: later buckets wait for it
    launch_bucket(next_to_launch_++, during_backward);
  }
  // [/exercise 05.2]
  // [launch]
}

void BucketedDdp::launch_bucket(size_t bi, bool during_backward) {
  Bucket& b = buckets_[bi];
  if (trace::recording()) trace::instant(fmt::format("bucket {} ready", bi));
  b.work = hook_(pg_, b.buffer, fmt::format("bucket {}", bi));  // one collective, all its gradients
  log_.record(bi, during_backward);
}

bool BucketedDdp::synchronize() {
  std::lock_guard<std::mutex> lock(mu_);
  if (sync_off_) return false;  // accumulating locally: the next backward with sync on synchronizes
  if (!in_step_ && !accumulated_locally_) return false;  // no backward since the last call: nothing to do
  if (!in_step_) {                                       // accumulated under no_sync(), no backward since: send here
    in_step_ = true;
    log_.start_step();
  }
  // [finish]
  // Parameters whose hook did not run (unused in this forward) still owe their slot: fill it with their
  // current .grad() (zeros if none) so that every bucket completes and every rank launches the same
  // collectives. As in stage 04 this is only consistent if the same parameters are unused on all ranks.
  for (size_t i : hooked_)
    if (!ready_[i]) copy_into_slot(i);  // unused: ready last
  launch_complete_buckets_in_order(/*during_backward=*/false);

  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    b.work.wait();  // then the hook's last part: the bucket holds the average (allreduce_hook: sum / world)
    for (size_t i : b.params) {
      if (params_[i].grad().defined())
        params_[i].mutable_grad().copy_(slots_[i]);
      else
        params_[i].mutable_grad() = slots_[i].clone();
    }
    if (bucket_averaged_) bucket_averaged_(bi);  // e.g. step this bucket's parameters (extension 05c)
  }
  // [finish]
  // Reset here, not in on_train_batch_start(): a loop that never calls it still works.
  for (auto& b : buckets_) {
    b.ready = 0;
    b.work = BucketWork();
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  next_to_launch_ = 0;
  in_step_ = false;
  accumulated_locally_ = false;
  return true;
}

// [no_sync]
void BucketedDdp::set_requires_gradient_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  // Buckets of an unfinished step may be on the wire, and finish would overwrite .grad() with their
  // average, dropping whatever was accumulated meanwhile.
  if (!sync && !sync_off_ && in_step_)
    throw std::logic_error(
        "BucketedDdp: no_sync() while a synchronization is unfinished: call "
        "finish_gradient_synchronization() after the backward outside the guard first");
  sync_off_ = !sync;
}
// [no_sync]

// The seams change what a step does, so only between steps: the lock, once no step is in flight.
std::unique_lock<std::mutex> BucketedDdp::lock_between_steps(const char* what) {
  std::unique_lock<std::mutex> lock(mu_);
  if (in_step_)
    throw std::logic_error(
        fmt::format("BucketedDdp::{}: buckets are in flight; call it between steps (after "
                    "finish_gradient_synchronization())",
                    what));
  return lock;
}

void BucketedDdp::register_comm_hook(CommHook hook) {
  if (!hook) throw std::logic_error("BucketedDdp::register_comm_hook: empty hook");
  auto lock = lock_between_steps("register_comm_hook");
  hook_ = std::move(hook);
}

void BucketedDdp::on_bucket_averaged(std::function<void(size_t)> f) {
  auto lock = lock_between_steps("on_bucket_averaged");
  bucket_averaged_ = std::move(f);
}

void BucketedDdp::reassign(std::vector<std::vector<size_t>> assignment) {
  auto lock = lock_between_steps("reassign");
  std::vector<size_t> listed;  // sorted, it must be hooked_: every trainable parameter, once
  for (const auto& bucket : assignment) {
    if (bucket.empty()) throw std::logic_error("BucketedDdp::reassign: an empty bucket");
    listed.insert(listed.end(), bucket.begin(), bucket.end());
  }
  std::sort(listed.begin(), listed.end());
  if (listed != hooked_)
    throw std::logic_error(
        "BucketedDdp::reassign: the buckets must list every trainable parameter (by its index "
        "into parameters()) exactly once, and no frozen one");
  assignment_ = std::move(assignment);
  build_buffers();
}

std::string BucketedDdp::describe_buckets() const {
  std::string out;
  for (size_t b = 0; b < assignment_.size(); ++b) {
    out += fmt::format("{}bucket {}: {} B =", b > 0 ? "\n" : "", b, buckets_[b].buffer.nbytes());
    for (size_t i : assignment_[b]) out += " " + names_[i];
  }
  return out;
}

MakeStrategy bucketed_ddp_strategy(double bucket_cap_mb) {
  auto make = [bucket_cap_mb](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model) -> std::unique_ptr<GradSync> {
    return std::make_unique<BucketedDdp>(pg, std::move(model), bucket_cap_mb);  // broadcasts rank 0's weights
  };
  return ddp_strategy(make, "bucketed DDP");
}

}  // namespace dp
