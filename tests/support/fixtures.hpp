// Small models and batches the stage tests share.
#pragma once

#include "common/model/models.hpp"
#include "common/model/transformer.hpp"
#include "tests/support/ranks.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <memory>
#include <mutex>

namespace dp::testing {

/// A ToyMLP and an [8, 10] input batch, both different on every rank (seeded with 100 + rank), so
/// that a DDP constructor's broadcast has something to fix and local gradients differ.
struct LocalMlp {
  std::shared_ptr<ToyMLPImpl> model;
  torch::Tensor x;
};
LocalMlp make_local(int rank);

/// The 2-layer Transformer the stage 05 feature tests train: vocabulary 64, 8 tokens, d_model 16, d_ff 32,
/// 2 heads. Small enough for many steps at 4 ranks, deep enough for several buckets and a real backward.
inline TransformerConfig tiny_lm_config() { return TransformerConfig::toy(); }

/// A fresh ToyMLP with `src`'s parameter values, hooked by nobody: computes a rank's local gradient
/// without touching a model that a DDP variant is synchronizing.
std::shared_ptr<ToyMLPImpl> copy_of(const ToyMLPImpl& src);

/// Gradients ready out of registration order. `late` is registered after `early` but used before it in
/// forward, so its gradient is ready last: with one parameter per bucket in reverse registration order,
/// bucket 0 (late) completes after bucket 1 (early). `unused` (registered first, so in the last bucket)
/// is never used in forward. x: [N, 10] -> [N, 5].
struct OutOfOrderImpl : torch::nn::Module {
  OutOfOrderImpl() {
    unused = register_parameter("unused", torch::ones({3}));
    early = register_parameter("early", torch::randn({kToyIn, kToyOut}));
    late = register_parameter("late", torch::randn({kToyIn, kToyIn}));
  }
  torch::Tensor forward(torch::Tensor x) { return torch::matmul(torch::matmul(x, late), early); }
  torch::Tensor unused, early, late;
};

/// A default-constructed module M whose parameters come from torch's global RNG seeded with `seed`
/// (holding rng_mutex(), so that threads as ranks do not interleave).
template <typename M>
std::shared_ptr<M> make_seeded(uint64_t seed) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  return std::make_shared<M>();
}

}  // namespace dp::testing
