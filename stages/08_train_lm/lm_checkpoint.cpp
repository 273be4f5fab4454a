// Saving and loading the capstone's checkpoints.
#include "stages/08_train_lm/lm_checkpoint.hpp"

#include "common/checkpoint_file.hpp"
#include "common/runtime.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dp {

using json = nlohmann::json;

static const FileFormat kFormat{"DPLMCKPT", 1};

// Configuration fields a resumed run may change: how many ranks and how they synchronize (the state
// is the same full state either way), and how long it runs or how often it evaluates and saves.
static bool may_differ(const std::string& key) {
  return key == "world_size" || key == "sync" || key == "steps" || key == "eval_every" ||
         key == "checkpoint_every" || key == "bucket_mb";
}

// [save]
void save_lm_checkpoint(const std::string& path, ProcessGroup& pg, const LmCheckpointMeta& meta,
                        const FullState& state) {
  std::string error;
  if (pg.rank() == 0) {
    try {
      torch::serialize::OutputArchive archive;
      for (size_t i = 0; i < state.params.size(); ++i) {
        archive.write(fmt::format("p{}", i), state.params[i]);
        archive.write(fmt::format("m{}", i), state.exp_avg[i]);
        archive.write(fmt::format("v{}", i), state.exp_avg_sq[i]);
      }
      std::string payload;
      archive.save_to([&](const void* data, size_t size) {
        payload.append(static_cast<const char*>(data), size);
        return size;
      });
      const json m = {{"format", "dp language-model checkpoint"}, {"step", meta.step}, {"adam_step", state.adam_step},
                      {"tensors", state.params.size()}, {"config", meta.config}, {"curve", meta.curve}};
      write_checkpoint_file(path, kFormat, m.dump(), payload);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  error = broadcast_text(pg, error, 0);  // all ranks stop together, or none does
  if (!error.empty()) throw UsageError(error);
}
// [save]

std::pair<LmCheckpointMeta, FullState> load_lm_checkpoint(const std::string& path, const json& config,
                                                          const std::vector<torch::Tensor>& like) {
  const CheckpointFile file = read_checkpoint_file(path, kFormat);  // throws "damaged" / "cannot read"
  json m;
  try {
    m = json::parse(file.meta());
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: its metadata is not JSON ({})", path, e.what()));
  }
  LmCheckpointMeta meta;
  FullState s;
  try {
    meta.step = m.at("step").get<int64_t>();
    meta.config = m.at("config");
    meta.curve = m.at("curve");
    s.adam_step = m.at("adam_step").get<int64_t>();
    for (const auto& [key, value] : config.items())
      if (!may_differ(key) && meta.config.value(key, json()) != value)
        throw UsageError(fmt::format("checkpoint {} was written with {} = {}, this run has {}: resume with the same "
                                     "model, batch, data and schedule (only the number of ranks, --sync, --steps, "
                                     "--eval-every and --checkpoint-every may change)",
                                     path, key, meta.config.value(key, json()).dump(), value.dump()));
    if (m.at("tensors").get<size_t>() != like.size())
      throw UsageError(fmt::format("checkpoint {} holds {} tensors, the model has {}", path,
                                   m.at("tensors").get<size_t>(), like.size()));
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: {}", path, e.what()));
  }
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(file.payload(), file.payload_size);
    for (size_t i = 0; i < like.size(); ++i) {
      torch::Tensor p, a, v;
      archive.read(fmt::format("p{}", i), p);
      archive.read(fmt::format("m{}", i), a);
      archive.read(fmt::format("v{}", i), v);
      for (const auto* t : {&p, &a, &v})
        if (!t->sizes().equals(like[i].sizes()))
          throw UsageError(fmt::format("checkpoint {}: tensor {} has shape {}, the model's has {}", path, i,
                                       fmt::join(t->sizes(), "x"), fmt::join(like[i].sizes(), "x")));
      // Copies of their own: tensors read from an archive may alias its buffer.
      s.params.push_back(p.clone()), s.exp_avg.push_back(a.clone()), s.exp_avg_sq.push_back(v.clone());
    }
  } catch (const c10::Error& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: unreadable tensors ({})", path, e.what_without_backtrace()));
  }
  return {meta, s};
}

}  // namespace dp
