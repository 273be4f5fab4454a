// Extension 06a, ZeRO-1 in buckets (BucketedZero1): reduce-scatters from backward, all-gathers behind the
// next forward, misuse. Its training results run in stage 06's typed suite (tests/stages/test_zero1.cpp, the
// design zero1_buckets) and in the training-strategy contract. Ranks are threads (run_ranks).
#include "common/model/params.hpp"
#include "common/model/transformer.hpp"
#include "tests/stages/sharded_opt_support.hpp"
#include "tests/support/expect.hpp"

#include <gtest/gtest.h>

namespace {

using namespace dp::testing;
using dp::ProcessGroup;

// ---------------------------------------------------------------------------------------------------
// BucketedZero1's own: reduce-scatters from backward, all-gathers behind the next forward, misuse
// ---------------------------------------------------------------------------------------------------

// Every bucket of the Transformer leaves during backward (all its parameters get a gradient), each
// bucket is cut evenly, and the buffers are what describe() and buffer_bytes() say.
TEST(BucketedZero1, EveryBucketLeavesDuringBackward) {
  run_ranks(3, [](ProcessGroup& pg) {
    auto twins = twin_transformers(dp::TransformerConfig::preset("tiny", 8), 5, {2, 9});
    auto& m = twins.shd;
    dp::BucketedZero1 opt(pg, m->parameters(), local_factory("adamw"), 1.0);  // 1 MB: a few tensors each
    require(opt.num_buckets() > 5 && opt.num_buckets() < static_cast<size_t>(m->cfg.num_parameter_tensors()),
            fmt::format("{} buckets", opt.num_buckets()));
    int64_t numel = 0, chunks = 0, padded = 0;
    for (size_t b = 0; b < opt.num_buckets(); ++b) {
      const auto& L = opt.layout(b);
      require(L.padded % 3 == 0 && L.padded - L.numel < 3 && L.chunk * 3 == L.padded, "an even cut");
      numel += L.numel;
      chunks += L.chunk;
      padded += L.padded;
    }
    require(numel == m->cfg.num_parameters(), "every parameter in one bucket");
    const auto& x = twins.tokens;
    opt.zero_grad();
    dp::lm_loss(m->forward(x.narrow(1, 0, 8)), x.narrow(1, 1, 8)).backward();
    opt.step();
    require(opt.launched_during_backward() == opt.num_buckets(),
            fmt::format("{} of {} reduce-scatters left during backward", opt.launched_during_backward(),
                        opt.num_buckets()));
    require(opt.state_bytes() == 8 * chunks, "AdamW state: two moments of every chunk");
    require(opt.buffer_bytes() == 4 * chunks + 4 * padded, "chunk gradients and all-to-all buffers");
    require(opt.describe().find("buckets") != std::string::npos, opt.describe());
  });
}

// step(false) + runner(): the all-gathers start with the next forward and each unit waits for its own
// weights. Three steps so, against three with step(): the same weights, bit for bit, at 2 and 3 ranks.
TEST(BucketedZero1, AllGathersBehindTheNextForwardChangeNoBit) {
  for (int world : {2, 3}) {
    run_ranks(world, [&](ProcessGroup& pg) {
      auto twins = twin_transformers(dp::TransformerConfig::preset("tiny", 8), 11, {3, 2 * world, 9});
      auto &a = twins.ref, &b = twins.shd;
      dp::BucketedZero1 now(pg, a->parameters(), local_factory("adamw", 1e-3), 1.0);
      dp::BucketedZero1 later(pg, b->parameters(), local_factory("adamw", 1e-3), 1.0);
      auto run = later.runner(b->units());
      for (int step = 0; step < 3; ++step) {
        auto rows = twins.tokens[step].narrow(0, 2 * pg.rank(), 2);
        auto x = rows.narrow(1, 0, 8), y = rows.narrow(1, 1, 8);
        now.zero_grad();
        dp::lm_loss(a->forward(x), y).backward();
        now.step();
        later.zero_grad();
        dp::lm_loss(b->forward_units(x, run), y).backward();
        later.step(false);
      }
      later.wait_parameters();
      require_same(*a, *b, fmt::format("W={} rank {}", world, pg.rank()));
    });
  }
}

// Misuse is an error, not a silent wrong step: a forward that did not wait for step(false)'s all-gathers,
// and a second backward before step().
TEST(BucketedZero1, ForwardOnWeightsInFlightAndTwoBackwardsThrow) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto p = build_pair("toy", 3);
    dp::BucketedZero1 opt(pg, p.shd->parameters(), local_factory("sgd"), BucketedZero1Design::kCapMb);
    loss_of(*p.shd, p.batches[0]).backward();
    expect_logic_error([&] { loss_of(*p.shd, p.batches[1]).backward(); }, {"second backward before step()"});
    opt.step(false);
    opt.zero_grad();
    expect_logic_error([&] { loss_of(*p.shd, p.batches[1]).backward(); }, {"never waited for"});
    opt.wait_parameters();
    opt.zero_grad();
    loss_of(*p.shd, p.batches[1]).backward();
    opt.step();
    require(dp::parameters_identical_across_ranks(pg, *p.shd), "ranks disagree");
  });
}

// The same refusals as Zero1Optimizer's, and a bucket cap that is no size.
TEST(BucketedZero1, RefusesParametersItCannotFlattenAndBadCaps) {
  run_ranks(1, [](ProcessGroup& pg) {
    auto d = torch::zeros({3}, torch::dtype(torch::kFloat64).requires_grad(true));
    expect_usage_error([&] { dp::BucketedZero1(pg, {d}, local_factory("sgd")); },
                       {"BucketedZero1", "not a float32 leaf"});
    auto leaf = torch::zeros({3}, torch::requires_grad());
    expect_usage_error([&] { dp::BucketedZero1(pg, {leaf}, local_factory("sgd"), 0.0); }, {"bucket"});
  });
}

// Gradients replaced or dropped between steps (set_to_none by hand) still count, as for Zero1Optimizer.
TEST(BucketedZero1, GradientsReplacedOrDroppedAreStillUsed) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto p = build_pair("toy", 3);
    auto ref = plain_optimizer("sgd", {optim::OptimizerParamGroup(dp::unique_parameters(*p.ref))});
    dp::BucketedZero1 opt(pg, p.shd->parameters(), local_factory("sgd"), BucketedZero1Design::kCapMb);
    for (int step = 0; step < 3; ++step) {
      ref->zero_grad();
      for (auto& t : dp::unique_parameters(*p.shd)) t.mutable_grad().reset();
      loss_of(*p.ref, p.batches[step]).backward();
      loss_of(*p.shd, p.batches[step]).backward();
      ref->step();
      opt.step();
      require_same(*p.ref, *p.shd, fmt::format("step {}", step + 1));
    }
  });
}

}  // namespace
