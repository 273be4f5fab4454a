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
      // AdamW's two moments per parameter (zeros before its first step) and its one step count.
      int64_t adam_step = 0;
      for (size_t i = 0; i < state.params.size(); ++i) {
        const auto& p = state.params[i].second;
        const ParamState& st = state.optimizer.at(i);
        auto moment = [&](const char* name) { return st.present ? st.tensors.at(name) : torch::zeros_like(p); };
        archive.write(fmt::format("p{}", i), p);
        archive.write(fmt::format("m{}", i), moment("exp_avg"));
        archive.write(fmt::format("v{}", i), moment("exp_avg_sq"));
        adam_step = st.present ? st.step : adam_step;
      }
      std::string payload;
      archive.save_to([&](const void* data, size_t size) {
        payload.append(static_cast<const char*>(data), size);
        return size;
      });
      const json m = {{"format", "dp language-model checkpoint"}, {"step", meta.step}, {"adam_step", adam_step},
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
                                                          const std::vector<std::pair<std::string, torch::Tensor>>& like) {
  const CheckpointFile file = read_checkpoint_file(path, kFormat);  // throws "damaged" / "cannot read"
  json m;
  try {
    m = json::parse(file.meta());
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: its metadata is not JSON ({})", path, e.what()));
  }
  LmCheckpointMeta meta;
  FullState s;
  int64_t adam_step = 0;
  try {
    meta.step = m.at("step").get<int64_t>();
    meta.config = m.at("config");
    meta.curve = m.at("curve");
    adam_step = m.at("adam_step").get<int64_t>();
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
      const auto& [name, shape_of] = like[i];
      torch::Tensor p, a, v;
      archive.read(fmt::format("p{}", i), p);
      archive.read(fmt::format("m{}", i), a);
      archive.read(fmt::format("v{}", i), v);
      for (const auto* t : {&p, &a, &v})
        if (!t->sizes().equals(shape_of.sizes()))
          throw UsageError(fmt::format("checkpoint {}: tensor {} ({}) has shape {}, the model's has {}", path, i, name,
                                       fmt::join(t->sizes(), "x"), fmt::join(shape_of.sizes(), "x")));
      // Copies of their own: tensors read from an archive may alias its buffer.
      s.params.emplace_back(name, p.clone());
      ParamState st;
      st.present = adam_step > 0, st.step = adam_step;
      if (st.present) st.tensors = {{"exp_avg", a.clone()}, {"exp_avg_sq", v.clone()}};
      s.optimizer.push_back(std::move(st));
    }
  } catch (const c10::Error& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: unreadable tensors ({})", path, e.what_without_backtrace()));
  }
  return {meta, s};
}

}  // namespace dp
