// One training step for every synchronization: the loop of common/contract/strategy.hpp, timed phase by phase.
#include "stages/08_train_lm/trainer.hpp"

#include "common/dist/runtime.hpp"
#include "common/measure/timing.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/06_sharded_opt/strategies.hpp"
#include "stages/07_fsdp/strategies.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <stdexcept>

namespace dp {

namespace optim = torch::optim;

optim::AdamWOptions lm_adamw(const TrainerOptions& o) {
  // The betas of most LM recipes (GPT-2, CS336): 0.95 forgets a noisy second moment faster.
  return optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(o.weight_decay);
}

// [lookup]
// --sync is a name for a Strategy. Each is its stage's class behind the contract: DDP accumulates under
// no_sync(); ZeRO-1's step() reduce-scatters, steps this rank's chunk and all-gathers; FSDP runs the
// model through its unit runner and reduce-scatters after every micro-batch. An extension of a later stage adds
// its own at run time (register_sync()): stage 08 links none of them.
struct SyncEntry {
  std::string name, help;
  std::function<MakeStrategy(const TrainerOptions&)> make;
  std::function<void(const TrainerOptions&, int)> validate;
};

static std::vector<SyncEntry>& syncs() {
  static std::vector<SyncEntry> table = {
      {"ddp", "stage 05", [](const TrainerOptions& o) { return bucketed_ddp_strategy(o.bucket_mb); }, {}},
      {"zero1", "stage 06", [](const TrainerOptions&) { return zero1_strategy(); }, {}},
      {"fsdp", "stage 07", [](const TrainerOptions&) { return fsdp_strategy({}); }, {}},
  };
  return table;
}
// [lookup]

void register_sync(std::string name, std::string help, std::function<MakeStrategy(const TrainerOptions&)> make,
                   std::function<void(const TrainerOptions&, int)> validate) {
  syncs().push_back({std::move(name), std::move(help), std::move(make), std::move(validate)});
}

std::vector<std::string> sync_names() {
  std::vector<std::string> names;
  for (const auto& e : syncs()) names.push_back(e.name);
  return names;
}

std::string sync_help() {
  std::vector<std::string> parts;
  for (const auto& e : syncs()) parts.push_back(fmt::format("{} ({})", e.name, e.help));
  return fmt::format("{}", fmt::join(parts, ", "));
}

static const SyncEntry& sync_entry(const std::string& name) {
  for (const auto& e : syncs())
    if (e.name == name) return e;
  throw UsageError(fmt::format("--sync {}: unknown; choose one of {}", name, fmt::join(sync_names(), ", ")));
}

MakeStrategy strategy_for(const TrainerOptions& o) { return sync_entry(o.sync).make(o); }

void validate_sync(const TrainerOptions& o, int world_size) {
  if (const auto& e = sync_entry(o.sync); e.validate) e.validate(o, world_size);
}

LmTrainer::LmTrainer(ProcessGroup& pg, TransformerLM model, const TrainerOptions& o)
    : model_(model), device_(pg.device()) {
  // The Strategies take the parameters where they are: a model left on the host would train there, or
  // fail in a collective with a less helpful message.
  for (const auto& p : model->parameters())
    if (p.device() != device_)
      throw std::invalid_argument(
          fmt::format("LmTrainer: a parameter is on {}, the process group computes on {}: "
                      "move the model with model->to(pg.device()) first",
                      p.device().str(), device_.str()));
  const auto adamw = lm_adamw(o);
  strategy_ = strategy_for(o)(pg, model.ptr(), [adamw](std::vector<torch::Tensor> p) {
    return std::unique_ptr<optim::Optimizer>(std::make_unique<optim::AdamW>(std::move(p), adamw));
  });
  strategy_->set_max_grad_norm(o.max_grad_norm);  // clips inside step(), where each scheme's gradient is final
}

// [step]
double LmTrainer::step(const std::vector<Batch>& micro, double lr, StepTimes& t) {
  Strategy& s = *strategy_;
  const double K = static_cast<double>(micro.size());
  s.zero_grad();
  double loss = 0;
  for (size_t k = 0; k < micro.size(); ++k) {
    // Micro-batches 0..K-2 may accumulate locally (DDP: no_sync()); the last backward synchronizes the
    // sum of all K. Scaling each mean loss by 1/K makes that sum the gradient of the mean over K * b rows.
    s.set_requires_gradient_sync(k + 1 == micro.size());
    Timer f(device_);  // on a GPU each timer synchronizes: kernels return before they finish
    torch::Tensor l = lm_loss(model_->forward_units(micro[k].first, s.runner()), micro[k].second);
    t.forward += f.seconds();
    Timer b(device_);
    (l / K).backward();
    t.backward += b.seconds();
    loss += l.item<double>();
    Timer w(device_);
    s.after_backward();  // waits for what is still on the wire: exposed communication
    t.sync += w.seconds();
  }
  Timer o(device_);
  set_learning_rate(s, lr);
  s.step();  // ZeRO-1: with its reduce-scatter and all-gather
  t.optimizer += o.seconds();
  return loss / K;
}
// [step]

double LmTrainer::eval_loss(const Batch& b) {
  torch::NoGradGuard no_grad;
  return lm_loss(model_->forward_units(b.first, strategy_->runner()), b.second).item<double>();
}

}  // namespace dp
