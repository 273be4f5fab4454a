#include "stages/06_sharded_opt/strategies.hpp"

#include "common/base/format.hpp"
#include "common/measure/memory.hpp"
#include "common/model/params.hpp"
#include "common/state/full_state.hpp"
#include "stages/06_sharded_opt/zero1_optimizer.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dp {

namespace optim = torch::optim;

static int64_t trainable_elements(const torch::nn::Module& m) { return count_elements(unique_parameters(m, true)); }

namespace {

class Zero1Strategy : public Strategy {
 public:
  Zero1Strategy(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const MakeOptimizer& make,
                ReduceScatterHow how)
      : pg_(pg), model_(std::move(model)), how_(how) {
    broadcast_parameters(pg, *model_);
    opt_ = std::make_unique<Zero1Optimizer>(pg, unique_parameters(*model_), make, how);
    opt_->set_before_local_step([this] { clip_before_step(); });
  }
  void zero_grad() override { opt_->zero_grad(); }
  void after_backward() override {}       // the gradients' reduce-scatter is part of step()
  void step() override { opt_->step(); }  // clips inside, between its reduce-scatter and the local step
  // This rank's chunk of the flat buffer over the group: after the reduce-scatter, the only gradient there is.
  GradientSpread gradient_spread() override { return {{opt_->shard()}, {}, &pg_}; }
  int64_t calls_per_step() const override { return pg_.world_size() > 1 ? 2 : 0; }  // reduce-scatter, all-gather
  TrainingBytes bytes() const override { return count_training_bytes(*model_, opt_->local()); }
  double sent_bytes_per_step() const override {
    const double fp32 = zero1_bytes_per_step(trainable_elements(*model_), pg_.world_size());
    if (!how_.bytes) return fp32;
    return fp32 / 2 + how_.bytes(opt_->layout().padded, pg_.world_size());  // the all-gather's half, and the custom
  }
  double buffer_bytes() const override { return static_cast<double>(opt_->buffer_bytes()); }
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
  ReduceScatterHow how_;
  std::unique_ptr<Zero1Optimizer> opt_;
};

}  // namespace

ShardedSteps zero1_steps(ProcessGroup& pg, const std::vector<torch::Tensor>& params, const optim::AdamWOptions& opts) {
  std::shared_ptr<Zero1Optimizer> z = Zero1Optimizer::make<optim::AdamW>(pg, params, opts);
  return {[z] { z->zero_grad(); }, [z] { z->step(); }, z->describe(), /*sums_over_ranks=*/true};
}

MakeStrategy zero1_strategy(ReduceScatterHow how) {
  return [how](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
               const MakeOptimizer& make) -> std::unique_ptr<Strategy> {
    return std::make_unique<Zero1Strategy>(pg, std::move(model), make, how);
  };
}

}  // namespace dp
