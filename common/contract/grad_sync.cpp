// Every DDP variant starts by making all ranks hold rank 0's weights: broadcast_parameters().
#include "common/contract/grad_sync.hpp"

#include "common/dist/runtime.hpp"
#include "common/model/params.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

namespace dp {

namespace {

// Every rank compares its parameter count and shapes with rank 0's; all ranks vote, so they all throw
// together and none is left waiting in a collective.
void verify_same_model(ProcessGroup& pg, const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  auto counts = pg.all_gather(static_cast<double>(params.size()));
  for (int r = 0; r < pg.world_size(); ++r)
    if (counts[r] != counts[0])
      throw UsageError(fmt::format("ranks built different models: rank {} has {} parameter tensors, rank 0 has {}", r,
                                   counts[r], counts[0]));
  constexpr int64_t kMaxDims = 8;  // [ndim, d0, ..., d7] per parameter
  auto shapes = torch::zeros({static_cast<int64_t>(params.size()), kMaxDims + 1}, torch::kInt64);
  for (size_t i = 0; i < params.size(); ++i) {
    auto sizes = params[i].second.sizes();
    shapes[i][0] = static_cast<int64_t>(sizes.size());
    for (size_t d = 0; d < sizes.size() && d < kMaxDims; ++d) shapes[i][d + 1] = sizes[d];
  }
  auto mine = shapes.clone();
  auto sent = shapes.to(pg.device());  // NCCL moves CUDA tensors only
  pg.broadcast(sent, 0);
  shapes = sent.cpu();
  std::string problem;
  for (size_t i = 0; i < params.size() && problem.empty(); ++i) {
    if (torch::equal(shapes[i], mine[i])) continue;
    auto dims = [&](const torch::Tensor& row) {
      std::vector<int64_t> v;
      for (int64_t d = 0; d < row[0].item<int64_t>(); ++d) v.push_back(row[d + 1].item<int64_t>());
      return v;
    };
    problem = fmt::format("ranks built different models: parameter {} ({}) has shape {} on rank {} but {} on rank 0", i,
                          params[i].first, shape_text(dims(mine[i])), pg.rank(), shape_text(dims(shapes[i])));
  }
  if (const int r = pg.first_rank_with(!problem.empty()); r >= 0)
    throw UsageError(problem.empty() ? fmt::format("ranks built different models: see rank {}'s message", r) : problem);
}

}  // namespace

// [broadcast]
void broadcast_parameters(ProcessGroup& pg, const ModelTensors& model) {
  // Different models on different ranks would pair unrelated tensors in the collectives below (a hang,
  // or garbage): compare every parameter's shape with rank 0's first and fail with a clear message.
  verify_same_model(pg, model.parameters);
  // Launch every broadcast, then wait: one round trip of latency instead of one per tensor.
  // detach() shares storage with the parameter, so the broadcast writes into the model itself.
  std::vector<Work> pending;
  std::vector<torch::Tensor> tensors;
  for (const auto& named : model.parameters) tensors.push_back(named.second.detach());
  for (const auto& b : model.buffers) tensors.push_back(b.detach());
  for (auto& t : tensors) pending.push_back(pg.broadcast_async(t, 0));
  for (auto& w : pending) w.wait();
}
// [broadcast]

void broadcast_parameters(ProcessGroup& pg, torch::nn::Module& module) {
  broadcast_parameters(pg, ModelTensors{unique_named_parameters(module), module.buffers()});
}

}  // namespace dp
