#include "stages/06_sharded_opt/strategies.hpp"

#include "common/format.hpp"
#include "common/full_state.hpp"
#include "common/memory.hpp"
#include "common/params.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/06_sharded_opt/sharded_optimizer.hpp"
#include "stages/06_sharded_opt/zero1_optimizer.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dp {

namespace optim = torch::optim;

MakeLocalOptimizer local_factory(const MakeOptimizer& make) {
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
  // [cs336 step]
  void zero_grad() override { ddp_->on_train_batch_start(), opt_.zero_grad(); }
  void after_backward() override { ddp_->finish_gradient_synchronization(); }  // stage 05's averaged buckets
  void step() override { opt_.step(); }  // step the owned tensors, broadcast each from its owner
  // [cs336 step]
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

}  // namespace dp
