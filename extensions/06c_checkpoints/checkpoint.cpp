// Sharded checkpoints: every owner's state gathered to rank 0; on load, each rank takes what it owns now.
// "Now" is the current partition, whatever the world size was at save time.
#include "extensions/06c_checkpoints/checkpoint.hpp"

#include "common/dist/runtime.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/state/checkpoint_file.hpp"
#include "common/state/optim_state.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <unordered_set>

namespace dp {

namespace optim = torch::optim;
using nlohmann::json;

namespace {

const FileFormat kFormat{"DPZ1CKPT", kCheckpointVersion};

// A checkpoint that passed the container's checks, with its metadata parsed.
struct Checked {
  CheckpointFile file;
  json meta;
  CheckpointInfo info;
};

Checked read_and_check(const std::string& path) {
  Checked c{read_checkpoint_file(path, kFormat), {}, {}};
  try {
    c.meta = json::parse(c.file.meta());
    c.info.version = c.file.version;
    c.info.world_size = c.meta.at("world_size").get<int>();
    c.info.optimizer = c.meta.at("optimizer").get<std::string>();
    for (const auto& p : c.meta.at("params")) {
      c.info.names.push_back(p.at("name").get<std::string>());
      if (!p.at("state").is_null()) c.info.max_step = std::max(c.info.max_step, p["state"].at("step").get<int64_t>());
    }
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: unreadable metadata ({})", path, e.what()));
  }
  return c;
}

// Compares the checkpoint's parameter list and groups with the model and optimizer; throws naming the first
// difference.
void check_matches(const std::string& path, const json& meta,
                   const std::vector<std::pair<std::string, torch::Tensor>>& named, const ShardedOptimizer& opt) {
  auto misfit = [&](const std::string& why) {
    return UsageError(fmt::format("checkpoint {} does not fit this model: {}", path, why));
  };
  const auto& params = meta.at("params");
  for (size_t i = 0; i < std::min(params.size(), named.size()); ++i) {
    const auto& [name, p] = named[i];
    const auto ck_name = params[i].at("name").get<std::string>();
    if (ck_name != name)
      throw misfit(fmt::format("parameter {} is '{}' in the checkpoint but '{}' in the model", i, ck_name, name));
    const auto shape = params[i].at("shape").get<std::vector<int64_t>>();
    if (shape != p.sizes().vec())
      throw misfit(fmt::format("parameter '{}' has shape {} in the checkpoint but {} in the model", name,
                               shape_text(shape), shape_text(p.sizes())));
    const auto dtype = params[i].at("dtype").get<std::string>();
    if (dtype != c10::toString(p.scalar_type()))
      throw misfit(fmt::format("parameter '{}' is {} in the checkpoint but {} in the model", name, dtype,
                               c10::toString(p.scalar_type())));
  }
  if (params.size() != named.size())
    throw misfit(fmt::format("it has {} parameters, the model {}", params.size(), named.size()));
  const auto kind = meta.at("optimizer").get<std::string>();
  if (kind != opt.kind())
    throw UsageError(fmt::format("checkpoint {} holds {} state but the optimizer is {}", path, kind, opt.kind()));
  const size_t groups = meta.at("groups").size();
  if (groups != opt.param_groups().size())
    throw UsageError(
        fmt::format("checkpoint {} has {} parameter groups but the optimizer has {} (add the same "
                    "groups before loading)",
                    path, groups, opt.param_groups().size()));
  for (size_t i = 0; i < named.size(); ++i) {
    const int ck_group = params[i].at("group").get<int>(), group = opt.group_of(named[i].second);
    if (ck_group != group)
      throw UsageError(
          fmt::format("checkpoint {}: parameter '{}' is in optimizer group {} in the checkpoint but in "
                      "group {} here (-1: not in the optimizer)",
                      path, named[i].first, ck_group, group));
  }
}

}  // namespace

// [save]
void save_checkpoint(const std::string& path, ProcessGroup& pg, torch::nn::Module& module, ShardedOptimizer& opt) {
  const auto named = unique_named_parameters(module);
  const size_t n = named.size();
  {
    std::unordered_set<const void*> in_model;
    for (const auto& np : named) in_model.insert(np.second.unsafeGetTensorImpl());
    for (const auto& p : opt.parameters())
      if (!in_model.count(p.unsafeGetTensorImpl()))
        throw UsageError("save_checkpoint: the optimizer holds a tensor that is not a parameter of the module");
  }
  // 1. Which parameters have state, and their step counts: each owner fills in its own entries.
  std::vector<double> mine(3 * n, 0.0);  // per parameter: has state, step, has max_exp_avg_sq
  std::vector<ParamState> local(n);
  for (size_t i = 0; i < n; ++i) {
    if (!opt.owns(named[i].second)) continue;
    local[i] = get_param_state(opt.local(), named[i].second);
    mine[3 * i] = local[i].present ? 1 : 0;
    mine[3 * i + 1] = static_cast<double>(local[i].step);
    mine[3 * i + 2] = static_cast<double>(local[i].tensors.count("max_exp_avg_sq"));
  }
  const auto flags = pg.all_gather(mine);

  // 2. Every state tensor travels from its owner to rank 0 (a broadcast: Gloo on LibTorch 1.13 has no
  //    gather into one rank), one tensor at a time so no rank ever holds more than one extra tensor.
  const bool root = pg.rank() == 0;
  torch::serialize::OutputArchive archive;
  json meta = {{"format", "dp sharded-optimizer checkpoint"},
               {"world_size", pg.world_size()},
               {"optimizer", opt.kind()},
               {"params", json::array()},
               {"groups", json::array()}};
  for (size_t i = 0; i < n; ++i) {
    const auto& [name, p] = named[i];
    const int owner = opt.owner_of(p);
    json e = {{"name", name},
              {"shape", p.sizes().vec()},
              {"dtype", c10::toString(p.scalar_type())},
              {"group", opt.group_of(p)},
              {"owner_at_save", owner},
              {"state", nullptr}};
    if (owner >= 0 && flags[owner][3 * i] == 1) {
      const auto names = state_tensor_names(opt.kind(), flags[owner][3 * i + 2] == 1);
      for (const auto& tn : names) {
        torch::Tensor t = pg.rank() == owner ? local[i].tensors.at(tn).detach() : torch::empty_like(p.detach());
        pg.broadcast(t, owner);
        if (root) archive.write(fmt::format("p{}_{}", i, tn), t.cpu());
      }
      e["state"] = {{"step", static_cast<int64_t>(flags[owner][3 * i + 1])}, {"tensors", names}};
    }
    if (root) archive.write(fmt::format("p{}_value", i), p.detach().cpu());
    meta["params"].push_back(e);
  }
  for (const auto& g : opt.param_groups())
    meta["groups"].push_back({{"options", options_json(g.options())}, {"tensors", g.params().size()}});

  // 3. Rank 0 writes (common/state/checkpoint_file.hpp: header, checksum, temporary file and rename); every
  //    rank learns whether it worked, so all of them go on or all of them stop with the same error. The
  //    others keep the group alive meanwhile (run_on_root()): a slow disk fails no peer at --timeout.
  const std::string error = run_on_root(pg, 0, [&] {
    std::string payload;
    archive.save_to([&](const void* data, size_t size) {
      payload.append(static_cast<const char*>(data), size);
      return size;
    });
    write_checkpoint_file(path, kFormat, meta.dump(), payload);
  });
  if (!error.empty()) throw UsageError(error);
}
// [save]

CheckpointInfo read_checkpoint_info(const std::string& path) { return read_and_check(path).info; }

// [load]
CheckpointInfo load_checkpoint(const std::string& path, ProcessGroup& pg, torch::nn::Module& module,
                               ShardedOptimizer& opt) {
  const auto named = unique_named_parameters(module);
  const size_t n = named.size();
  // 1. Read and check everything first; nothing is changed until every rank succeeded.
  std::string error;
  Checked c;
  std::vector<torch::Tensor> values(n);
  std::vector<ParamState> states(n);  // only for the parameters this rank owns now
  try {
    c = read_and_check(path);
    check_matches(path, c.meta, named, opt);
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(c.file.payload(), c.file.payload_size);
      for (size_t i = 0; i < n; ++i) {
        archive.read(fmt::format("p{}_value", i), values[i]);
        const auto& st = c.meta["params"][i].at("state");
        if (st.is_null() || !opt.owns(named[i].second)) continue;  // only the state of what this rank owns
        states[i].present = true;
        states[i].step = st.at("step").get<int64_t>();
        for (const auto& tn : st.at("tensors")) {
          torch::Tensor t;
          archive.read(fmt::format("p{}_{}", i, tn.get<std::string>()), t);
          if (!t.sizes().equals(named[i].second.sizes()))
            throw UsageError(fmt::format("checkpoint {} is damaged: state tensor {} of '{}' has the wrong shape", path,
                                         tn.get<std::string>(), named[i].first));
          // A copy of its own: a tensor read from the archive may alias the archive's buffer.
          states[i].tensors[tn.get<std::string>()] =
              t.to(named[i].second.device(), t.scalar_type(), /*non_blocking=*/false, /*copy=*/true).contiguous();
        }
      }
    } catch (const c10::Error& e) {
      throw UsageError(
          fmt::format("checkpoint {} is damaged: unreadable tensor payload ({})", path, e.what_without_backtrace()));
    } catch (const json::exception& e) {
      throw UsageError(fmt::format("checkpoint {} is damaged: unreadable metadata ({})", path, e.what()));
    }
  } catch (const UsageError& e) {
    error = e.what();
  }
  const int failed = pg.first_rank_with(!error.empty());
  if (!error.empty()) throw UsageError(error);
  if (failed >= 0)
    throw UsageError(fmt::format("rank {} could not load checkpoint {} (its error says why)", failed, path));

  // 2. Install: every parameter, the state this rank owns (any world size), each group's learning rate.
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < n; ++i) named[i].second.copy_(values[i]);
  }
  for (size_t i = 0; i < n; ++i)
    if (opt.owns(named[i].second)) set_param_state(opt.local(), opt.kind(), named[i].second, std::move(states[i]));
  const auto& groups = c.meta.at("groups");
  for (size_t g = 0; g < groups.size(); ++g) opt.set_lr(g, groups[g].at("options").at("lr").get<double>());
  return c.info;
}
// [load]

}  // namespace dp
