// What the stage 06 suites (test_sharded_optimizer.cpp, test_checkpoint.cpp) share: the optimizers of
// the tests, the CS336 model pairs and batches, parameter groups and the bit-for-bit comparison.
#pragma once

#include "common/ddp_check.hpp"
#include "common/models.hpp"
#include "common/runtime.hpp"
#include "stages/06_sharded_opt/sharded_optimizer.hpp"
#include "tests/support/ranks.hpp"

#include <fmt/format.h>

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

inline std::unique_ptr<optim::Optimizer> plain_optimizer(const std::string& kind, Groups groups) {
  auto d = options_for(kind, 0.1);
  if (kind == "adamw") return std::make_unique<optim::AdamW>(std::move(groups), static_cast<optim::AdamWOptions&>(*d));
  if (kind == "adam") return std::make_unique<optim::Adam>(std::move(groups), static_cast<optim::AdamOptions&>(*d));
  return std::make_unique<optim::SGD>(std::move(groups), static_cast<optim::SGDOptions&>(*d));
}

// The generic construction: ShardedOptimizer with a function that builds the local optimizer.
inline MakeLocalOptimizer local_factory(const std::string& kind) {
  return [kind](Groups groups) { return plain_optimizer(kind, std::move(groups)); };
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

}  // namespace dp::testing
