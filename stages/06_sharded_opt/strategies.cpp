#include "stages/06_sharded_opt/strategies.hpp"

#include "common/format.hpp"
#include "common/full_state.hpp"
#include "common/memory.hpp"
#include "common/params.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/06_sharded_opt/bucketed_zero1.hpp"
#include "stages/06_sharded_opt/sharded_optimizer.hpp"
#include "stages/06_sharded_opt/zero1_optimizer.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dp {

namespace optim = torch::optim;

// The designs build their local optimizers from parameter groups (owned tensors, or one flat chunk); a
// Strategy is given a factory over a tensor list. The factory's optimizer, emptied, takes the groups: its
// defaults are the options of every group that brings none.
static MakeLocalOptimizer local_factory(const MakeOptimizer& make) {
  return [make](std::vector<optim::OptimizerParamGroup> groups) {
    auto opt = make({});
    if (!opt) throw std::invalid_argument("a Strategy's MakeOptimizer returned no optimizer");
    opt->param_groups().clear();
    for (const auto& g : groups) opt->add_param_group(g);
    return opt;
  };
}

static int64_t trainable_elements(const torch::nn::Module& m) { return count_elements(unique_parameters(m, true)); }

namespace {

class Cs336Strategy : public Strategy {
 public:
  Cs336Strategy(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const MakeOptimizer& make, double cap)
      : pg_(pg), model_(model), ddp_(std::make_unique<BucketedDdp>(pg, model, cap)),  // broadcasts rank 0's weights
        opt_(pg, {optim::OptimizerParamGroup(unique_parameters(*model))}, local_factory(make)) {}
  void zero_grad() override { ddp_->on_train_batch_start(), opt_.zero_grad(); }
  void after_backward() override { ddp_->finish_gradient_synchronization(); }
  void step() override { opt_.step(); }
  int64_t calls_per_step() const override {  // DDP's buckets, then one broadcast per trainable tensor
    return ddp_->calls_per_step() + (pg_.world_size() > 1 ? static_cast<int64_t>(unique_parameters(*model_, true).size()) : 0);
  }
  TrainingBytes bytes() const override { return count_training_bytes(*model_, opt_.local()); }
  double sent_bytes_per_step() const override { return cs336_bytes_per_step(trainable_elements(*model_), pg_.world_size()); }
  std::string describe() const override {
    return fmt::format("CS336's design: DDP in {} buckets, then {}", ddp_->bucket_count(), first_line(opt_.describe()));
  }
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() override { return whole_parameters(*model_); }
  void set_requires_gradient_sync(bool sync) override { ddp_->set_requires_gradient_sync(sync); }
  // Each parameter's state lives on its owner: the owner broadcasts it.
  FullState full_state() override {
    FullState s;
    s.params = whole_parameters(*model_, /*copy=*/true);
    for (const auto& p : unique_parameters(*model_, /*trainable_only=*/true)) {
      const int owner = opt_.owner_of(p);
      s.optimizer.push_back(broadcast_param_state(pg_, owner, owner == pg_.rank() ? get_param_state(opt_.local(), p) : ParamState{}, p));
    }
    return s;
  }
  void load_full_state(const FullState& s) override {
    const auto params = load_parameters(*model_, s);
    for (size_t i = 0; i < params.size(); ++i)
      if (opt_.owns(params[i])) set_local_states(opt_.local(), {params[i]}, {s.optimizer[i]});
  }
  std::vector<optim::Optimizer*> optimizers() override { return {&opt_.local()}; }

 private:
  ProcessGroup& pg_;
  std::shared_ptr<torch::nn::Module> model_;
  std::unique_ptr<BucketedDdp> ddp_;
  ShardedOptimizer opt_;
};

class Zero1Strategy : public Strategy {
 public:
  Zero1Strategy(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const MakeOptimizer& make)
      : pg_(pg), model_(std::move(model)) {
    broadcast_parameters(pg, *model_);
    opt_ = std::make_unique<Zero1Optimizer>(pg, unique_parameters(*model_), local_factory(make));
  }
  void zero_grad() override { opt_->zero_grad(); }
  void after_backward() override {}  // the gradients' reduce-scatter is part of step()
  void step() override { opt_->step(); }
  int64_t calls_per_step() const override { return pg_.world_size() > 1 ? 2 : 0; }  // reduce-scatter, all-gather
  TrainingBytes bytes() const override { return count_training_bytes(*model_, opt_->local()); }
  double sent_bytes_per_step() const override { return zero1_bytes_per_step(trainable_elements(*model_), pg_.world_size()); }
  std::string describe() const override { return first_line(opt_->describe()); }
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() override { return whole_parameters(*model_); }
  // The state of one flat chunk per rank: gathered and cut per parameter; on load, this world's chunk.
  FullState full_state() override {
    FullState s;
    s.params = whole_parameters(*model_, /*copy=*/true);
    const auto held = gather_chunk_state(pg_, opt_->local(), opt_->shard(), opt_->layout(), opt_->parameters());
    s.optimizer = permute_states(opt_->parameters(), unique_parameters(*model_, true), held);
    return s;
  }
  void load_full_state(const FullState& s) override {
    const auto params = load_parameters(*model_, s);  // writes the flat buffer, so this rank's chunk too
    set_chunk_state(opt_->local(), opt_->shard(), opt_->layout(), pg_.rank(),
                    permute_states(params, opt_->parameters(), s.optimizer));
  }
  std::vector<optim::Optimizer*> optimizers() override { return {&opt_->local()}; }

 private:
  ProcessGroup& pg_;
  std::shared_ptr<torch::nn::Module> model_;
  std::unique_ptr<Zero1Optimizer> opt_;
};

class BucketedZero1Strategy : public Strategy {
 public:
  BucketedZero1Strategy(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const MakeOptimizer& make,
                        double cap, bool overlap)
      : pg_(pg), model_(std::move(model)), overlap_(overlap) {
    UnitModel* units = as_unit_model(*model_);
    if (overlap_ && !units)
      throw std::invalid_argument("bucketed_zero1_strategy: overlapping the all-gathers needs a model with units");
    broadcast_parameters(pg, *model_);
    opt_ = std::make_unique<BucketedZero1>(pg, unique_parameters(*model_), local_factory(make), cap);
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
  double sent_bytes_per_step() const override { return zero1_bytes_per_step(trainable_elements(*model_), pg_.world_size()); }
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
  std::vector<optim::Optimizer*> optimizers() override {
    std::vector<optim::Optimizer*> out;
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

MakeStrategy cs336_strategy(double bucket_cap_mb) {
  return [bucket_cap_mb](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
                         const MakeOptimizer& make) -> std::unique_ptr<Strategy> {
    return std::make_unique<Cs336Strategy>(pg, std::move(model), make, bucket_cap_mb);
  };
}

MakeStrategy zero1_strategy() {
  return [](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
            const MakeOptimizer& make) -> std::unique_ptr<Strategy> {
    return std::make_unique<Zero1Strategy>(pg, std::move(model), make);
  };
}

MakeStrategy bucketed_zero1_strategy(double bucket_cap_mb, bool overlap_gathers) {
  return [bucket_cap_mb, overlap_gathers](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
                                          const MakeOptimizer& make) -> std::unique_ptr<Strategy> {
    return std::make_unique<BucketedZero1Strategy>(pg, std::move(model), make, bucket_cap_mb, overlap_gathers);
  };
}

}  // namespace dp
