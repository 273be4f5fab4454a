// The capstone's training step, with the synchronization picked on the command line: any dp::Strategy
// (common/contract/strategy.hpp) trains the model, so --sync is a lookup of a name into stage 05's bucketed DDP
// (accumulating K micro-batches under no_sync()), stage 06's true ZeRO-1 or stage 07's FSDP, and one
// loop, one check and one checkpoint path serve all three (and what an extension adds: register_sync()).
#pragma once

#include "common/contract/strategy.hpp"
#include "common/dist/dist.hpp"
#include "common/model/transformer.hpp"
#include "common/state/full_state.hpp"

#include "common/base/libtorch.hpp"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dp {

/// A (inputs [b, T], targets [b, T]) pair of int64 tokens.
using Batch = std::pair<torch::Tensor, torch::Tensor>;

/// Where the wall time of one step went, in seconds, on this rank.
struct StepTimes {
  double forward = 0, backward = 0, sync = 0, optimizer = 0;
};

/// Training options every scheme shares.
struct TrainerOptions {
  std::string sync = "ddp";   ///< ddp | zero1 | fsdp, or a name register_sync() added
  double bucket_mb = 25;      ///< DDP's bucket cap
  double weight_decay = 0.1;  ///< AdamW's
  double max_grad_norm = 0;   ///< clip the global gradient norm to this (Strategy::set_max_grad_norm); 0: off
};

/// One TransformerLM trained with AdamW by the Strategy `o.sync` names.
class LmTrainer {
 public:
  /// `model` is already initialised identically on every rank (each scheme also broadcasts rank 0's
  /// weights) and on pg.device(). Throws dp::UsageError on an unknown o.sync, std::invalid_argument when a
  /// parameter is on another device.
  LmTrainer(ProcessGroup& pg, TransformerLM model, const TrainerOptions& o);
  /// One optimizer step over `micro` (K micro-batches of this rank's share, K >= 1, on pg.device()) at
  /// learning rate `lr`: each micro-batch's mean loss / K goes backward, then gradients are averaged over
  /// ranks and AdamW steps. Returns this rank's mean loss over its micro-batches.
  double step(const std::vector<Batch>& micro, double lr, StepTimes& t);
  /// Mean cross-entropy of `b` (on pg.device()) without gradients (every rank must call it: FSDP gathers).
  double eval_loss(const Batch& b);
  /// Every parameter and its AdamW moments in full, on every rank (a collective: ZeRO-1 and FSDP gather).
  FullState full_state() { return strategy_->full_state(); }
  /// The state for a checkpoint (Strategy::full_state_view(): DDP's live tensors, no copy).
  FullState full_state_view() { return strategy_->full_state_view(); }
  /// Installs `s` (every rank passes the same; names and shapes are checked).
  void load_full_state(const FullState& s) { strategy_->load_full_state(s); }
  /// One line for the log: the scheme and its settings.
  std::string describe() const { return strategy_->describe(); }
  /// The global gradient norm before clipping in the last step (NaN unless o.max_grad_norm > 0).
  double last_grad_norm() const { return strategy_->last_grad_norm(); }
  /// false when the scheme shards the parameters (forward runs through its runner): no rank can sample alone.
  bool holds_whole_model() { return !strategy_->runner(); }

 private:
  TransformerLM model_;
  torch::Device device_;  ///< pg.device(): what the phase timers synchronize
  std::unique_ptr<Strategy> strategy_;
};

/// Adds `name` to the --sync table (once, before train_lm_main()), so that stage 08 links no later stage: `make`
/// gives its Strategy, `help` says what it is in --help, and `validate` (optional) refuses a world size it cannot
/// take with dp::UsageError, before the process group forms (check_run_fits() calls it).
void register_sync(std::string name, std::string help, std::function<MakeStrategy(const TrainerOptions&)> make,
                   std::function<void(const TrainerOptions&, int world_size)> validate = {});

/// The Strategy that `o.sync` names. Throws dp::UsageError on an unknown name.
MakeStrategy strategy_for(const TrainerOptions& o);

/// Runs the `validate` registered with `o.sync`, if any: throws dp::UsageError for a world size it cannot take.
void validate_sync(const TrainerOptions& o, int world_size);

/// "ddp (stage 05), zero1 (stage 06), fsdp (stage 07)": every sync name with its help, for --sync's help.
std::string sync_help();

/// The AdamW every scheme uses (betas 0.9 / 0.95, o.weight_decay; the learning rate is set each step).
torch::optim::AdamWOptions lm_adamw(const TrainerOptions& o);

/// The sync names strategy_for() knows.
std::vector<std::string> sync_names();

}  // namespace dp
