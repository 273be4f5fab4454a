// Sharded checkpoints of FSDP: each rank writes what it holds, and reads back only what it will hold.
#include "extensions/07b_sharded_checkpoints/sharded_checkpoint.hpp"

#include "common/base/errors.hpp"
#include "common/model/params.hpp"
#include "common/state/checkpoint_file.hpp"
#include "common/state/optim_state.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <unordered_map>

namespace dp {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Named = std::vector<std::pair<std::string, torch::Tensor>>;

const FileFormat kShardFormat{"DPSHARD1", 1};
const FileFormat kMetaFormat{"DPSHMETA", 1};

std::string shard_file(const std::string& dir, size_t unit, int rank) {
  return (fs::path(dir) / fmt::format("u{}.r{}", unit, rank)).string();
}
std::string replicated_file(const std::string& dir) { return (fs::path(dir) / "replicated").string(); }
std::string metadata_file(const std::string& dir) { return (fs::path(dir) / "metadata").string(); }

json described(const std::string& name, const torch::Tensor& t) { return {{"name", name}, {"shape", t.sizes().vec()}}; }

// The model's name of each of its trainable tensors, by identity (tied weights once, as Fsdp holds them).
std::unordered_map<const void*, std::string> names_of(const torch::nn::Module& model) {
  std::unordered_map<const void*, std::string> names;
  for (const auto& [name, p] : unique_named_parameters(model, /*trainable_only=*/true))
    names[p.unsafeGetTensorImpl()] = name;
  return names;
}

// What the metadata says of the model: per unit its sharded tensors, then the replicated ones.
json model_layout(const torch::nn::Module& model, const Fsdp& fsdp) {
  const auto names = names_of(model);
  const ShardedParams held = fsdp.sharding();
  json units = json::array(), replicated = json::array();
  for (const auto& g : held.groups) {
    json tensors = json::array();
    for (const auto& p : g.tensors) tensors.push_back(described(names.at(p.unsafeGetTensorImpl()), p));
    units.push_back({{"numel", g.layout.numel}, {"tensors", tensors}});
  }
  for (const auto& p : held.replicated) replicated.push_back(described(names.at(p.unsafeGetTensorImpl()), p));
  return {{"units", units}, {"replicated", replicated}};
}

std::string serialized(const Named& tensors) {
  torch::serialize::OutputArchive archive;
  size_t bytes = 1 << 16;
  for (const auto& [key, t] : tensors) {
    archive.write(key, t.detach().cpu().contiguous());
    bytes += t.nbytes() + 4096;  // a record's name and alignment, generously
  }
  std::string out;
  out.reserve(bytes);  // grown by doubling, it would hold up to twice the shard while copying
  archive.save_to([&](const void* data, size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  return out;
}

// Every rank learns whether every rank succeeded; all throw the first failing rank's message.
void agree(ProcessGroup& pg, const std::string& error) {
  const auto failed = pg.all_gather(error.empty() ? 0.0 : 1.0);
  for (int k = 0; k < static_cast<int>(failed.size()); ++k)
    if (failed[k] != 0) {
      const std::string text = broadcast_text(pg, error, k);
      throw UsageError(k == pg.rank() ? text : fmt::format("rank {}: {}", k, text));
    }
}

// The metadata, read and checked.
struct Meta {
  json j;
  std::string id;
  int world = 0;
  ParamState state;  // presence, step and tensor names; the tensors are not here
  size_t bytes = 0;  // the metadata file's own size
};

Meta read_meta(const std::string& dir) {
  const std::string path = metadata_file(dir);
  if (!fs::exists(path))
    throw UsageError(
        fmt::format("{} holds no complete sharded checkpoint ({} is missing: no save, or one that did not "
                    "finish); give the folder a save wrote",
                    dir, path));
  const CheckpointFile file = read_checkpoint_file(path, kMetaFormat);  // "cannot read" / "damaged"
  Meta m;
  m.bytes = file.bytes.size();
  try {
    m.j = json::parse(file.meta());
    m.id = m.j.at("save_id").get<std::string>();
    m.world = m.j.at("world_size").get<int>();
    const auto& st = m.j.at("state");
    m.state.present = st.at("present").get<bool>();
    m.state.step = st.at("step").get<int64_t>();
    for (const auto& k : st.at("tensors")) m.state.tensors[k.get<std::string>()] = torch::Tensor();
    if (m.world < 1) throw UsageError(fmt::format("world size {}", m.world));
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: its metadata ({})", dir, e.what()));
  }
  return m;
}

// What the metadata says of the checkpoint (read_sharded_info()'s answer).
ShardedCheckpointInfo info_of(const std::string& dir, const Meta& m) {
  ShardedCheckpointInfo info;
  try {
    info.world_size = m.world;
    info.step = m.j.at("step").get<int64_t>();
    info.files = m.j.at("files").get<int64_t>() + 1;
    info.bytes = m.j.at("bytes").get<int64_t>() + static_cast<int64_t>(m.bytes);
    info.meta = m.j.at("meta");
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: its metadata ({})", dir, e.what()));
  }
  return info;
}

// The tensors of one file of save `m`: its container checked, then that it belongs to this save and is
// the file it claims to be (`expect`'s keys), then each tensor of `keys` with `elements` values.
std::map<std::string, torch::Tensor> read_piece(const std::string& path, const Meta& m, const json& expect,
                                                const std::vector<std::pair<std::string, int64_t>>& keys) {
  const CheckpointFile file = read_checkpoint_file(path, kShardFormat);
  std::map<std::string, torch::Tensor> out;
  try {
    const json meta = json::parse(file.meta());
    if (meta.at("save_id") != m.id)
      throw UsageError(
          fmt::format("{} belongs to another save (id {}, the metadata's is {}): a save into this folder "
                      "did not finish; resume from a folder whose save completed",
                      path, meta.at("save_id").get<std::string>(), m.id));
    for (const auto& [k, v] : expect.items())
      if (meta.at(k) != v)
        throw UsageError(fmt::format("{} is damaged: its {} is {}, not {}", path, k, meta.at(k).dump(), v.dump()));
    torch::serialize::InputArchive archive;
    archive.load_from(file.payload(), file.payload_size);
    for (const auto& [key, n] : keys) {
      torch::Tensor t;
      archive.read(key, t);
      if (t.numel() != n)
        throw UsageError(fmt::format("{} is damaged: {} has {} values, not {}", path, key, t.numel(), n));
      out[key] = t;
    }
  } catch (const UsageError&) {
    throw;
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{} is damaged: {}", path, e.what()));
  } catch (const c10::Error& e) {
    throw UsageError(fmt::format("{} is damaged: unreadable tensors ({})", path, e.what_without_backtrace()));
  }
  return out;
}

// "values" and "state.<name>" for each state tensor, with n values each.
std::vector<std::pair<std::string, int64_t>> piece_keys(const Meta& m, const std::string& prefix, int64_t n) {
  std::vector<std::pair<std::string, int64_t>> keys{{prefix + "values", n}};
  for (const auto& [name, unused] : m.state.tensors) keys.emplace_back(prefix + "state." + name, n);
  return keys;
}

// The checkpoint was written for this model: the same units holding the same tensors, and the same
// replicated tensors. Throws naming the first difference.
void check_layout(const std::string& dir, const Meta& m, const json& mine) {
  const json& saved = m.j;
  const auto differs = [&](const std::string& what, const json& a, const json& b) {
    throw UsageError(
        fmt::format("checkpoint {} was written for another model: {} is {} in it, {} here; load it into "
                    "the model it was saved from",
                    dir, what, a.dump(), b.dump()));
  };
  if (saved.at("units").size() != mine.at("units").size())
    differs("the number of units", saved.at("units").size(), mine.at("units").size());
  for (size_t u = 0; u < mine.at("units").size(); ++u)
    if (saved.at("units")[u].at("tensors") != mine.at("units")[u].at("tensors"))
      differs(fmt::format("unit {}", u), saved.at("units")[u].at("tensors"), mine.at("units")[u].at("tensors"));
  if (saved.at("replicated") != mine.at("replicated"))
    differs("the replicated tensors", saved.at("replicated"), mine.at("replicated"));
}

}  // namespace

ShardedCheckpointInfo save_sharded_checkpoint(const std::string& dir, ProcessGroup& pg, const torch::nn::Module& model,
                                              const Fsdp& fsdp, const torch::optim::Optimizer& opt, int64_t step,
                                              const json& caller_meta) {
  const int W = pg.world_size(), r = pg.rank();
  const ShardedParams held = fsdp.sharding();
  const auto pieces = held.pieces();  // each unit's fp32 chunk, then the replicated tensors
  std::vector<ParamState> states;     // the optimizer's own tensors, not copies: a save adds one file's bytes at most
  for (const auto& p : pieces) states.push_back(get_param_state(opt, p));
  // One id for this save, in every file: a load refuses files of two saves mixed.
  std::random_device rd;
  const std::string id = broadcast_text(pg, r == 0 ? fmt::format("{:08x}{:08x}", rd(), rd()) : "", 0);
  ShardedCheckpointInfo info;
  info.world_size = W;
  info.step = step;
  std::string error;
  int64_t written = 0;
  const auto write = [&](const std::string& path, const json& meta, const Named& tensors) {
    const std::string payload = serialized(tensors);
    write_checkpoint_file(path, kShardFormat, meta.dump(), payload);  // atomic: PATH.tmp, fsync, rename
    written += static_cast<int64_t>(fs::file_size(path));
    ++info.files_touched;
    info.largest_held = std::max(info.largest_held, static_cast<int64_t>(payload.size()));
  };
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw UsageError(fmt::format("cannot create checkpoint folder {}: {}", dir, ec.message()));
    for (const auto& s : states)  // one optimizer over pieces that step together: one kind of state
      if (s.present != states[0].present || s.step != states[0].step || s.tensors.size() != states[0].tensors.size())
        throw std::invalid_argument("save_sharded_checkpoint: the pieces' optimizer states differ in kind or step");
    // [write_chunks]
    // Each unit's chunk without its padding: n = the data part of this rank's chunk (0 for an all-padding one).
    for (size_t u = 0; u < fsdp.unit_count(); ++u) {
      const int64_t n = held.groups[u].layout.data_in(r);
      Named tensors{{"values", pieces[u].narrow(0, 0, n)}};
      for (const auto& [name, t] : states[u].tensors) tensors.emplace_back("state." + name, t.narrow(0, 0, n));
      write(shard_file(dir, u, r), {{"save_id", id}, {"unit", u}, {"rank", r}, {"elements", n}}, tensors);
    }
    // [write_chunks]
    if (r == 0) {  // the replicated tensors are the same on every rank: one copy
      Named tensors;
      for (size_t i = fsdp.unit_count(), k = 0; i < pieces.size(); ++i, ++k) {
        tensors.emplace_back(fmt::format("r{}.values", k), pieces[i]);
        for (const auto& [name, t] : states[i].tensors) tensors.emplace_back(fmt::format("r{}.state.{}", k, name), t);
      }
      write(replicated_file(dir), {{"save_id", id}, {"unit", "replicated"}, {"rank", 0}}, tensors);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(pg, error);  // every rank's files are on disk, or every rank throws
  // The metadata last: a folder without it holds no complete checkpoint.
  const auto bytes = pg.all_gather(static_cast<double>(written));
  const auto files = pg.all_gather(static_cast<double>(info.files_touched));
  error.clear();
  if (r == 0) try {
      json meta = model_layout(model, fsdp);
      const ParamState& s0 = states.at(0);
      json names = json::array();
      for (const auto& [name, t] : s0.tensors) names.push_back(name);
      meta.update({{"format", "dp sharded checkpoint (FSDP)"},
                   {"save_id", id},
                   {"world_size", W},
                   {"step", step},
                   {"meta", caller_meta},
                   {"optimizer", optimizer_kind(opt)},
                   {"state", {{"present", s0.present}, {"step", s0.step}, {"tensors", names}}}});
      for (int k = 0; k < W; ++k) {
        info.bytes += static_cast<int64_t>(bytes[k]);
        info.files += static_cast<int64_t>(files[k]);
      }
      meta.update({{"files", info.files}, {"bytes", info.bytes}});
      write_checkpoint_file(metadata_file(dir), kMetaFormat, meta.dump(1), "");
      ++info.files_touched;
      // Chunks an earlier save by more ranks (or of a model with more units) left here belong to no checkpoint now.
      const std::regex chunk(R"(u(\d+)\.r(\d+))");
      for (const auto& entry : fs::directory_iterator(dir)) {
        std::smatch m;
        const std::string name = entry.path().filename().string();
        if (std::regex_match(name, m, chunk) && (std::stoul(m[1]) >= fsdp.unit_count() || std::stoi(m[2]) >= W))
          fs::remove(entry.path());
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  agree(pg, error);
  const auto done = read_sharded_info(dir);  // every rank: the totals, metadata included
  info.files = done.files;
  info.bytes = done.bytes;
  return info;
}

ShardedCheckpointInfo read_sharded_info(const std::string& dir) { return info_of(dir, read_meta(dir)); }

ShardedCheckpointInfo load_sharded_checkpoint(const std::string& dir, ProcessGroup& pg, const torch::nn::Module& model,
                                              Fsdp& fsdp, torch::optim::Optimizer& opt) {
  const int r = pg.rank();
  const ShardedParams held = fsdp.sharding();
  const auto pieces = held.pieces();
  std::vector<torch::Tensor> values;  // what each piece will hold, read in full before anything changes
  std::vector<ParamState> states;
  ShardedCheckpointInfo info;
  std::string error;
  try {
    const Meta m = read_meta(dir);
    info = info_of(dir, m);
    info.files_touched = 1;
    info.largest_held = static_cast<int64_t>(m.bytes);
    check_layout(dir, m, model_layout(model, fsdp));
    if (m.j.at("optimizer") != optimizer_kind(opt))
      throw UsageError(fmt::format("checkpoint {} holds {} state, the optimizer is {}", dir,
                                   m.j.at("optimizer").get<std::string>(), optimizer_kind(opt)));
    const auto read = [&](const std::string& path, const json& expect,
                          const std::vector<std::pair<std::string, int64_t>>& keys) {
      ++info.files_touched;
      info.largest_held = std::max(info.largest_held, static_cast<int64_t>(fs::file_size(path)));
      return read_piece(path, m, expect, keys);
    };
    // [read_overlaps]
    // Unit u's values are the same sequence at any world size: this rank wants [b, e) of them, and saved
    // rank s wrote [os, oe). Copy every overlap; the padding past the data stays zero.
    for (size_t u = 0; u < fsdp.unit_count(); ++u) {
      const FlatLayout& now = held.groups[u].layout;
      const FlatLayout then = FlatLayout::of(now.numel, m.world);
      const int64_t b = now.offset(r), e = b + now.data_in(r);
      ParamState st = m.state;
      for (auto& [name, t] : st.tensors) t = torch::zeros({now.chunk}, pieces[u].options());
      torch::Tensor v = torch::zeros({now.chunk}, pieces[u].options());
      for (int s = 0; s < m.world; ++s) {
        const int64_t os = then.offset(s), oe = os + then.data_in(s), lo = std::max(b, os), hi = std::min(e, oe);
        if (lo >= hi) continue;  // nothing of what this rank needs
        auto got =
            read(shard_file(dir, u, s), {{"unit", u}, {"rank", s}, {"elements", oe - os}}, piece_keys(m, "", oe - os));
        v.narrow(0, lo - b, hi - lo).copy_(got.at("values").narrow(0, lo - os, hi - lo));
        for (auto& [name, t] : st.tensors)
          t.narrow(0, lo - b, hi - lo).copy_(got.at("state." + name).narrow(0, lo - os, hi - lo));
      }
      values.push_back(v);
      states.push_back(std::move(st));
    }
    // [read_overlaps]
    const size_t replicated = pieces.size() - fsdp.unit_count();
    if (replicated > 0) {
      std::vector<std::pair<std::string, int64_t>> keys;
      for (size_t k = 0; k < replicated; ++k)
        for (const auto& key : piece_keys(m, fmt::format("r{}.", k), pieces[fsdp.unit_count() + k].numel()))
          keys.push_back(key);
      auto got = read(replicated_file(dir), {{"unit", "replicated"}}, keys);
      for (size_t k = 0; k < replicated; ++k) {
        const auto& p = pieces[fsdp.unit_count() + k];
        values.push_back(got.at(fmt::format("r{}.values", k)).to(p.options()).view(p.sizes()));
        ParamState st = m.state;
        for (auto& [name, t] : st.tensors)
          t = got.at(fmt::format("r{}.state.{}", k, name)).to(p.options()).view(p.sizes());
        states.push_back(std::move(st));
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(pg, error);  // every rank read all it needs, or nothing changes anywhere
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < pieces.size(); ++i) pieces[i].copy_(values[i]);
  }
  set_local_states(opt, pieces, states);
  return info;
}

FullState gathered_state(ProcessGroup& pg, const Fsdp& fsdp, const torch::optim::Optimizer& opt) {
  return fsdp.sharding().full_state(pg, opt);
}

std::string first_difference(const FullState& a, const FullState& b) {
  for (size_t i = 0; i < a.params.size(); ++i) {
    const auto& name = a.params[i].first;
    // On the host: a state gathered on the GPU against one read from files.
    if (!torch::equal(a.params[i].second.cpu(), b.params.at(i).second.cpu())) return name;
    if (a.optimizer[i].step != b.optimizer.at(i).step) return name + "'s step";
    for (const auto& [key, t] : a.optimizer[i].tensors)
      if (!torch::equal(t.cpu(), b.optimizer.at(i).tensors.at(key).cpu())) return name + "'s " + key;
  }
  return "";
}

FullState consolidate_sharded_checkpoint(const std::string& dir, const Named& like) {
  const Meta m = read_meta(dir);
  std::map<std::string, torch::Tensor> params;                        // by name
  std::map<std::string, std::map<std::string, torch::Tensor>> state;  // by name, then state tensor
  try {
    const auto& units = m.j.at("units");
    for (size_t u = 0; u < units.size(); ++u) {
      const int64_t numel = units[u].at("numel").get<int64_t>();
      const FlatLayout L = FlatLayout::of(numel, m.world);
      std::map<std::string, std::vector<torch::Tensor>> parts;  // "values" and "state.<name>", rank by rank
      for (int s = 0; s < m.world; ++s)
        for (auto& [key, t] :
             read_piece(shard_file(dir, u, s), m, {{"unit", u}, {"rank", s}, {"elements", L.data_in(s)}},
                        piece_keys(m, "", L.data_in(s))))
          parts[key].push_back(t);
      std::map<std::string, torch::Tensor> flat;  // each key's chunks joined once: the unit's values, padding left out
      for (const auto& [key, list] : parts) flat[key] = torch::cat(list);
      int64_t at = 0;
      for (const auto& t : units[u].at("tensors")) {
        const auto name = t.at("name").get<std::string>();
        const auto shape = t.at("shape").get<std::vector<int64_t>>();
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        for (const auto& [key, all] : flat) {
          auto whole = all.narrow(0, at, n).view(shape).clone();
          if (key == "values")
            params[name] = whole;
          else
            state[name][key.substr(6)] = whole;  // "state.<name>"
        }
        at += n;
      }
      if (at != numel) throw UsageError(fmt::format("unit {} holds {} values, its tensors {}", u, numel, at));
    }
    const auto& replicated = m.j.at("replicated");
    if (!replicated.empty()) {
      std::vector<std::pair<std::string, int64_t>> keys;
      for (size_t k = 0; k < replicated.size(); ++k) {
        int64_t n = 1;
        for (int64_t d : replicated[k].at("shape").get<std::vector<int64_t>>()) n *= d;
        for (const auto& key : piece_keys(m, fmt::format("r{}.", k), n)) keys.push_back(key);
      }
      auto got = read_piece(replicated_file(dir), m, {{"unit", "replicated"}}, keys);
      for (size_t k = 0; k < replicated.size(); ++k) {
        const auto name = replicated[k].at("name").get<std::string>();
        const auto shape = replicated[k].at("shape").get<std::vector<int64_t>>();
        params[name] = got.at(fmt::format("r{}.values", k)).view(shape);
        for (const auto& [sname, unused] : m.state.tensors)
          state[name][sname] = got.at(fmt::format("r{}.state.{}", k, sname)).view(shape);
      }
    }
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("checkpoint {} is damaged: its metadata ({})", dir, e.what()));
  }
  FullState out;
  for (const auto& [name, p] : like) {
    auto it = params.find(name);
    if (it == params.end() || !it->second.sizes().equals(p.sizes()))
      throw UsageError(fmt::format("checkpoint {} was written for another model: {} [{}] is {}", dir, name,
                                   fmt::join(p.sizes(), "x"),
                                   it == params.end() ? "not in it" : "another shape there"));
    out.params.emplace_back(name, it->second);
    ParamState st = m.state;
    for (auto& [sname, t] : st.tensors) t = state[name].at(sname);
    out.optimizer.push_back(std::move(st));
  }
  if (params.size() != like.size())
    throw UsageError(
        fmt::format("checkpoint {} holds {} parameters, the model has {}", dir, params.size(), like.size()));
  return out;
}

}  // namespace dp
