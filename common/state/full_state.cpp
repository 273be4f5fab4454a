#include "common/state/full_state.hpp"

#include "common/base/errors.hpp"
#include "common/state/checkpoint_file.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace dp {

namespace optim = torch::optim;

std::vector<ParamState> local_states(const optim::Optimizer& opt, const std::vector<torch::Tensor>& params, bool copy) {
  std::vector<ParamState> out;
  for (const auto& p : params) {
    ParamState s = get_param_state(opt, p);
    for (auto& [name, t] : s.tensors) t = copy ? t.detach().clone() : t.detach();
    out.push_back(std::move(s));
  }
  return out;
}

void set_local_states(optim::Optimizer& opt, const std::vector<torch::Tensor>& params,
                      const std::vector<ParamState>& states) {
  if (params.size() != states.size())
    throw std::invalid_argument(fmt::format("a state of {} parameters given to {}", states.size(), params.size()));
  const std::string kind = optimizer_kind(opt);
  for (size_t i = 0; i < params.size(); ++i) {
    ParamState s = states[i];
    for (auto& [name, t] : s.tensors) {
      if (t.sizes() != params[i].sizes())
        throw std::invalid_argument(fmt::format("state tensor {} of parameter {} has shape {}, the parameter {}", name,
                                                i, fmt::join(t.sizes(), "x"), fmt::join(params[i].sizes(), "x")));
      t = t.detach().clone().to(params[i].device());
    }
    set_param_state(opt, kind, params[i], std::move(s));
  }
}

// The owner sends a header [present, step], the names of its state tensors ('\n'-separated, with
// broadcast_text()), then each tensor.
ParamState broadcast_param_state(ProcessGroup& pg, int owner, const ParamState& mine, const torch::Tensor& p) {
  const bool me = pg.rank() == owner;
  std::string names;
  if (me)
    for (const auto& [name, t] : mine.tensors) {
      if (t.sizes() != p.sizes())
        throw std::invalid_argument(fmt::format("optimizer state {} is not shaped like its parameter", name));
      names += name + "\n";
    }
  auto header = torch::tensor({me && mine.present ? int64_t{1} : 0, me ? mine.step : 0}, torch::kInt64).to(pg.device());
  pg.broadcast(header, owner);
  header = header.cpu();
  ParamState out;
  out.present = header[0].item<int64_t>() != 0;
  out.step = header[1].item<int64_t>();
  std::istringstream keys(broadcast_text(pg, names, owner));
  for (std::string k; std::getline(keys, k);) {
    torch::Tensor t = me ? mine.tensors.at(k).detach().clone().contiguous() : torch::empty_like(p.detach());
    pg.broadcast(t, owner);
    out.tensors[k] = t;
  }
  return out;
}

std::vector<ParamState> map_states(const std::vector<ParamState>& in, size_t n_out, const TensorsMap& f) {
  const ParamState first = in.empty() ? ParamState{} : in[0];
  std::vector<ParamState> out(n_out);
  for (auto& st : out) {
    st.present = first.present;
    st.step = first.step;
  }
  if (!first.present) return out;
  for (const auto& [name, t0] : first.tensors) {
    std::vector<torch::Tensor> v;
    for (const auto& st : in) v.push_back(st.tensors.at(name));
    const auto mapped = f(v);
    if (mapped.size() != n_out)
      throw std::logic_error(fmt::format("map_states: {} tensors for {} states", mapped.size(), n_out));
    for (size_t i = 0; i < n_out; ++i) out[i].tensors[name] = mapped[i];
  }
  return out;
}

std::vector<ParamState> gather_chunk_state(ProcessGroup& pg, const optim::Optimizer& opt, const torch::Tensor& chunk,
                                           const FlatLayout& L, const std::vector<torch::Tensor>& params) {
  // Every rank's chunk has a state after the first step (a chunk is never empty: padded >= world), so
  // every rank holds the same names and step, and each state tensor can be all-gathered.
  return map_states({get_param_state(opt, chunk)}, params.size(),
                    [&](const std::vector<torch::Tensor>& mine) { return gather_flat_chunks(pg, mine[0], L, params); });
}

void set_chunk_state(optim::Optimizer& opt, const torch::Tensor& chunk, const FlatLayout& L, int rank,
                     const std::vector<ParamState>& states) {
  auto mine = map_states(states, 1, [&](const std::vector<torch::Tensor>& per_param) {
    return std::vector<torch::Tensor>{flat_chunk(per_param, L, rank, chunk.options())};
  });
  set_param_state(opt, optimizer_kind(opt), chunk, std::move(mine[0]));
}

std::vector<ParamState> permute_states(const std::vector<torch::Tensor>& held, const std::vector<torch::Tensor>& wanted,
                                       const std::vector<ParamState>& states) {
  std::unordered_map<const void*, size_t> index;
  for (size_t i = 0; i < held.size(); ++i) index[held[i].unsafeGetTensorImpl()] = i;
  std::vector<ParamState> out;
  for (const auto& w : wanted) {
    auto it = index.find(w.unsafeGetTensorImpl());
    if (it == index.end()) throw std::invalid_argument("permute_states: a parameter the scheme does not hold");
    out.push_back(states.at(it->second));
  }
  return out;
}

std::vector<torch::Tensor> ShardedParams::pieces() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups) out.push_back(g.chunk);
  out.insert(out.end(), replicated.begin(), replicated.end());
  return out;
}

std::vector<torch::Tensor> ShardedParams::gather(ProcessGroup& pg, const std::vector<torch::Tensor>& pieces) const {
  torch::NoGradGuard no_grad;
  if (pieces.size() != groups.size() + replicated.size())
    throw std::invalid_argument(fmt::format("ShardedParams::gather: {} tensors for {} pieces", pieces.size(),
                                            groups.size() + replicated.size()));
  std::unordered_map<const void*, torch::Tensor> full;  // by the model's tensor
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto whole = gather_flat_chunks(pg, pieces[g].to(torch::kFloat32), groups[g].layout, groups[g].tensors);
    for (size_t i = 0; i < whole.size(); ++i) full[groups[g].tensors[i].unsafeGetTensorImpl()] = whole[i];
  }
  for (size_t k = 0; k < replicated.size(); ++k)
    full[replicated[k].unsafeGetTensorImpl()] = pieces[groups.size() + k].detach().to(torch::kFloat32).clone();
  std::vector<torch::Tensor> out;
  for (const auto& [name, p] : named) out.push_back(full.at(p.unsafeGetTensorImpl()));
  return out;
}

std::vector<torch::Tensor> ShardedParams::cut(const std::vector<torch::Tensor>& full, int rank) const {
  torch::NoGradGuard no_grad;
  if (full.size() != named.size())
    throw std::invalid_argument(
        fmt::format("ShardedParams::cut: {} tensors for {} parameters", full.size(), named.size()));
  std::unordered_map<const void*, torch::Tensor> by_param;
  for (size_t i = 0; i < named.size(); ++i) by_param[named[i].second.unsafeGetTensorImpl()] = full[i];
  std::vector<torch::Tensor> out;
  for (const auto& g : groups) {
    std::vector<torch::Tensor> mine;
    for (const auto& p : g.tensors) mine.push_back(by_param.at(p.unsafeGetTensorImpl()));
    out.push_back(flat_chunk(mine, g.layout, rank, g.chunk.options()));
  }
  for (const auto& p : replicated) out.push_back(by_param.at(p.unsafeGetTensorImpl()).to(p.scalar_type()).clone());
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> ShardedParams::gather_named(ProcessGroup& pg) const {
  auto full = gather(pg, pieces());
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < named.size(); ++i) out.emplace_back(named[i].first, std::move(full[i]));
  return out;
}

FullState ShardedParams::full_state(ProcessGroup& pg, const optim::Optimizer& opt) const {
  FullState s;
  s.params = gather_named(pg);
  s.optimizer = map_states(local_states(opt, pieces()), s.params.size(),
                           [&](const std::vector<torch::Tensor>& v) { return gather(pg, v); });
  return s;
}

void ShardedParams::load_full_state(const FullState& s, int rank, optim::Optimizer& opt) const {
  std::vector<torch::Tensor> values;
  for (const auto& [name, p] : s.params) values.push_back(p);
  const auto held = pieces();
  const auto mine = cut(values, rank);
  const auto states =
      map_states(s.optimizer, held.size(), [&](const std::vector<torch::Tensor>& v) { return cut(v, rank); });
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < held.size(); ++i)
      held[i].copy_(mine[i]);  // a chunk (FSDP: gathered before each use) or a replicated tensor
  }
  set_local_states(opt, held, states);
}

static const FileFormat kStateFormat{"DPSTATE1", kStateFileVersion};

// [save_state_file]
void save_state_file(const std::string& path, ProcessGroup& pg, const nlohmann::json& meta, const FullState& state) {
  // Rank 0 serializes and writes while every rank keeps the group alive (run_on_root()): a file that takes
  // longer to write than --timeout fails no peer. All ranks then stop together, or none does.
  const std::string error = run_on_root(pg, 0, [&] {
    if (state.optimizer.size() != state.params.size())
      throw UsageError(fmt::format("cannot write checkpoint {}: {} parameters but {} optimizer states", path,
                                   state.params.size(), state.optimizer.size()));
    torch::serialize::OutputArchive archive;
    nlohmann::json params = nlohmann::json::array();
    for (size_t i = 0; i < state.params.size(); ++i) {
      const auto& [name, p] = state.params[i];
      const ParamState& st = state.optimizer[i];
      archive.write(fmt::format("p{}", i), p.detach().cpu());
      nlohmann::json tensors = nlohmann::json::array();
      for (const auto& [key, t] : st.tensors) {
        archive.write(fmt::format("s{}.{}", i, key), t.detach().cpu());
        tensors.push_back(key);
      }
      params.push_back({{"name", name},
                        {"shape", p.sizes().vec()},
                        {"state", {{"present", st.present}, {"step", st.step}, {"tensors", tensors}}}});
    }
    // JSON keys sort: "format", the caller's "meta", then "params": `head -c 4000 FILE` shows the meta.
    const nlohmann::json m = {{"meta", meta}, {"format", "dp training state"}, {"params", params}};
    // The serializer's output goes to the file as it comes, from the tensors themselves (a caller's
    // full_state_view()): stage 08 on `small` (DDP) saving a 1.36 GB file peaks at 2.81 GB resident, as
    // training does; into a string first it peaked at 5.5 GB (reserved up front; 6.5 GB grown by doubling).
    write_checkpoint_stream(path, kStateFormat, m.dump(), [&](const ByteSink& sink) {
      archive.save_to([&](const void* data, size_t size) {
        sink(static_cast<const char*>(data), size);
        return size;
      });
    });
  });
  if (!error.empty()) throw UsageError(error);
}
// [save_state_file]

StateFile load_state_file(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& like,
                          const std::function<void(const nlohmann::json& meta)>& check_meta) {
  const CheckpointFile file = read_checkpoint_file(path, kStateFormat);  // "cannot read" / "damaged"
  StateFile out;
  out.bytes = file.bytes.size();
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(file.meta());
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: its metadata is not JSON ({})", path, e.what()));
  }
  try {
    out.meta = m.at("meta");
    if (check_meta) check_meta(out.meta);  // what the run was (its configuration) before its shapes
    const auto& params = m.at("params");
    if (params.size() != like.size())
      throw UsageError(
          fmt::format("checkpoint {} holds {} parameters, the model has {}", path, params.size(), like.size()));
    torch::serialize::InputArchive archive;
    archive.load_from(file.payload(), file.payload_size);
    for (size_t i = 0; i < like.size(); ++i) {
      const auto& [name, model_p] = like[i];
      const auto& entry = params[i];
      const auto saved_name = entry.at("name").get<std::string>();
      const auto shape = entry.at("shape").get<std::vector<int64_t>>();
      if (saved_name != name || shape != model_p.sizes().vec())
        throw UsageError(
            fmt::format("checkpoint {}: parameter {} is {} [{}], the model's is {} [{}]: it was written "
                        "for another model",
                        path, i, saved_name, fmt::join(shape, "x"), name, fmt::join(model_p.sizes(), "x")));
      torch::Tensor p;
      archive.read(fmt::format("p{}", i), p);
      ParamState st;
      st.present = entry.at("state").at("present").get<bool>();
      st.step = entry.at("state").at("step").get<int64_t>();
      for (const auto& key : entry.at("state").at("tensors")) {
        torch::Tensor t;
        archive.read(fmt::format("s{}.{}", i, key.get<std::string>()), t);
        if (t.sizes().vec() != shape)
          throw UsageError(fmt::format("checkpoint {} is damaged: state {} of {} has shape [{}]", path,
                                       key.get<std::string>(), name, fmt::join(t.sizes(), "x")));
        st.tensors[key.get<std::string>()] = t.clone();  // a copy of its own: the archive's buffer goes away
      }
      if (!p.sizes().equals(model_p.sizes()))
        throw UsageError(
            fmt::format("checkpoint {} is damaged: tensor p{} has shape [{}]", path, i, fmt::join(p.sizes(), "x")));
      out.state.params.emplace_back(name, p.clone());
      out.state.optimizer.push_back(std::move(st));
    }
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: {}", path, e.what()));
  } catch (const c10::Error& e) {
    throw UsageError(
        fmt::format("checkpoint {} is damaged: unreadable tensors ({})", path, e.what_without_backtrace()));
  }
  return out;
}

}  // namespace dp
