// BucketedZero1: stage 05's buckets, each a flat buffer cut into N chunks; reduce-scatters from gradient
// hooks; per bucket a chunk's step and an all-gather, first layers first.
#include "extensions/06a_zero1_buckets/bucketed_zero1.hpp"

#include "common/base/format.hpp"
#include "common/base/trace.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/memory.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/units.hpp"
#include "common/state/full_state.hpp"
#include "common/state/optim_state.hpp"
#include "stages/05_bucketed/buckets.hpp"             // assign_buckets
#include "stages/06_sharded_opt/zero1_optimizer.hpp"  // flattenable_parameters

#include <fmt/format.h>

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace dp {

// [buckets]
BucketedZero1::BucketedZero1(ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                             const MakeOptimizer& make_local, double bucket_cap_mb)
    : pg_(&pg), cap_mb_(bucket_cap_mb) {
  const auto distinct = flattenable_parameters(params, pg.device(), "BucketedZero1");  // Zero1Optimizer's rule
  // Stage 05's rule: last registered first, a new bucket once the cap would be passed.
  std::vector<int64_t> bytes;
  for (const auto& p : distinct) bytes.push_back(p.numel() * 4);
  const auto groups = assign_buckets(bytes, std::vector<bool>(distinct.size(), true), bucket_cap_mb);
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(pg.device());
  const int W = pg.world_size(), r = pg.rank();
  torch::NoGradGuard no_grad;
  for (const auto& group : groups) {
    Bucket b;
    int64_t total = 0;
    for (size_t j : group) {
      b.params.push_back(params_.size());
      bucket_of_.push_back(buckets_.size());
      offset_of_.push_back(static_cast<size_t>(total));
      params_.push_back(distinct[j]);
      total += distinct[j].numel();
    }
    b.layout = FlatLayout::of(total, W);  // padded to a multiple of N: every rank owns an equal chunk
    b.flat_params = torch::zeros({b.layout.padded}, fp32);
    b.flat_grads = torch::zeros({b.layout.padded}, fp32);
    b.scratch = torch::empty({b.layout.padded}, fp32);  // the all-to-all's receive (and gather's send) side
    buckets_.push_back(std::move(b));
  }
  for (size_t i = 0; i < params_.size(); ++i) {  // the model's tensors move into the buckets
    auto& p = params_[i];
    auto& b = buckets_[bucket_of_[i]];
    b.flat_params.narrow(0, offset_of_[i], p.numel()).view(p.sizes()).copy_(p);
    auto g = grad_view(i);
    if (p.grad().defined()) g.copy_(p.grad());
    p.set_data(b.flat_params.narrow(0, offset_of_[i], p.numel()).view(p.sizes()));
    p.mutable_grad() = g;  // backward accumulates into the bucket's gradient buffer
  }
  for (auto& b : buckets_) {  // each bucket's chunk is one optimizer's one parameter
    b.shard = b.flat_params.narrow(0, b.layout.offset(r), b.layout.chunk).detach().requires_grad_(true);
    b.shard.mutable_grad() = torch::zeros({b.layout.chunk}, fp32);
    b.local = make_local({b.shard});
    if (!b.local) throw UsageError("BucketedZero1: make_local returned no optimizer");
  }
  kind_ = buckets_.empty() ? "custom" : optimizer_kind(*buckets_.front().local);
  ready_.assign(params_.size(), 0);
  hooks_ = std::make_unique<AccumulateGradHooks>(
      params_, [this](size_t i) { before_accumulate(i); }, [this](size_t i) { after_accumulate(i); });
}
// [buckets]

BucketedZero1::~BucketedZero1() {
  hooks_.reset();
  // Nothing may still write into buffers about to be freed: drain what is in flight, errors included.
  for (auto& b : buckets_) {
    try {
      b.reduce.wait();
    } catch (const std::exception&) {
    }
    try {
      if (b.gather.valid()) b.gather.wait();
    } catch (const std::exception&) {
    }  // gathers_due_: none launched
  }
}

torch::Tensor BucketedZero1::grad_view(size_t i) const {
  const auto& p = params_[i];
  return buckets_[bucket_of_[i]].flat_grads.narrow(0, offset_of_[i], p.numel()).view(p.sizes());
}

void BucketedZero1::adopt_gradient(size_t i) {
  // Backward wrote into the buffer unless someone replaced or dropped the gradient (zero_grad with
  // set_to_none, for one): copy it in (a missing one is zero) and put the view back.
  auto& p = params_[i];
  auto view = grad_view(i);
  const auto& g = p.grad();
  if (g.defined() && g.data_ptr() == view.data_ptr()) return;
  torch::NoGradGuard no_grad;
  if (g.defined())
    view.copy_(g);
  else
    view.zero_();
  p.mutable_grad() = view;
}

// [hooks]
void BucketedZero1::before_accumulate(size_t i) {
  const Bucket& b = buckets_[bucket_of_[i]];
  if (gathers_due_ || b.gather.valid())  // the forward that made this gradient ran on stale weights
    throw std::logic_error(
        "BucketedZero1: backward reached a parameter whose all-gather from step(false) was "
        "never waited for; run forward through runner() or call wait_parameters() first");
  if (ready_[i])
    throw std::logic_error(
        "BucketedZero1: a second backward before step(): its reduce-scatter may be on the "
        "wire; accumulate micro-batches with Zero1Optimizer, or call step() after each backward");
}

void BucketedZero1::after_accumulate(size_t i) {
  adopt_gradient(i);   // .grad() now holds this backward's gradient (plus what accumulated), in the bucket
  if (!sync_) return;  // accumulating locally: nothing is ready to leave
  ready_[i] = 1;
  ++buckets_[bucket_of_[i]].ready;
  launch_complete_buckets(/*during_backward=*/true);
}

// Buckets leave strictly in index order, so that every rank issues the same collectives in the same order
// (stage 05 explains why); bucket 0, the last layers, is complete first.
void BucketedZero1::launch_complete_buckets(bool during_backward) {
  while (next_to_launch_ < buckets_.size()) {
    Bucket& b = buckets_[next_to_launch_];
    if (b.ready < b.params.size()) break;
    auto out = b.shard.mutable_grad();
    b.reduce = reduce_scatter_async(*pg_, b.flat_grads, out, ReduceScatterAlgo::automatic,
                                    fmt::format("grads {}", next_to_launch_), b.scratch);
    launched_in_backward_ += during_backward;
    ++next_to_launch_;
  }
}
// [hooks]

void BucketedZero1::finish_reduces() {
  for (size_t i = 0; i < params_.size(); ++i)  // unused this step: a zero (or replaced) gradient
    if (!ready_[i]) {
      adopt_gradient(i);
      ready_[i] = 1;
      ++buckets_[bucket_of_[i]].ready;
    }
  launch_complete_buckets(/*during_backward=*/false);
}

// [step]
void BucketedZero1::step(bool wait_for_parameters) {
  torch::NoGradGuard no_grad;
  finish_reduces();
  // Last bucket first: it holds the first layers, which the next forward needs first. Its reduce-scatter
  // left last, so this waits for all of them; from then on (step()) each chunk's step runs while the
  // all-gather launched before it is on the wire.
  for (size_t k = buckets_.size(); k-- > 0;) {
    Bucket& b = buckets_[k];
    b.reduce.wait();                                 // my chunk of this bucket's sum
    b.shard.mutable_grad().div_(pg_->world_size());  // the DDP average
    b.local->step();                                 // 1/N of this bucket's optimizer work
    if (wait_for_parameters) launch_gather(k);
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  for (auto& b : buckets_) b.ready = 0;
  next_to_launch_ = 0;
  gathers_due_ = !wait_for_parameters;  // step(false): the next forward launches them (runner())
  if (wait_for_parameters) wait_parameters();
}
// [step]

void BucketedZero1::launch_gather(size_t k) {
  Bucket& b = buckets_[k];
  b.gather = all_gather_flat_async(*pg_, b.shard, b.flat_params, fmt::format("params {}", k), AllGatherAlgo::automatic,
                                   b.scratch);
}

void BucketedZero1::launch_due_gathers() {
  if (!gathers_due_) return;
  gathers_due_ = false;
  for (size_t k = buckets_.size(); k-- > 0;) launch_gather(k);  // first layers first
}

void BucketedZero1::wait_for_gather(size_t k) {
  if (!buckets_[k].gather.valid()) return;
  Work w = std::move(buckets_[k].gather);
  buckets_[k].gather = Work{};
  w.wait();
}

void BucketedZero1::wait_parameters() {
  launch_due_gathers();
  for (size_t k = buckets_.size(); k-- > 0;) wait_for_gather(k);
}

// [runner]
UnitRunner BucketedZero1::runner(const ModuleUnits& units) {
  std::unordered_map<const void*, size_t> bucket_by_impl;
  for (size_t i = 0; i < params_.size(); ++i) bucket_by_impl[params_[i].unsafeGetTensorImpl()] = bucket_of_[i];
  std::vector<std::vector<size_t>> needs(units.size());  // per unit: the buckets holding its parameters
  for (size_t u = 0; u < units.size(); ++u) {
    std::unordered_set<size_t> in;
    for (const auto& m : units[u])
      for (const auto& p : m->parameters())
        if (auto it = bucket_by_impl.find(p.unsafeGetTensorImpl()); it != bucket_by_impl.end()) in.insert(it->second);
    needs[u].assign(in.begin(), in.end());
  }
  return [this, needs](size_t unit, const std::function<torch::Tensor()>& body) {
    launch_due_gathers();  // the first unit of a forward after step(false) starts every bucket's gather
    if (unit < needs.size())
      for (size_t k : needs[unit]) wait_for_gather(k);  // this unit's weights; later ones may still be arriving
    return body();
  };
}
// [runner]

void BucketedZero1::zero_grad() {
  for (auto& b : buckets_) b.reduce.wait();  // a backward without a step: drop its sums, keep ranks in step
  std::fill(ready_.begin(), ready_.end(), 0);
  for (auto& b : buckets_) {
    b.ready = 0;
    b.flat_grads.zero_();
  }
  next_to_launch_ = 0;
  launched_in_backward_ = 0;
  for (size_t i = 0; i < params_.size(); ++i) adopt_gradient(i);
}

int64_t BucketedZero1::state_bytes() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += optimizer_state_bytes(*b.local);
  return n;
}

TrainingBytes BucketedZero1::training_bytes(const torch::nn::Module& model) const {
  TrainingBytes b = count_training_bytes(model, *buckets_.at(0).local);  // parameters and gradients
  b.state = state_bytes();                                               // every bucket's optimizer
  return b;
}

int64_t BucketedZero1::buffer_bytes() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += tensor_bytes({b.shard.grad(), b.scratch});
  return n;
}

std::string BucketedZero1::describe() const {
  int64_t numel = 0, padded = 0;
  for (const auto& b : buckets_) {
    numel += b.layout.numel;
    padded += b.layout.padded;
  }
  return fmt::format(
      "bucketed ZeRO-1 {} over {}: {} tensors, {} elements in {} buckets of <= {:g} MB "
      "(padded to {}); gradients by {} from backward's hooks, parameters by {}",
      kind_, count_of(pg_->world_size(), "rank"), params_.size(), with_commas(numel), buckets_.size(), cap_mb_,
      with_commas(padded), reduce_scatter_name(*pg_), all_gather_name(*pg_));
}

namespace {

class BucketedZero1Strategy : public Strategy {
 public:
  BucketedZero1Strategy(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const MakeOptimizer& make,
                        double cap, bool overlap)
      : pg_(pg), model_(std::move(model)), overlap_(overlap) {
    UnitModel* units = as_unit_model(*model_);
    if (overlap_ && !units)
      throw std::invalid_argument("bucketed_zero1_strategy: overlapping the all-gathers needs a model with units");
    broadcast_parameters(pg, *model_);
    opt_ = std::make_unique<BucketedZero1>(pg, unique_parameters(*model_), make, cap);
    if (overlap_) runner_ = opt_->runner(units->units());
    // parameters() is bucket by bucket, each bucket's buffer holding layout(b).numel of them back to back.
    size_t i = 0;
    for (size_t b = 0; b < opt_->num_buckets(); ++b) {
      bucket_params_.emplace_back();
      for (int64_t left = opt_->layout(b).numel; left > 0; ++i) {
        bucket_params_.back().push_back(opt_->parameters().at(i));
        left -= opt_->parameters().at(i).numel();
      }
    }
  }
  void zero_grad() override { opt_->zero_grad(); }
  UnitRunner runner() override { return runner_; }
  void after_backward() override {}  // the reduce-scatters left from backward; step() finishes them
  void set_requires_gradient_sync(bool sync) override { opt_->set_requires_gradient_sync(sync); }
  void step() override { opt_->step(/*wait_for_parameters=*/!overlap_); }
  int64_t calls_per_step() const override {
    return pg_.world_size() > 1 ? 2 * static_cast<int64_t>(opt_->num_buckets()) : 0;
  }
  TrainingBytes bytes() const override { return opt_->training_bytes(*model_); }
  double buffer_bytes() const override { return static_cast<double>(opt_->buffer_bytes()); }
  double sent_bytes_per_step() const override {
    return zero1_bytes_per_step(count_elements(unique_parameters(*model_, true)), pg_.world_size());
  }
  std::string describe() const override {
    return first_line(opt_->describe()) + (overlap_ ? "; all-gathers behind the next forward" : "");
  }
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() override {
    if (overlap_) opt_->wait_parameters();  // the gathers step(false) left
    return whole_parameters(*model_);
  }
  // Zero1Strategy's, bucket by bucket: each bucket's flat buffer holds its parameters back to back.
  FullState full_state() override {
    FullState s;
    if (overlap_) opt_->wait_parameters();  // the gathers step(false) left
    s.params = whole_parameters(*model_, /*copy=*/true);
    std::vector<ParamState> held;
    for (size_t b = 0; b < opt_->num_buckets(); ++b) {
      const auto part = gather_chunk_state(pg_, opt_->local(b), chunk(b), opt_->layout(b), bucket_params_[b]);
      held.insert(held.end(), part.begin(), part.end());
    }
    s.optimizer = permute_states(opt_->parameters(), unique_parameters(*model_, true), held);
    return s;
  }
  void load_full_state(const FullState& s) override {
    if (overlap_) opt_->wait_parameters();  // or a gather still due would overwrite what is loaded
    const auto params = load_parameters(*model_, s);
    const auto held = permute_states(params, opt_->parameters(), s.optimizer);
    size_t first = 0;
    for (size_t b = 0; b < opt_->num_buckets(); ++b) {
      const size_t n = bucket_params_[b].size();
      set_chunk_state(opt_->local(b), chunk(b), opt_->layout(b), pg_.rank(),
                      std::vector<ParamState>(held.begin() + first, held.begin() + first + n));
      first += n;
    }
  }
  std::vector<torch::optim::Optimizer*> optimizers() override {
    std::vector<torch::optim::Optimizer*> out;
    for (size_t b = 0; b < opt_->num_buckets(); ++b) out.push_back(&opt_->local(b));
    return out;
  }

 private:
  // Bucket b's optimizer steps one tensor: this rank's chunk of the bucket.
  torch::Tensor chunk(size_t b) { return opt_->local(b).param_groups().at(0).params().at(0); }

  ProcessGroup& pg_;
  std::shared_ptr<torch::nn::Module> model_;
  bool overlap_;
  std::unique_ptr<BucketedZero1> opt_;
  UnitRunner runner_;
  std::vector<std::vector<torch::Tensor>> bucket_params_;  // per bucket, in its buffer's order
};

}  // namespace

MakeStrategy bucketed_zero1_strategy(double bucket_cap_mb, bool overlap_gathers) {
  return [bucket_cap_mb, overlap_gathers](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
                                          const MakeOptimizer& make) -> std::unique_ptr<Strategy> {
    return std::make_unique<BucketedZero1Strategy>(pg, std::move(model), make, bucket_cap_mb, overlap_gathers);
  };
}

}  // namespace dp
