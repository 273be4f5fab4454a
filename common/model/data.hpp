// Synthetic, reproducible data: token batches for the Transformer, regression batches for the toy
// models, and the split of a global batch into per-rank shards.
//
// Every function here draws from its own generator seeded by its arguments, never from the global
// RNG, so a batch depends only on (seed, step) and not on how many random numbers were drawn before
// it (by model init, say). That lets every rank build the same global batch and keep its own rows.
#pragma once

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <utility>

namespace dp {

/// A language-model batch for training step `step`: tokens uniform in [0, vocab), drawn from a
/// generator seeded with (seed, step). Returns (inputs [batch, context_length] int64,
/// targets [batch, context_length] int64), where targets are the inputs shifted left by one token.
/// The same arguments give the same batch on every call and every rank; different steps differ.
/// Throws dp::UsageError if a size is not positive.
std::pair<torch::Tensor, torch::Tensor> token_batch(int64_t batch, int64_t context_length, int64_t vocab, uint64_t seed,
                                                    int64_t step);

/// Text a small model can learn (extensions 05e and 07c train on it): a Markov chain over the first
/// min(256, vocab) tokens, each followed by one of 4 successors (a table drawn from `table_seed`); draw `draw` of
/// `rows` sequences of context + 1 tokens, returned as (inputs, targets) [rows, context] int64. The loss falls from
/// ln 256 = 5.5 toward ln 4 = 1.39 as the model learns the table.
std::pair<torch::Tensor, torch::Tensor> markov_batch(int64_t rows, int64_t context, int64_t vocab, uint64_t table_seed,
                                                     uint64_t draw);

/// Rows [rank * n / W, (rank + 1) * n / W) of `global` ([n, ...]): this rank's contiguous shard, a view
/// that shares memory with `global`. Shards of ranks 0..W-1 are disjoint and together cover all rows.
/// Throws dp::UsageError if n is not a multiple of world_size (every rank must get the same number of
/// rows, or the averaged gradient would differ from the single-process one) or rank is out of range.
torch::Tensor shard_rows(const torch::Tensor& global, int rank, int world_size);

/// A regression batch for the toy models: (inputs [rows, in], targets [rows, out]), float32, standard
/// normal, drawn from a generator seeded with `seed`. Same seed, same tensors.
std::pair<torch::Tensor, torch::Tensor> regression_batch(int64_t rows, int64_t in, int64_t out, uint64_t seed);

}  // namespace dp
