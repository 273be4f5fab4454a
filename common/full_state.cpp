#include "common/full_state.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <unordered_map>

namespace dp {

namespace optim = torch::optim;

std::vector<ParamState> local_states(const optim::Optimizer& opt, const std::vector<torch::Tensor>& params) {
  std::vector<ParamState> out;
  for (const auto& p : params) {
    ParamState s = get_param_state(opt, p);
    for (auto& [name, t] : s.tensors) t = t.detach().clone();
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

// The owner sends a header [present, step, number of tensors, characters of their names], the names
// ('\n'-separated, one int32 per character: every backend broadcasts int32), then each tensor.
ParamState broadcast_param_state(ProcessGroup& pg, int owner, const ParamState& mine, const torch::Tensor& p) {
  const bool me = pg.rank() == owner;
  std::string names;
  if (me)
    for (const auto& [name, t] : mine.tensors) {
      if (t.sizes() != p.sizes())
        throw std::invalid_argument(fmt::format("optimizer state {} is not shaped like its parameter", name));
      names += name + "\n";
    }
  auto header = torch::tensor({me && mine.present ? int64_t{1} : 0, me ? mine.step : 0,
                               me ? static_cast<int64_t>(mine.tensors.size()) : 0, static_cast<int64_t>(names.size())},
                              torch::kInt64)
                    .to(pg.device());
  pg.broadcast(header, owner);
  header = header.cpu();
  ParamState out;
  out.present = header[0].item<int64_t>() != 0;
  out.step = header[1].item<int64_t>();
  const int64_t count = header[2].item<int64_t>(), chars = header[3].item<int64_t>();
  if (count == 0) return out;
  auto codes = torch::zeros({chars}, torch::kInt32);
  if (me)
    for (int64_t i = 0; i < chars; ++i) codes[i] = static_cast<int32_t>(names[static_cast<size_t>(i)]);
  codes = codes.to(pg.device());
  pg.broadcast(codes, owner);
  codes = codes.cpu();
  std::vector<std::string> keys(1);
  for (int64_t i = 0; i < chars; ++i) {
    const char c = static_cast<char>(codes[i].item<int32_t>());
    if (c == '\n') keys.emplace_back(); else keys.back() += c;
  }
  keys.pop_back();  // the empty name after the last '\n'
  for (const auto& k : keys) {
    torch::Tensor t = me ? mine.tensors.at(k).detach().clone().contiguous() : torch::empty_like(p.detach());
    pg.broadcast(t, owner);
    out.tensors[k] = t;
  }
  return out;
}

std::vector<ParamState> gather_chunk_state(ProcessGroup& pg, const optim::Optimizer& opt, const torch::Tensor& chunk,
                                           const FlatLayout& L, const std::vector<torch::Tensor>& params) {
  // Every rank's chunk has a state after the first step (a chunk is never empty: padded >= world), so
  // every rank holds the same names and step, and each state tensor can be all-gathered.
  const ParamState mine = get_param_state(opt, chunk);
  std::vector<ParamState> out(params.size());
  for (auto& s : out) s.present = mine.present, s.step = mine.step;
  for (const auto& [name, t] : mine.tensors) {
    const auto whole = torch::cat(pg.all_gather(t.detach().reshape(-1).contiguous())).narrow(0, 0, L.numel);
    int64_t off = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t n = params[i].numel();
      out[i].tensors[name] = whole.narrow(0, off, n).view(params[i].sizes()).clone();
      off += n;
    }
  }
  return out;
}

void set_chunk_state(optim::Optimizer& opt, const torch::Tensor& chunk, const FlatLayout& L, int rank,
                     const std::vector<ParamState>& states) {
  ParamState s;
  if (!states.empty()) s.present = states[0].present, s.step = states[0].step;
  if (s.present)
    for (const auto& [name, t0] : states[0].tensors) {
      std::vector<torch::Tensor> pieces;
      for (const auto& st : states) pieces.push_back(st.tensors.at(name).reshape(-1));
      auto flat = torch::zeros({L.padded}, chunk.options());
      flat.narrow(0, 0, L.numel).copy_(torch::cat(pieces));
      s.tensors[name] = flat.narrow(0, L.offset(rank), L.chunk).clone();
    }
  set_param_state(opt, optimizer_kind(opt), chunk, std::move(s));
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

}  // namespace dp
