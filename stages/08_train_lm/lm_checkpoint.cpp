// Saving and loading the capstone's checkpoints: the contract's full state in common/full_state.hpp's
// file, with the run's step, configuration and loss curve as its metadata.
#include "stages/08_train_lm/lm_checkpoint.hpp"

#include "common/errors.hpp"

#include <fmt/format.h>

namespace dp {

using json = nlohmann::json;

// Configuration fields a resumed run may change: how many ranks and how they synchronize (the state
// is the same full state either way), and how long it runs or how often it evaluates and saves.
static bool may_differ(const std::string& key) {
  return key == "world_size" || key == "sync" || key == "steps" || key == "eval_every" ||
         key == "checkpoint_every" || key == "bucket_mb";
}

// [save]
void save_lm_checkpoint(const std::string& path, ProcessGroup& pg, const LmCheckpointMeta& meta,
                        const FullState& state) {
  // Every parameter and its AdamW moments in full (gathered by the Strategy), written by rank 0.
  save_state_file(path, pg, {{"step", meta.step}, {"config", meta.config}, {"curve", meta.curve}}, state);
}
// [save]

std::pair<LmCheckpointMeta, FullState> load_lm_checkpoint(const std::string& path, const json& config,
                                                          const std::vector<std::pair<std::string, torch::Tensor>>& like) {
  LmCheckpointMeta meta;
  auto check = [&](const json& m) {
    meta.step = m.at("step").get<int64_t>();
    meta.config = m.at("config");
    meta.curve = m.at("curve");
    for (const auto& [key, value] : config.items())
      if (!may_differ(key) && meta.config.value(key, json()) != value)
        throw UsageError(fmt::format("checkpoint {} was written with {} = {}, this run has {}: resume with the same "
                                     "model, batch, data and schedule (only the number of ranks, --sync, --steps, "
                                     "--eval-every and --checkpoint-every may change)",
                                     path, key, meta.config.value(key, json()).dump(), value.dump()));
    // Equal is a finished run, resumed again (a requeued job): it trains no step and ends as it did.
    const int64_t steps = config.value("steps", meta.step);  // a configuration without it asks nothing here
    if (meta.step > steps)
      throw UsageError(fmt::format("checkpoint {} is at step {}, past --steps {}: pass --steps {} or more to train on "
                                   "from it, or leave out --resume to start again", path, meta.step, steps,
                                   meta.step + 1));
  };
  StateFile f = load_state_file(path, like, check);
  return {meta, std::move(f.state)};
}

}  // namespace dp
