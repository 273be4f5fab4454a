// The capstone's checkpoints: everything needed to continue a run exactly, in one file that is
// replaced atomically (common/state/checkpoint_file.hpp: header, checksum, temporary file, fsync, rename).
//
// The state inside is the training contract's full state (common/state/full_state.hpp: every parameter and its
// AdamW moments in full), world-size-free, so a run saved with 2 ranks resumes with 1 or 4, and with
// another --sync. Its metadata (JSON, readable with `head -c 4000 FILE`) adds the step to continue from,
// the run's configuration and the loss curve so far.
#pragma once

#include "common/dist/dist.hpp"
#include "common/state/full_state.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace dp {

/// A checkpoint's contents besides the tensors.
struct LmCheckpointMeta {
  int64_t step = 0;       ///< the next step to run (steps 0..step-1 are done)
  nlohmann::json config;  ///< what must match to resume (model, batch, data, schedule)
  nlohmann::json curve;   ///< the loss curve so far
};

/// Writes `meta` and `state` to `path` from rank 0 (a collective: every rank learns whether it
/// worked). A crash mid-write leaves the previous checkpoint intact. Throws dp::UsageError on every
/// rank when rank 0 cannot write.
void save_lm_checkpoint(const std::string& path, ProcessGroup& pg, const LmCheckpointMeta& meta,
                        const FullState& state);

/// Reads `path` on every rank and checks it: the file container (magic, version, length, checksum), then
/// that its configuration equals `config` in every field but the world size and the synchronization,
/// then each tensor's shape against `like` (the current model's trainable parameters, named, in order;
/// only their shapes are read, so FSDP's, which hold no memory between steps, do). Throws
/// dp::UsageError naming the first problem. Not a collective.
std::pair<LmCheckpointMeta, FullState> load_lm_checkpoint(
    const std::string& path, const nlohmann::json& config,
    const std::vector<std::pair<std::string, torch::Tensor>>& like);

}  // namespace dp
