// The capstone's training step, with the synchronization picked on the command line: stage 05's
// bucketed DDP (optionally accumulating K micro-batches under no_sync()), stage 06's true ZeRO-1 or
// stage 07's FSDP. The training loop in main.cpp sees one interface; each class below is the loop of
// its stage, unchanged.
#pragma once

#include "common/dist.hpp"
#include "common/transformer.hpp"

#include <torch/torch.h>

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

/// Everything a checkpoint needs to continue training, world-size-free: every parameter in full and
/// AdamW's two moments for each, in the model's parameter order. The same on every rank.
struct FullState {
  std::vector<torch::Tensor> params, exp_avg, exp_avg_sq;
  int64_t adam_step = 0;  ///< AdamW's step count (0: no state yet)
};

/// One synchronization scheme around one TransformerLM and AdamW.
class LmTrainer {
 public:
  virtual ~LmTrainer() = default;
  /// One optimizer step over `micro` (K micro-batches of this rank's share, K >= 1) at learning rate
  /// `lr`: each micro-batch's mean loss / K goes backward, then gradients are averaged over ranks and
  /// AdamW steps. Returns this rank's mean loss over its micro-batches.
  virtual double step(const std::vector<Batch>& micro, double lr, StepTimes& t) = 0;
  /// Mean cross-entropy of `b` without gradients (every rank must call it: FSDP gathers).
  virtual double eval_loss(const Batch& b) = 0;
  /// The state in full on every rank (a collective: ZeRO-1 and FSDP gather their shards).
  virtual FullState full_state() = 0;
  /// Installs `s` (every rank passes the same; shapes were checked by the caller).
  virtual void load_full_state(const FullState& s) = 0;
  /// One line for the log: the scheme and its settings.
  virtual std::string describe() const = 0;
};

/// Training options every scheme shares.
struct TrainerOptions {
  std::string sync = "ddp";       ///< ddp | zero1 | fsdp
  double bucket_mb = 25;          ///< DDP's bucket cap
  double weight_decay = 0.1;      ///< AdamW's
};

/// The scheme named by `o.sync` around `model` (already initialised identically on every rank: each
/// scheme also broadcasts rank 0's weights). Throws dp::UsageError on an unknown name.
std::unique_ptr<LmTrainer> make_trainer(ProcessGroup& pg, TransformerLM model, const TrainerOptions& o);

/// The AdamW every scheme uses (betas 0.9 / 0.95, o.weight_decay; the learning rate is set each step).
torch::optim::AdamWOptions lm_adamw(const TrainerOptions& o);

/// The sync names make_trainer() knows.
std::vector<std::string> sync_names();

}  // namespace dp
