#include "extensions/06b_cs336_design/cs336_design.hpp"

#include "common/base/format.hpp"
#include "common/measure/memory.hpp"
#include "common/model/params.hpp"
#include "common/state/full_state.hpp"
#include "extensions/06b_cs336_design/sharded_optimizer.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/06_sharded_opt/strategies.hpp"  // zero1_steps

#include <fmt/format.h>
#include <CLI/CLI.hpp>

namespace dp {

namespace optim = torch::optim;

namespace {

class Cs336Strategy : public Strategy {
 public:
  Cs336Strategy(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const MakeOptimizer& make, double cap)
      : pg_(pg),
        model_(model),
        ddp_(std::make_unique<BucketedDdp>(pg, model, cap)),  // broadcasts rank 0's weights
        opt_(pg, {optim::OptimizerParamGroup(unique_parameters(*model))}, make) {}
  // [cs336 step]
  void zero_grad() override {
    ddp_->on_train_batch_start();
    opt_.zero_grad();
  }
  void after_backward() override { ddp_->finish_gradient_synchronization(); }  // stage 05's averaged buckets
  void step() override { opt_.step(); }  // step the owned tensors, broadcast each from its owner
  // [cs336 step]
  int64_t calls_per_step() const override {  // DDP's buckets, then one broadcast per trainable tensor
    return ddp_->calls_per_step() +
           (pg_.world_size() > 1 ? static_cast<int64_t>(unique_parameters(*model_, true).size()) : 0);
  }
  TrainingBytes bytes() const override { return count_training_bytes(*model_, opt_.local()); }
  double buffer_bytes() const override { return static_cast<double>(ddp_->buffer_bytes()); }  // its buckets
  double sent_bytes_per_step() const override {
    return cs336_bytes_per_step(count_elements(unique_parameters(*model_, true)), pg_.world_size());
  }
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
      s.optimizer.push_back(
          broadcast_param_state(pg_, owner, owner == pg_.rank() ? get_param_state(opt_.local(), p) : ParamState{}, p));
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

}  // namespace

MakeStrategy cs336_strategy(double bucket_cap_mb) {
  return [bucket_cap_mb](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
                         const MakeOptimizer& make) -> std::unique_ptr<Strategy> {
    return std::make_unique<Cs336Strategy>(pg, std::move(model), make, bucket_cap_mb);
  };
}

ShardedSteps cs336_steps(ProcessGroup& pg, const std::vector<torch::Tensor>& params, const optim::AdamWOptions& opts) {
  auto s = std::make_shared<ShardedOptimizer>(ShardedOptimizer::make<optim::AdamW>(pg, params, opts));
  return {[s] { s->zero_grad(); }, [s] { s->step(); }, s->describe(), /*sums_over_ranks=*/false};
}

static std::string check_design(const std::string& v) {
  if (v == "cs336" || v == "zero1" || v == "all") return {};
  return "unknown design '" + v +
         "': use cs336 (all-reduce, step the owned tensors, broadcast), zero1 "
         "(reduce-scatter, step a flat chunk, all-gather) or all (both); ZeRO-1 in buckets is ext06a_zero1_buckets";
}

void add_design_option(CLI::App& app, std::string& design) {
  app.add_option("--design", design,
                 "Which sharded design to check and measure: cs336 (all-reduce + broadcast), "
                 "zero1 (reduce-scatter + all-gather) or all (both)")
      ->check(check_design);
}

std::vector<std::string> selected_designs(const std::string& design) {
  if (design == "all") return {"cs336", "zero1"};
  return {design};
}

bool check_designs(ProcessGroup& pg, const std::string& design) {
  bool all_ok = true;
  for (const auto& d : selected_designs(design))
    all_ok =
        check_against_adamw(pg, d == "zero1" ? "ZeRO-1 AdamW" : "sharded AdamW",
                            [&](ProcessGroup& g, const std::vector<torch::Tensor>& p, const optim::AdamWOptions& o) {
                              return d == "zero1" ? zero1_steps(g, p, o) : cs336_steps(g, p, o);
                            }) &&
        all_ok;
  return all_ok;
}

}  // namespace dp
