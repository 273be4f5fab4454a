// Stage 09's training loop: stage 08's model, data and schedule, trained by generations of ranks. A
// failed step is redone by the survivors; a newcomer joins at a step boundary and takes the state of a
// live member. The global batch never changes, so neither does the loss curve.
#pragma once

#include "common/dist/dist.hpp"
#include "common/dist/fault.hpp"  // Faults
#include "stages/08_train_lm/corpus.hpp"
#include "stages/08_train_lm/train_loop.hpp"
#include "stages/09_elastic/membership.hpp"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace dp {

/// What stage09_elastic is told on its command line.
struct ElasticOptions {
  RunOptions run;         ///< stage 08's: model, data, schedule, checkpoint, curve (--sync ddp only)
  int min_ranks = 1;      ///< --min-ranks (ddp_launch's --min-nproc): fewer and the run stops, with a checkpoint
  int max_ranks = 1;      ///< the launcher's --nproc: a round with this many members closes at once
  double settle_s = 0.5;  ///< --settle: how long a round waits for more members after the first with state
  std::string trace;      ///< --trace: every process's timeline, merged into this file (common/base/timeline.hpp)
};

/// Throws dp::UsageError (exit 2) before any work: --sync other than ddp (a dead rank's shard would be
/// gone: the message names the remedies), a global batch that some membership from --min-ranks to the
/// launcher's --nproc cannot split evenly (it names the least batch that works), --min-ranks above --nproc.
void validate_elastic_options(const ElasticOptions& o);

/// Fewer than --min-ranks are left: the run stopped, after writing a checkpoint when one was asked for.
struct BelowMinRanks : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Trains to o.run.steps through as many generations as failures and newcomers make, and returns the
/// curve (written to o.run.curve by the last generation's rank 0): {"train": [[step, loss, seconds]...],
/// "events": one per generation (its round, members, why it formed, and how long each part of forming it
/// took), "config", "command"}. `with_state`: this process starts with the run's state (the launcher's
/// first processes, from step 0 or the checkpoint); a replacement starts without and is healed. Throws
/// BelowMinRanks, dp::CheckFailed (replicas differ), RunOver (too late) or std::runtime_error (no round closed).
nlohmann::json train_elastic(const ElasticOptions& o, const TextCorpus& corpus, Membership& members, Faults& faults,
                             const DistOptions& dist, bool with_state);

}  // namespace dp
