// What the ZeRO-1 suites (test_zero1.cpp; extension 06's test_06c_checkpoints.cpp, test_06b_cs336_design.cpp) share:
// the optimizers of the tests, the CS336 model pairs and batches, parameter groups and the bit-for-bit comparison.
#pragma once

#include "common/dist/runtime.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "extensions/06a_zero1_buckets/bucketed_zero1.hpp"
#include "extensions/06b_cs336_design/sharded_optimizer.hpp"
#include "stages/06_sharded_opt/zero1_optimizer.hpp"
#include "tests/support/ranks.hpp"

#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dp::testing {

namespace optim = torch::optim;
using Groups = std::vector<optim::OptimizerParamGroup>;

// Inside a rank: a failed check throws, so run_ranks reports it (an ASSERT would only leave the thread).
inline void require(bool ok, const std::string& what) {
  if (!ok) throw CheckFailed(what);
}

// The three optimizers of the tests, with the options of CS336's test for AdamW.
inline std::unique_ptr<optim::OptimizerOptions> options_for(const std::string& kind, double lr) {
  if (kind == "adamw")
    return std::make_unique<optim::AdamWOptions>(
        optim::AdamWOptions(lr).weight_decay(0.1).betas(std::make_tuple(0.9, 0.999)).eps(1e-8));
  if (kind == "adam") return std::make_unique<optim::AdamOptions>(optim::AdamOptions(lr).weight_decay(0.01));
  return std::make_unique<optim::SGDOptions>(optim::SGDOptions(lr).momentum(0.9));
}

inline std::unique_ptr<optim::Optimizer> plain_optimizer(const std::string& kind, Groups groups, double lr = 0.1) {
  auto d = options_for(kind, lr);
  if (kind == "adamw") return std::make_unique<optim::AdamW>(std::move(groups), static_cast<optim::AdamWOptions&>(*d));
  if (kind == "adam") return std::make_unique<optim::Adam>(std::move(groups), static_cast<optim::AdamOptions&>(*d));
  return std::make_unique<optim::SGD>(std::move(groups), static_cast<optim::SGDOptions&>(*d));
}

// The generic construction: a design with the MakeOptimizer that builds its local optimizer.
inline MakeOptimizer local_factory(const std::string& kind, double lr = 0.1) {
  return [kind, lr](std::vector<torch::Tensor> params) {
    return plain_optimizer(kind, Groups{optim::OptimizerParamGroup(std::move(params))}, lr);
  };
}

struct Batch {
  torch::Tensor x, y;
};

// Every rank: seed 42, build the reference model, a second instance with the same values, and the batches
// (rand(32, 10) inputs, rand(32, 5) targets) from the same generator, so all ranks see the same data.
struct Pair {
  std::shared_ptr<ToyBase> ref, shd;
  std::vector<Batch> batches;
};
inline Pair build_pair(const std::string& model, int steps) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(42);
  Pair p;
  p.ref = make_toy_model(model);
  p.shd = make_toy_model(model);
  copy_parameters(*p.shd, *p.ref);
  for (int i = 0; i < steps; ++i) {
    auto x = torch::rand({32, 10});
    p.batches.push_back({x, torch::rand({32, 5})});
  }
  return p;
}

inline torch::Tensor loss_of(ToyBase& m, const Batch& b) { return (b.y - m.forward(b.x)).pow(2).sum(); }

// Parameter groups over a model: "one" group of m.parameters() as LibTorch lists them (tied weights
// twice: the sharded optimizer must dedupe), or "two": fc1.* at lr 0.1 and the rest at lr 0.01.
inline Groups make_groups(const std::string& kind, torch::nn::Module& m, const std::string& layout, bool raw_list) {
  if (layout == "one") {
    return {optim::OptimizerParamGroup(raw_list ? m.parameters() : unique_parameters(m), options_for(kind, 0.1))};
  }
  std::vector<torch::Tensor> first, rest;
  for (auto& [name, p] : unique_named_parameters(m)) (name.rfind("fc1.", 0) == 0 ? first : rest).push_back(p);
  Groups g;
  g.emplace_back(first, options_for(kind, 0.1));
  g.emplace_back(rest, options_for(kind, 0.01));
  return g;
}

// Two identical Transformers (reference and sharded) and random tokens of `token_shape`, all from `seed`
// under the RNG lock, so every rank thread builds the same values.
struct TwinTransformers {
  dp::TransformerLM ref{nullptr}, shd{nullptr};
  torch::Tensor tokens;
};
inline TwinTransformers twin_transformers(const dp::TransformerConfig& cfg, uint64_t seed,
                                          std::vector<int64_t> token_shape) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  TwinTransformers t;
  t.ref = dp::TransformerLM(cfg);
  t.shd = dp::TransformerLM(cfg);
  dp::copy_parameters(*t.shd, *t.ref);
  t.tokens = torch::randint(0, cfg.vocab_size, token_shape, torch::kInt64);
  return t;
}

// Bit-identical: the CS336 test demands rtol 1e-7 with atol 0, below float32's epsilon.
inline void require_same(torch::nn::Module& a, torch::nn::Module& b, const std::string& when) {
  auto na = unique_named_parameters(a), nb = unique_named_parameters(b);
  require(na.size() == nb.size(), "models differ in structure");
  for (size_t i = 0; i < na.size(); ++i) {
    const auto& x = na[i].second;
    const auto& y = nb[i].second;
    if (!torch::equal(x, y)) {
      double diff = (x - y).abs().max().item<double>();
      throw CheckFailed(fmt::format("{}: parameter {} differs (max |diff| {:.3g})", when, na[i].first, diff));
    }
  }
}

// Distance in units in the last place between two float32 tensors of one shape: the largest number of
// representable floats between corresponding elements (0 = bit-identical). Integer arithmetic on the bit
// patterns, mapped so that the order of the integers is the order of the floats.
inline int64_t max_ulps(const torch::Tensor& a, const torch::Tensor& b) {
  auto ordered = [](const torch::Tensor& t) {
    auto i = t.contiguous().view(torch::kInt32).to(torch::kInt64);
    return torch::where(i < 0, static_cast<int64_t>(INT32_MIN) - i, i);
  };
  return a.numel() == 0 ? 0 : (ordered(a) - ordered(b)).abs().max().template item<int64_t>();
}

// Every parameter within `ulps` of the reference (0: bit-identical).
inline void require_within_ulps(torch::nn::Module& a, torch::nn::Module& b, int64_t ulps, const std::string& when) {
  auto na = unique_named_parameters(a), nb = unique_named_parameters(b);
  require(na.size() == nb.size(), "models differ in structure");
  for (size_t i = 0; i < na.size(); ++i) {
    const int64_t d = max_ulps(na[i].second, nb[i].second);
    if (d > ulps)
      throw CheckFailed(fmt::format("{}: parameter {} is {} ulps away (allowed {}; max |diff| {:.3g})", when,
                                    na[i].first, d, ulps, (na[i].second - nb[i].second).abs().max().item<double>()));
  }
}

// The two ZeRO-1 designs behind one face, for the typed suites. step_replicated(): every rank holds the
// same full gradient (CS336's test, no DDP). step_ddp(): every rank holds its own gradient; the step
// must average them as DDP does.
struct Cs336Design {
  static constexpr const char* name = "cs336";
  ProcessGroup& pg;
  std::unique_ptr<ShardedOptimizer> opt;
  Cs336Design(ProcessGroup& g, const std::vector<torch::Tensor>& params, const std::string& kind, double lr)
      : pg(g),
        opt(std::make_unique<ShardedOptimizer>(g, Groups{optim::OptimizerParamGroup(params)},
                                               local_factory(kind, lr))) {}
  void zero_grad() { opt->zero_grad(); }
  void step_replicated() { opt->step(); }
  void step_ddp() {  // the design's own DDP part: all-reduce every gradient, divide by N
    for (auto& p : opt->parameters())
      if (p.grad().defined()) {
        auto g = p.grad();
        pg.all_reduce(g);
        g.div_(pg.world_size());
      }
    opt->step();
  }
  const std::string& kind() const { return opt->kind(); }
  // The reference's gradient averaging that this design's arithmetic equals. Replicated: none (the
  // gradients are used as they are). DDP: Gloo's all-reduce, as step_ddp() does.
  static void replicated_average(ProcessGroup&, const std::vector<torch::Tensor>&) {}
  static void ddp_average(ProcessGroup& pg, const std::vector<torch::Tensor>& grads) {
    for (auto g : grads) {
      pg.all_reduce(g);
      g.div_(pg.world_size());
    }
  }
};

// One flat copy of `grads`, padded for `world` ranks; and back.
inline torch::Tensor flatten_padded(const std::vector<torch::Tensor>& grads, int world) {
  std::vector<torch::Tensor> parts;
  for (const auto& g : grads) parts.push_back(g.reshape({-1}));
  auto flat = torch::cat(parts);
  const auto l = FlatLayout::of(flat.numel(), world);
  return torch::cat({flat, torch::zeros({l.padded - l.numel})});
}
inline void unflatten_into(const torch::Tensor& flat, const std::vector<torch::Tensor>& grads) {
  int64_t off = 0;
  for (auto g : grads) {
    g.copy_(flat.narrow(0, off, g.numel()).view(g.sizes()));
    off += g.numel();
  }
}

struct Zero1Design {
  static constexpr const char* name = "zero1";
  std::unique_ptr<Zero1Optimizer> opt;
  Zero1Design(ProcessGroup& g, const std::vector<torch::Tensor>& params, const std::string& kind, double lr)
      : opt(std::make_unique<Zero1Optimizer>(g, params, local_factory(kind, lr))) {}
  void zero_grad() { opt->zero_grad(); }
  void step_replicated() { opt->step(); }  // N equal gradients summed, divided by N
  void step_ddp() { opt->step(); }         // the reduce-scatter does DDP's averaging
  const std::string& kind() const { return opt->kind(); }
  // Summing over ranks is the one place where ZeRO-1's arithmetic differs from DDP with Gloo's
  // all-reduce: the all-to-all path adds the N pieces in rank order, Gloo's ring in an order that depends
  // on the chunk. At N <= 2 both are a + b; at N = 3 and 4 they can round differently (see
  // test_zero1.cpp). The reference therefore averages with the same sum: replicated gradients as N
  // equal copies summed in rank order, then divided by N (exact for N = 1, 2); DDP through common's
  // reduce-scatter + all-gather, an all-reduce whose sum is ZeRO-1's.
  static void replicated_average(ProcessGroup& pg, const std::vector<torch::Tensor>& grads) {
    const int W = pg.world_size();
    for (auto g : grads)
      g.copy_(torch::stack(std::vector<torch::Tensor>(W, g.reshape({-1}))).sum(0).div_(W).view(g.sizes()));
  }
  static void ddp_average(ProcessGroup& pg, const std::vector<torch::Tensor>& grads) {
    const int W = pg.world_size();
    auto flat = flatten_padded(grads, W);
    auto mine = torch::empty({flat.numel() / W});
    reduce_scatter(pg, flat, mine, ReduceScatterAlgo::all_to_all);
    mine.div_(W);
    all_gather_flat(pg, mine, flat);
    unflatten_into(flat, grads);
  }
};

// BucketedZero1 with buckets of at most 4,000 bytes (1,000 floats): the toy model gets one bucket, the
// tied model two of two tensors each, the Transformer one per weight matrix plus one per block for its two
// norms (the last block's shared with the final norm), so the tests run many reduce-scatters launched from
// backward's hooks, over buckets of one tensor and of several. Each element is still summed
// over the ranks in rank order, so the references are Zero1Design's.
struct BucketedZero1Design {
  static constexpr const char* name = "zero1_buckets";
  static constexpr double kCapMb = 0.004;
  std::unique_ptr<BucketedZero1> opt;
  BucketedZero1Design(ProcessGroup& g, const std::vector<torch::Tensor>& params, const std::string& kind, double lr)
      : opt(std::make_unique<BucketedZero1>(g, params, local_factory(kind, lr), kCapMb)) {}
  void zero_grad() { opt->zero_grad(); }
  void step_replicated() { opt->step(); }
  void step_ddp() { opt->step(); }
  const std::string& kind() const { return opt->kind(); }
  static void replicated_average(ProcessGroup& pg, const std::vector<torch::Tensor>& grads) {
    Zero1Design::replicated_average(pg, grads);
  }
  static void ddp_average(ProcessGroup& pg, const std::vector<torch::Tensor>& grads) {
    Zero1Design::ddp_average(pg, grads);
  }
};

}  // namespace dp::testing
