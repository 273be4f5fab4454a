#include "stages/07_fsdp/strategies.hpp"

#include "common/memory.hpp"

#include <stdexcept>

namespace dp {

namespace {

UnitModel& units_of(torch::nn::Module& model) {
  UnitModel* m = as_unit_model(model);
  if (!m) throw std::invalid_argument("fsdp_strategy: the model has no units (it is not a dp::UnitModel)");
  return *m;
}

class FsdpStrategy : public Strategy {
 public:
  FsdpStrategy(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const MakeOptimizer& make, FsdpOptions opts)
      : pg_(pg), model_(model), opts_(opts), fsdp_(pg, model, units_of(*model).units(), opts), opt_(make(fsdp_.parameters())) {
    if (!opt_) throw std::invalid_argument("fsdp_strategy: the MakeOptimizer returned no optimizer");
  }
  void zero_grad() override {
    opt_->zero_grad();
    calls_at_start_ = collectives(), sent_at_start_ = fsdp_.sent_bytes();
  }
  UnitRunner runner() override { return fsdp_.runner(); }
  void after_backward() override { fsdp_.finish_gradient_synchronization(); }
  void step() override {
    opt_->step();
    calls_ = collectives() - calls_at_start_;
    sent_ = fsdp_.sent_bytes() - sent_at_start_;
  }
  int64_t calls_per_step() const override { return calls_; }
  TrainingBytes bytes() const override {  // the shards (and replicated tensors), their gradients, the state
    TrainingBytes b;
    const auto pieces = fsdp_.parameters();
    b.params = tensor_bytes(pieces);  // what a rank keeps between steps
    for (const auto& p : pieces) b.grads += tensor_bytes({p.grad()});
    b.state = optimizer_state_bytes(*opt_);
    return b;
  }
  double sent_bytes_per_step() const override { return sent_; }
  std::string describe() const override { return fsdp_.describe(); }
  torch::ScalarType compute_dtype(const torch::nn::Module& m) const override { return compute_dtype_of(m, opts_); }
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() override { return fsdp_.gather_full_parameters(); }
  // The pieces (a shard of each unit, the replicated gains whole) and their state, made whole or cut back.
  FullState full_state() override { return fsdp_.sharding().full_state(pg_, *opt_); }
  void load_full_state(const FullState& s) override {
    check_full_state(*model_, s);  // the model's sharded parameters keep their shapes
    fsdp_.sharding().load_full_state(s, pg_.rank(), *opt_);
  }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {opt_.get()}; }

 private:
  int64_t collectives() const { return fsdp_.all_gathers() + fsdp_.reduce_scatters() + fsdp_.all_reduces(); }

  ProcessGroup& pg_;
  std::shared_ptr<torch::nn::Module> model_;
  FsdpOptions opts_;
  Fsdp fsdp_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  int64_t calls_at_start_ = 0, calls_ = 0;
  double sent_at_start_ = 0, sent_ = 0;
};

}  // namespace

MakeStrategy fsdp_strategy(FsdpOptions opts) {
  return [opts](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
                const MakeOptimizer& make) -> std::unique_ptr<Strategy> {
    return std::make_unique<FsdpStrategy>(pg, std::move(model), make, opts);
  };
}

}  // namespace dp
