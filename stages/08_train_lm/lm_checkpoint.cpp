// Saving and loading the capstone's checkpoints: the contract's full state in common/state/full_state.hpp's
// file, with the run's step, configuration and loss curve as its metadata.
#include "stages/08_train_lm/lm_checkpoint.hpp"

#include "common/base/errors.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace dp {

using json = nlohmann::json;

// Configuration fields a resumed run may change, with the option that sets each: how the global batch is
// split (ranks, micro-batches: the same rows, summed in another order) and synchronized (the state is the
// same full state either way), and how long it runs or how often it evaluates and saves.
static const std::vector<std::pair<std::string, std::string>> kMayDiffer = {{"world_size", "the number of ranks"},
                                                                            {"accumulate", "--accumulate"},
                                                                            {"sync", "--sync"},
                                                                            {"bucket_mb", "--bucket-mb"},
                                                                            {"steps", "--steps"},
                                                                            {"eval_every", "--eval-every"},
                                                                            {"checkpoint_every", "--checkpoint-every"}};
static bool may_differ(const std::string& key) {
  return std::any_of(kMayDiffer.begin(), kMayDiffer.end(), [&](const auto& field) { return field.first == key; });
}

// [save]
void save_lm_checkpoint(const std::string& path, ProcessGroup& pg, const LmCheckpointMeta& meta,
                        const FullState& state) {
  // Every parameter and its AdamW moments in full (gathered by the Strategy), written by rank 0.
  save_state_file(path, pg, {{"step", meta.step}, {"config", meta.config}, {"curve", meta.curve}}, state);
}
// [save]

std::pair<LmCheckpointMeta, FullState> load_lm_checkpoint(
    const std::string& path, const json& config, const std::vector<std::pair<std::string, torch::Tensor>>& like) {
  LmCheckpointMeta meta;
  auto check = [&](const json& m) {
    meta.step = m.at("step").get<int64_t>();
    meta.config = m.at("config");
    meta.curve = m.at("curve");
    for (const auto& [key, value] : config.items()) {
      if (may_differ(key) || meta.config.value(key, json()) == value) continue;
      std::vector<std::string> options;
      for (const auto& field : kMayDiffer) options.push_back(field.second);
      throw UsageError(
          fmt::format("checkpoint {} was written with {} = {}, this run has {}: resume with the same model, "
                      "batch, data and schedule (only {} may change)",
                      path, key, meta.config.value(key, json()).dump(), value.dump(), fmt::join(options, ", ")));
    }
    // Equal is a finished run, resumed again (a requeued job): it trains no step and ends as it did.
    const int64_t steps = config.value("steps", meta.step);  // a configuration without it asks nothing here
    if (meta.step > steps)
      throw UsageError(
          fmt::format("checkpoint {} is at step {}, past --steps {}: pass --steps {} or more to train on "
                      "from it, or leave out --resume to start again",
                      path, meta.step, steps, meta.step + 1));
  };
  StateFile f = load_state_file(path, like, check);
  return {meta, std::move(f.state)};
}

}  // namespace dp
