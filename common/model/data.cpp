// Synthetic data with local generators: reproducible on every rank, independent of the global RNG.
#include "common/model/data.hpp"

#include "common/base/errors.hpp"
#include "common/base/hash.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>

namespace dp {

namespace {

void require_positive(int64_t v, const char* what) {
  if (v <= 0) throw UsageError(fmt::format("{} must be positive, got {}", what, v));
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> token_batch(int64_t batch, int64_t context_length, int64_t vocab, uint64_t seed,
                                                    int64_t step) {
  require_positive(batch, "batch size");
  require_positive(context_length, "context length");
  require_positive(vocab, "vocabulary size");
  // Our own generator: drawing these tokens leaves torch::manual_seed's stream untouched.
  auto gen = at::detail::createCPUGenerator(seed ^ splitmix64(static_cast<uint64_t>(step)));
  // One extra column so that every input position has a next token to predict.
  auto tokens = torch::randint(0, vocab, {batch, context_length + 1}, gen, torch::kLong);  // [B, T+1]
  auto inputs = tokens.narrow(1, 0, context_length).contiguous();                          // [B, T]
  auto targets = tokens.narrow(1, 1, context_length).contiguous();                         // [B, T]
  return {inputs, targets};
}

torch::Tensor shard_rows(const torch::Tensor& global, int rank, int world_size) {
  if (world_size <= 0 || rank < 0 || rank >= world_size)
    throw UsageError(fmt::format("rank {} is not in [0, world size {})", rank, world_size));
  const int64_t rows = global.size(0);
  if (rows % world_size != 0)
    throw UsageError(
        fmt::format("cannot split {} rows evenly over {} ranks; use a global batch size that is a multiple of {}", rows,
                    world_size, world_size));
  // Contiguous blocks: rank r owns rows [r * per_rank, (r + 1) * per_rank). narrow() makes a view,
  // so sharding costs no copy.
  const int64_t per_rank = rows / world_size;
  return global.narrow(0, rank * per_rank, per_rank);
}

std::pair<torch::Tensor, torch::Tensor> regression_batch(int64_t rows, int64_t in, int64_t out, uint64_t seed) {
  require_positive(rows, "rows");
  require_positive(in, "input width");
  require_positive(out, "output width");
  auto gen = at::detail::createCPUGenerator(splitmix64(seed));
  auto x = torch::randn({rows, in}, gen, torch::kFloat32);   // [rows, in]
  auto y = torch::randn({rows, out}, gen, torch::kFloat32);  // [rows, out]
  return {x, y};
}

std::pair<torch::Tensor, torch::Tensor> markov_batch(int64_t rows, int64_t context, int64_t vocab, uint64_t table_seed,
                                                     uint64_t draw) {
  const int64_t states = std::min<int64_t>(256, vocab);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(table_seed);
  auto next = torch::randint(states, {states, 4}, gen, torch::kLong);  // the table: 4 successors per token
  auto pick = at::make_generator<at::CPUGeneratorImpl>(table_seed * 1000003 + draw + 1);
  auto tokens = torch::empty({rows, context + 1}, torch::kLong);
  auto cur = torch::randint(states, {rows}, pick, torch::kLong);
  for (int64_t t = 0; t <= context; ++t) {
    tokens.select(1, t).copy_(cur);
    cur = next.index({cur, torch::randint(4, {rows}, pick, torch::kLong)});
  }
  return {tokens.narrow(1, 0, context).clone(), tokens.narrow(1, 1, context).clone()};
}

}  // namespace dp
