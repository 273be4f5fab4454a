// The capstone's options and its training loop: data from the sampler, a step of the chosen
// synchronization, losses averaged over ranks, validation, checkpoints, progress, and a sample of text.
#pragma once

#include "common/dist/dist.hpp"
#include "stages/08_train_lm/corpus.hpp"
#include "stages/08_train_lm/trainer.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <stdexcept>
#include <string>

namespace CLI {
class App;  // CLI11's (<CLI/CLI.hpp>, included where the flags are added)
}

namespace dp {

/// Everything stage08_train_lm is told on its command line.
struct RunOptions {
  std::string corpus = kDefaultCorpus;
  std::string preset = "tiny";
  int64_t context = 64;    ///< bytes per sequence
  int64_t batch = 16;      ///< global batch: sequences per optimizer step over all ranks
  int64_t accumulate = 1;  ///< micro-batches per step on each rank
  int64_t steps = 100;
  double lr = 2e-3;
  int64_t warmup = 20;  ///< linear warm-up steps; then the learning rate stays at lr
  int64_t eval_every = 25;
  std::string checkpoint;  ///< file; empty: no checkpoints
  int64_t checkpoint_every = 0;
  bool resume = false;
  std::string curve;  ///< JSON output; empty: none
  int64_t sample_bytes = 200;
  uint64_t seed = 0;
  int world_size = 1;   ///< filled in once the process group exists
  std::string command;  ///< the command line that reproduces the run (recorded in --curve)
  TrainerOptions trainer;

  /// What a checkpoint records and a resumed run must match (but for the fields that may change:
  /// world_size, sync, steps, eval_every, checkpoint_every, bucket_mb).
  nlohmann::json config() const;
};

/// Adds the flags of the model, the data and the schedule to `app` (--corpus, --preset, --context, --batch,
/// --accumulate, --steps, --lr, --warmup), each writing its field of `o`: stage 09 takes them too.
void add_training_options(CLI::App& app, RunOptions& o);

/// Throws dp::UsageError (exit 2) on options that cannot work together, before anything starts:
/// --checkpoint-every or --resume without --checkpoint, --resume with a checkpoint that does not exist,
/// a --checkpoint or --curve file that cannot be written, --warmup beyond --steps.
void validate_run_options(const RunOptions& o);

/// Throws dp::UsageError unless the global batch splits into world_size x accumulate equal micro-batches,
/// and unless the `ranks_here` ranks on this machine can each hold their share of the training state and
/// one micro-batch's activations (dp::peak_training_bytes() for o.trainer.sync, against the memory
/// available; `on_gpu`: one GPU's, shared by the ranks bound to it): a --preset or --context too large is
/// refused before any work, not killed halfway.
void check_run_fits(const RunOptions& o, int world_size, int ranks_here, bool on_gpu = false);

/// This rank's windows `ids` of the training text cut into `k` equal micro-batches, in order, on `device`.
std::vector<Batch> micro_batches(const TextCorpus& c, const std::vector<int64_t>& ids, int64_t k, int64_t context,
                                 torch::Device device);

/// The TransformerLM of `o.preset` with a byte vocabulary (256), initialised from `seed` on every rank, on
/// `device` (pg.device(): the Strategies take the parameters where they are).
TransformerLM make_byte_lm(const std::string& preset, int64_t context, uint64_t seed, torch::Device device);

/// The learning rate of step `step`: linear warm-up over o.warmup steps, then o.lr. A function of the step
/// alone, so a resumed run (or stage 09's, whatever its membership) continues it exactly.
double lr_at(const RunOptions& o, int64_t step);

/// The training loss stopped being a number (too large a learning rate, mostly): the run ends at that
/// step with a hint (exit 1), and writes no checkpoint over the last good one.
struct NonFiniteLoss : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Trains (from step 0, or from the checkpoint with --resume) to o.steps and returns the curve, as also
/// written to o.curve. Checkpoints (with --checkpoint) every o.checkpoint_every steps and after the last
/// step; throws NonFiniteLoss at the first non-finite loss. Ends with a barrier, its last collective; rank 0
/// then samples o.sample_bytes alone. The curve: {"config", "train": [[step, loss,
/// tokens/s]...], "val": [[step, loss]...], with --clip-grad-norm "grad_norm": [[step, norm before clipping]...],
/// "phases": median seconds per step of data, forward, backward, sync, optimizer (this rank), "sample",
/// "command", "machine", "link"}.
nlohmann::json train(ProcessGroup& pg, const RunOptions& o, const TextCorpus& corpus, DistributedSampler& sampler);

/// Stage 08's program, returning its exit code: the flags (and a caller's own, added by `add_options`; --sync takes
/// every name register_sync() holds), bad input refused (exit 2) before the process group forms, the check
/// against one process, training. `program` and `description` head --help.
int train_lm_main(int argc, char** argv, const std::string& program, const std::string& description,
                  const std::function<void(CLI::App&)>& add_options = {});

}  // namespace dp
