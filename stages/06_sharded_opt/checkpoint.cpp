// Sharded-optimizer checkpoints: gather to rank 0, write through a temporary file, validate before loading.
#include "stages/06_sharded_opt/checkpoint.hpp"

#include "common/models.hpp"
#include "common/runtime.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_set>

namespace dp {

namespace optim = torch::optim;
using nlohmann::json;

namespace {

constexpr char kMagic[8] = {'D', 'P', 'Z', '1', 'C', 'K', 'P', 'T'};
constexpr size_t kHeaderBytes = 36;  // magic 8 + version 4 + meta size 8 + payload size 8 + hash 8

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The state tensors of one parameter, as torch::optim keeps them (keyed by the TensorImpl's address).
struct ParamState {
  bool present = false;
  int64_t step = 0;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};

std::string state_key(const torch::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

// Names of the state tensors an optimizer kind keeps (max_exp_avg_sq only with amsgrad).
std::vector<std::string> state_names(const std::string& kind, bool amsgrad) {
  if (kind == "sgd") return {"momentum_buffer"};
  std::vector<std::string> n{"exp_avg", "exp_avg_sq"};
  if (amsgrad) n.push_back("max_exp_avg_sq");
  return n;
}

template <typename AdamState>
ParamState adam_like(const AdamState& s) {
  ParamState out{true, s.step(), {{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}}};
  if (s.max_exp_avg_sq().defined()) out.tensors.emplace_back("max_exp_avg_sq", s.max_exp_avg_sq());
  return out;
}

ParamState get_state(const optim::Optimizer& opt, const torch::Tensor& p) {
  auto it = opt.state().find(state_key(p));
  if (it == opt.state().end()) return {};
  const auto* st = it->second.get();
  if (auto* a = dynamic_cast<const optim::AdamWParamState*>(st)) return adam_like(*a);
  if (auto* b = dynamic_cast<const optim::AdamParamState*>(st)) return adam_like(*b);
  if (auto* c = dynamic_cast<const optim::SGDParamState*>(st)) {
    if (!c->momentum_buffer().defined()) return {};
    return {true, 0, {{"momentum_buffer", c->momentum_buffer()}}};
  }
  throw UsageError("checkpoint: the optimizer keeps a kind of state this format does not know");
}

template <typename AdamState>
std::unique_ptr<optim::OptimizerParamState> make_adam_like(int64_t step, std::map<std::string, torch::Tensor>& t) {
  auto s = std::make_unique<AdamState>();
  s->step(step);
  s->exp_avg(t.at("exp_avg"));
  s->exp_avg_sq(t.at("exp_avg_sq"));
  if (t.count("max_exp_avg_sq")) s->max_exp_avg_sq(t.at("max_exp_avg_sq"));
  return s;
}

void set_state(optim::Optimizer& opt, const std::string& kind, const torch::Tensor& p, bool present, int64_t step,
               std::map<std::string, torch::Tensor> tensors) {
  auto& state = opt.state();
  const std::string key = state_key(p);
  if (!present) {
    state.erase(key);
    return;
  }
  if (kind == "adamw") {
    state[key] = make_adam_like<optim::AdamWParamState>(step, tensors);
  } else if (kind == "adam") {
    state[key] = make_adam_like<optim::AdamParamState>(step, tensors);
  } else {
    auto s = std::make_unique<optim::SGDParamState>();
    s->momentum_buffer(tensors.at("momentum_buffer"));
    state[key] = std::move(s);
  }
}

// A group's options, for the record (load restores the learning rate only).
json options_json(const optim::OptimizerOptions& o) {
  if (auto* a = dynamic_cast<const optim::AdamWOptions*>(&o))
    return {{"lr", a->lr()}, {"betas", {std::get<0>(a->betas()), std::get<1>(a->betas())}}, {"eps", a->eps()},
            {"weight_decay", a->weight_decay()}, {"amsgrad", a->amsgrad()}};
  if (auto* b = dynamic_cast<const optim::AdamOptions*>(&o))
    return {{"lr", b->lr()}, {"betas", {std::get<0>(b->betas()), std::get<1>(b->betas())}}, {"eps", b->eps()},
            {"weight_decay", b->weight_decay()}, {"amsgrad", b->amsgrad()}};
  if (auto* c = dynamic_cast<const optim::SGDOptions*>(&o))
    return {{"lr", c->lr()}, {"momentum", c->momentum()}, {"dampening", c->dampening()},
            {"weight_decay", c->weight_decay()}, {"nesterov", c->nesterov()}};
  return {{"lr", o.get_lr()}};
}

std::string errno_text() { return std::strerror(errno); }

// Sends `text` from `root` to every rank (its length first, then its bytes); returns root's text.
std::string broadcast_text(ProcessGroup& pg, const std::string& text, int root) {
  auto length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kInt64).to(pg.device());
  pg.broadcast(length, root);
  const int64_t n = length.item<int64_t>();
  if (n == 0) return {};
  auto bytes = torch::empty({n}, torch::kUInt8);
  if (pg.rank() == root) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), static_cast<size_t>(n));
  bytes = bytes.to(pg.device());
  pg.broadcast(bytes, root);
  bytes = bytes.cpu();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

void write_all(int fd, const char* data, size_t n, const std::string& file) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw UsageError(fmt::format("cannot write checkpoint {}: {}", file, errno_text()));
    data += w;
    n -= static_cast<size_t>(w);
  }
}

// [atomic_write]
// PATH is replaced in one step (rename is atomic within a file system): a crash or a full disk leaves
// either the old checkpoint or the new one, never half of one.
void write_atomically(const std::string& path, const std::vector<const std::string*>& parts) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UsageError(fmt::format("cannot write checkpoint {}: cannot create {}: {}", path, tmp, errno_text()));
  try {
    for (const auto* part : parts) write_all(fd, part->data(), part->size(), tmp);
    if (::fsync(fd) != 0) throw UsageError(fmt::format("cannot write checkpoint {}: fsync: {}", tmp, errno_text()));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw UsageError(fmt::format("cannot write checkpoint {}: close: {}", tmp, errno_text()));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw UsageError(fmt::format("cannot write checkpoint {}: rename from {}: {}", path, tmp, why));
  }
  // The rename lives in the directory: sync it too, so the new name survives a power cut.
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}
// [atomic_write]

// A checkpoint file that passed the byte-level checks.
struct Checked {
  json meta;
  std::string bytes;  // the whole file
  size_t payload_offset = 0, payload_size = 0;
  CheckpointInfo info;
};

Checked read_and_check(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("cannot read checkpoint {}: {}", path, errno_text()));
  Checked c;
  std::ostringstream ss;
  ss << in.rdbuf();
  c.bytes = ss.str();
  const std::string& b = c.bytes;
  const std::string damaged = fmt::format("checkpoint {} is damaged", path);
  if (b.size() < kHeaderBytes)
    throw UsageError(fmt::format("{}: {} bytes, shorter than the {}-byte header (truncated?)", damaged, b.size(),
                                 kHeaderBytes));
  if (std::memcmp(b.data(), kMagic, sizeof kMagic) != 0)
    throw UsageError(fmt::format("{}: it does not start with the magic bytes DPZ1CKPT (not a checkpoint of this project?)",
                                 damaged));
  const auto version = static_cast<uint32_t>(get_le(b.data() + 8, 4));
  if (version != kCheckpointVersion)
    throw UsageError(fmt::format("checkpoint {} has format version {}; this program reads version {}", path, version,
                                 kCheckpointVersion));
  const uint64_t meta_size = get_le(b.data() + 12, 8), payload_size = get_le(b.data() + 20, 8);
  const uint64_t stored_hash = get_le(b.data() + 28, 8);
  const uint64_t body = b.size() - kHeaderBytes;
  if (meta_size > body || payload_size != body - meta_size)
    throw UsageError(fmt::format("{}: the header announces {} bytes but the file has {} (truncated or appended to)",
                                 damaged, kHeaderBytes + meta_size + payload_size, b.size()));
  const uint64_t hash = fnv1a64(b.data() + kHeaderBytes, body);
  if (hash != stored_hash)
    throw UsageError(fmt::format("{}: checksum mismatch (stored {:016x}, computed {:016x})", damaged, stored_hash, hash));
  try {
    c.meta = json::parse(b.begin() + kHeaderBytes, b.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes + meta_size));
    c.info.version = version;
    c.info.world_size = c.meta.at("world_size").get<int>();
    c.info.optimizer = c.meta.at("optimizer").get<std::string>();
    for (const auto& p : c.meta.at("params")) {
      c.info.names.push_back(p.at("name").get<std::string>());
      if (!p.at("state").is_null()) c.info.max_step = std::max(c.info.max_step, p["state"].at("step").get<int64_t>());
    }
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{}: unreadable metadata ({})", damaged, e.what()));
  }
  c.payload_offset = kHeaderBytes + meta_size;
  c.payload_size = payload_size;
  return c;
}

// Compares the checkpoint's parameter list and groups with the model and optimizer; throws naming the first
// difference.
void check_matches(const std::string& path, const json& meta,
                   const std::vector<std::pair<std::string, torch::Tensor>>& named, const ShardedOptimizer& opt) {
  const auto& params = meta.at("params");
  for (size_t i = 0; i < std::min(params.size(), named.size()); ++i) {
    const auto& e = params[i];
    const auto& [name, p] = named[i];
    const auto ck_name = e.at("name").get<std::string>();
    if (ck_name != name)
      throw UsageError(fmt::format("checkpoint {} does not fit this model: parameter {} is '{}' in the checkpoint "
                                   "but '{}' in the model",
                                   path, i, ck_name, name));
    const auto shape = e.at("shape").get<std::vector<int64_t>>();
    if (shape != p.sizes().vec())
      throw UsageError(fmt::format("checkpoint {} does not fit this model: parameter '{}' has shape {} in the "
                                   "checkpoint but {} in the model",
                                   path, name, shape_text(shape), shape_text(p.sizes().vec())));
    const auto dtype = e.at("dtype").get<std::string>();
    if (dtype != c10::toString(p.scalar_type()))
      throw UsageError(fmt::format("checkpoint {} does not fit this model: parameter '{}' is {} in the checkpoint "
                                   "but {} in the model",
                                   path, name, dtype, c10::toString(p.scalar_type())));
  }
  if (params.size() != named.size())
    throw UsageError(fmt::format("checkpoint {} does not fit this model: it has {} parameters, the model {}", path,
                                 params.size(), named.size()));
  const auto kind = meta.at("optimizer").get<std::string>();
  if (kind != opt.kind())
    throw UsageError(fmt::format("checkpoint {} holds {} state but the optimizer is {}", path, kind, opt.kind()));
  const size_t groups = meta.at("groups").size();
  if (groups != opt.param_groups().size())
    throw UsageError(fmt::format("checkpoint {} has {} parameter groups but the optimizer has {} (add the same "
                                 "groups before loading)",
                                 path, groups, opt.param_groups().size()));
  for (size_t i = 0; i < named.size(); ++i) {
    const int ck_group = params[i].at("group").get<int>(), group = opt.group_of(named[i].second);
    if (ck_group != group)
      throw UsageError(fmt::format("checkpoint {}: parameter '{}' is in optimizer group {} in the checkpoint but in "
                                   "group {} here (-1: not in the optimizer)",
                                   path, named[i].first, ck_group, group));
  }
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

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
    local[i] = get_state(opt.local(), named[i].second);
    mine[3 * i] = local[i].present ? 1 : 0;
    mine[3 * i + 1] = static_cast<double>(local[i].step);
    mine[3 * i + 2] = local[i].tensors.size() == 3 ? 1 : 0;
  }
  const auto flags = pg.all_gather(mine);

  // 2. Every state tensor travels from its owner to rank 0 (a broadcast: Gloo on LibTorch 1.13 has no
  //    gather into one rank), one tensor at a time so no rank ever holds more than one extra tensor.
  const bool root = pg.rank() == 0;
  torch::serialize::OutputArchive archive;
  json meta = {{"format", "dp sharded-optimizer checkpoint"}, {"world_size", pg.world_size()},
               {"optimizer", opt.kind()}, {"params", json::array()}, {"groups", json::array()}};
  for (size_t i = 0; i < n; ++i) {
    const auto& [name, p] = named[i];
    const int owner = opt.owner_of(p);
    json e = {{"name", name}, {"shape", p.sizes().vec()}, {"dtype", c10::toString(p.scalar_type())},
              {"group", opt.group_of(p)}, {"owner_at_save", owner}, {"state", nullptr}};
    if (owner >= 0 && flags[owner][3 * i] == 1) {
      const auto names = state_names(opt.kind(), flags[owner][3 * i + 2] == 1);
      for (size_t k = 0; k < names.size(); ++k) {
        torch::Tensor t = pg.rank() == owner ? local[i].tensors[k].second.detach() : torch::empty_like(p.detach());
        pg.broadcast(t, owner);
        if (root) archive.write(fmt::format("p{}_{}", i, names[k]), t.cpu());
      }
      e["state"] = {{"step", static_cast<int64_t>(flags[owner][3 * i + 1])}, {"tensors", names}};
    }
    if (root) archive.write(fmt::format("p{}_value", i), p.detach().cpu());
    meta["params"].push_back(e);
  }
  for (const auto& g : opt.param_groups())
    meta["groups"].push_back({{"options", options_json(g.options())}, {"tensors", g.params().size()}});

  // 3. Rank 0 writes; every rank learns whether it worked, so all of them go on or all of them stop.
  std::string error;
  if (root) {
    try {
      std::string payload;
      archive.save_to([&](const void* data, size_t size) {
        payload.append(static_cast<const char*>(data), size);
        return size;
      });
      const std::string meta_text = meta.dump();
      std::string header(kMagic, sizeof kMagic);
      put_le(header, kCheckpointVersion, 4);
      put_le(header, meta_text.size(), 8);
      put_le(header, payload.size(), 8);
      put_le(header, fnv1a64(payload.data(), payload.size(), fnv1a64(meta_text.data(), meta_text.size())), 8);
      write_atomically(path, {&header, &meta_text, &payload});
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // Rank 0 sends its error message (possibly empty) to everyone: all ranks throw the same error.
  error = broadcast_text(pg, error, 0);
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
  std::vector<std::map<std::string, torch::Tensor>> states(n);
  std::vector<int64_t> steps(n, 0);
  std::vector<bool> present(n, false);
  try {
    c = read_and_check(path);
    check_matches(path, c.meta, named, opt);
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(c.bytes.data() + c.payload_offset, c.payload_size);
      for (size_t i = 0; i < n; ++i) {
        archive.read(fmt::format("p{}_value", i), values[i]);
        const auto& st = c.meta["params"][i].at("state");
        if (st.is_null() || !opt.owns(named[i].second)) continue;  // only the state of what this rank owns
        present[i] = true;
        steps[i] = st.at("step").get<int64_t>();
        for (const auto& tn : st.at("tensors")) {
          torch::Tensor t;
          archive.read(fmt::format("p{}_{}", i, tn.get<std::string>()), t);
          if (!t.sizes().equals(named[i].second.sizes()))
            throw UsageError(fmt::format("checkpoint {} is damaged: state tensor {} of '{}' has the wrong shape", path,
                                         tn.get<std::string>(), named[i].first));
          states[i][tn.get<std::string>()] = t.to(named[i].second.device());
        }
      }
    } catch (const c10::Error& e) {
      throw UsageError(fmt::format("checkpoint {} is damaged: unreadable tensor payload ({})", path,
                                   e.what_without_backtrace()));
    } catch (const json::exception& e) {
      throw UsageError(fmt::format("checkpoint {} is damaged: unreadable metadata ({})", path, e.what()));
    }
  } catch (const UsageError& e) {
    error = e.what();
  }
  const auto ok = pg.all_gather(error.empty() ? 1.0 : 0.0);
  if (!error.empty()) throw UsageError(error);
  for (int r = 0; r < pg.world_size(); ++r)
    if (ok[static_cast<size_t>(r)] != 1.0)
      throw UsageError(fmt::format("rank {} could not load checkpoint {} (its error says why)", r, path));

  // 2. Install: every parameter, the state this rank owns (any world size), each group's learning rate.
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < n; ++i) named[i].second.copy_(values[i]);
  }
  for (size_t i = 0; i < n; ++i)
    if (opt.owns(named[i].second))
      set_state(opt.local(), opt.kind(), named[i].second, present[i], steps[i], std::move(states[i]));
  const auto& groups = c.meta.at("groups");
  for (size_t g = 0; g < groups.size(); ++g) opt.set_lr(g, groups[g].at("options").at("lr").get<double>());
  return c.info;
}
// [load]

}  // namespace dp
