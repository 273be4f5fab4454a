#include "common/harness/optimizer_check.hpp"

#include "common/base/format.hpp"
#include "common/base/log.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"

namespace dp {

namespace optim = torch::optim;

// A design that reduce-scatters (ZeRO-1) sums the N equal gradients over the ranks and divides by N: exactly
// g for N <= 2; for N = 3, 4 the reference takes the same sum (N copies in rank order, / N), the one rounding
// ZeRO-1 may add.
static bool matches_adamw(ProcessGroup& pg, const std::string& model_name, const MakeShardedSteps& make) {
  // [check]
  torch::manual_seed(42);
  auto ref = make_toy_model(model_name), shd = make_toy_model(model_name);
  copy_parameters(*shd, *ref);
  ref->to(pg.device());  // before the optimizers: they key their state by the tensors
  shd->to(pg.device());
  const auto opts = optim::AdamWOptions(0.1).weight_decay(0.1).betas(std::make_tuple(0.9, 0.999)).eps(1e-8);
  optim::AdamW plain(unique_parameters(*ref), opts);
  ShardedSteps sharded = make(pg, shd->parameters(), opts);
  print0("{}: {}", model_name, sharded.description);
  bool ok = true;
  for (int step = 1; step <= 10; ++step) {
    auto x = torch::rand({32, 10}).to(pg.device()), y = torch::rand({32, 5}).to(pg.device());
    plain.zero_grad();
    sharded.zero_grad();
    (y - ref->forward(x)).pow(2).sum().backward();
    (y - shd->forward(x)).pow(2).sum().backward();  // a design sending from backward's hooks sends from here
    if (sharded.sums_over_ranks && pg.world_size() > 2)
      for (auto& p : unique_parameters(*ref, true))
        p.grad().copy_(torch::stack(std::vector<torch::Tensor>(pg.world_size(), p.grad())).sum(0) / pg.world_size());
    plain.step();
    sharded.step();  // + broadcast, or reduce-scatter + all-gather
    // [check]
    // A mismatch is reported once and the steps go on: every rank must issue the design's collectives of all
    // 10 steps, or a rank that stopped early would leave the others waiting in them.
    auto a = unique_named_parameters(*ref), b = unique_named_parameters(*shd);
    for (size_t i = 0; i < a.size() && ok; ++i) {
      if (torch::equal(a[i].second, b[i].second)) continue;
      print_rank("FAIL {} step {}: {} differs by {:.3g}", model_name, step, a[i].first,
                 (a[i].second - b[i].second).abs().max().item<double>());
      ok = false;
    }
  }
  return parameters_identical_across_ranks(pg, *shd) && ok;
}

bool check_against_adamw(ProcessGroup& pg, const std::string& what, const MakeShardedSteps& make) {
  bool all_ok = true;
  for (const std::string name : {"toy", "tied"}) {
    const bool everyone = pg.first_rank_with(!matches_adamw(pg, name, make)) < 0;
    print0("{} {} == AdamW on {} (10 steps, {}, bit-identical after every step)", everyone ? "PASS" : "FAIL", what,
           name, count_of(pg.world_size(), "rank"));
    all_ok = all_ok && everyone;
  }
  return all_ok;
}

}  // namespace dp
