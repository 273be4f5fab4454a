#include "stages/07_fsdp/strategies.hpp"

#include "common/base/format.hpp"
#include "common/base/log.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/measure/cli.hpp"  // ComputeDtypeText
#include "common/measure/memory.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

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
  FsdpStrategy(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const MakeOptimizer& make, FsdpOptions opts,
               const MakeFsdp& make_fsdp)
      : pg_(pg),
        model_(model),
        opts_(opts),
        fsdp_(make_fsdp ? make_fsdp(pg, model, units_of(*model).units(), opts)
                        : std::make_unique<Fsdp>(pg, model, units_of(*model).units(), opts)),
        opt_(make(fsdp_->parameters())) {
    if (!opt_) throw std::invalid_argument("fsdp_strategy: the MakeOptimizer returned no optimizer");
  }
  void zero_grad() override {
    opt_->zero_grad();
    calls_at_start_ = collectives();
    sent_at_start_ = fsdp_->sent_bytes();
  }
  UnitRunner runner() override { return fsdp_->runner(); }
  void after_backward() override { fsdp_->finish_gradient_synchronization(); }
  void step() override {
    clip_before_step();
    opt_->step();
    calls_ = collectives() - calls_at_start_;
    sent_ = fsdp_->sent_bytes() - sent_at_start_;
  }
  int64_t calls_per_step() const override { return calls_; }
  // What a rank keeps between steps: the shards (and replicated tensors), their gradients, the state.
  TrainingBytes bytes() const override { return count_training_bytes(fsdp_->parameters(), *opt_); }
  double sent_bytes_per_step() const override { return sent_; }
  double gathered_peak_bytes() const override { return static_cast<double>(fsdp_->peak_gathered_bytes()); }
  std::string describe() const override { return fsdp_->describe(); }
  torch::ScalarType compute_dtype(const torch::nn::Module& m) const override { return compute_dtype_of(m, opts_); }
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() override {
    return fsdp_->gather_full_parameters();
  }
  // The pieces (a shard of each unit, the replicated gains whole) and their state, made whole or cut back.
  FullState full_state() override { return fsdp_->sharding().full_state(pg_, *opt_); }
  void load_full_state(const FullState& s) override {
    check_full_state(*model_, s);  // the model's sharded parameters keep their shapes
    fsdp_->sharding().load_full_state(s, pg_.rank(), *opt_);
  }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {opt_.get()}; }
  GradientSpread gradient_spread() override { return sharded_spread(fsdp_->sharding(), pg_); }

 private:
  int64_t collectives() const { return fsdp_->all_gathers() + fsdp_->reduce_scatters() + fsdp_->all_reduces(); }

  ProcessGroup& pg_;
  std::shared_ptr<torch::nn::Module> model_;
  FsdpOptions opts_;
  std::unique_ptr<Fsdp> fsdp_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  int64_t calls_at_start_ = 0, calls_ = 0;
  double sent_at_start_ = 0, sent_ = 0;
};

}  // namespace

MakeStrategy fsdp_strategy(FsdpOptions opts, MakeFsdp make_fsdp) {
  return [opts, make_fsdp](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
                           const MakeOptimizer& make) -> std::unique_ptr<Strategy> {
    return std::make_unique<FsdpStrategy>(pg, std::move(model), make, opts, make_fsdp);
  };
}

void add_fsdp_flags(CLI::App& app, std::string& reshard, std::string& dtype) {
  app.add_option("--reshard-after-forward", reshard,
                 "true: free gathered weights after forward (ZeRO-3); false: keep them until backward; both")
      ->check(CLI::IsMember({"true", "false", "both"}));
  app.add_option("--compute-dtype", dtype, "With the benchmark: float32 or bfloat16 (bf16) for FSDP's gathered weights")
      ->check(ComputeDtypeText);
}

bool run_fsdp_checks(ProcessGroup& pg, const std::vector<bool>& reshard_modes, uint64_t seed) {
  // [checks]
  bool all_ok = true;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (bool reshard : reshard_modes) {
      const FsdpOptions f{reshard, dtype};
      // CS336 2026's test_fsdp_correctness is the common check with its settings (plain SGD, 10 rows per rank).
      bool ok = report_margin(check_strategy(pg, fsdp_strategy(f), StrategyCheck::cs336_fsdp(seed)),
                              fmt::format("FSDP == one process on ToyFSDPModel ({}; 3 SGD steps, {})",
                                          fsdp_mode_name(f), count_of(pg.world_size(), "rank")));
      check_gradient_sync(pg, fsdp_strategy(f));  // CS336 2026's test_fsdp_gradient_sync; throws CheckFailed
      print0("PASS FSDP gradients ({}): fp32, shard-shaped, replicated ones equal on every rank", fsdp_mode_name(f));
      // The check every Strategy passes (common/harness/ddp_check.hpp), with a reference computing in f's dtype:
      // SGD with momentum (state to shard), every rank starting from its own weights, micro-batches.
      for (int k : {1, 2}) {
        StrategyCheck c;
        c.seed = seed;
        c.accumulate = k;
        ok = report_margin(check_strategy(pg, fsdp_strategy(f), c),
                           fmt::format("FSDP as a Strategy == one process ({}; 3 SGD steps with momentum, {} "
                                       "micro-batch{} per step)",
                                       fsdp_mode_name(f), k, k > 1 ? "es" : "")) &&
             ok;
      }
      all_ok = all_ok && ok;
    }
  // [checks]
  return all_ok;
}

}  // namespace dp
