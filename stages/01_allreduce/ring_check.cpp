// Stage 01's checks of its rings: each against the library's collective, and each one's time on a link
// against ring_seconds()'s prediction.
#include "stages/01_allreduce/ring_check.hpp"

#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/cli.hpp"  // parse_size
#include "common/measure/results.hpp"
#include "common/measure/timing.hpp"
#include "stages/01_allreduce/ring_allreduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

namespace dp {

// The rings of ring_allreduce.cpp, written with sends and receives only, must give the library's answers.
// Integer-valued float32 entries (each below 2^24 / W) make every sum exact in any order, so they must be
// equal bit for bit; 1,001 elements leave chunks of unequal size at every W from 2 to 7.
bool check_rings(ProcessGroup& pg, uint64_t seed) {
  const int W = pg.world_size();
  const int r = pg.rank();
  torch::manual_seed(seed + 1000 + r);
  auto mine = torch::randint(0, 1000, {1001}, torch::kFloat32).to(pg.device());
  auto library = mine.clone(), input = mine.clone();
  ring_all_reduce(pg, mine);
  pg.all_reduce(library);
  bool ok = torch::equal(mine, library);
  const std::string hint = ring_mismatch_hint(pg, input, mine);  // a collective: every rank, always
  if (!ok)
    print_rank("MISMATCH: ring_all_reduce differs from all_reduce at {} of 1001 elements{}",
               (mine != library).sum().item<int64_t>(), hint.empty() ? "; no named hint fits" : hint);
  auto own = [&](const torch::Tensor& t) { return t.tensor_split(W)[r]; };  // this rank's chunk
  auto scattered = input.clone();
  ring_reduce_scatter(pg, scattered);  // this rank's chunk: the sum of everyone's
  auto gathered = torch::zeros_like(input);
  own(gathered).copy_(own(input));
  ring_all_gather(pg, gathered);  // chunk c: rank c's chunk c
  auto alternate = input.clone();
  alternate_ring_all_reduce(pg, alternate);
  const auto inputs = pg.all_gather(input);
  auto gathered_want = torch::empty_like(input);
  for (int c = 0; c < W; ++c) gathered_want.tensor_split(W)[c].copy_(inputs[c].tensor_split(W)[c]);
  const bool scatter_ok = torch::equal(own(scattered), own(library));
  const bool gather_ok = torch::equal(gathered, gathered_want);
  const bool alternate_ok = torch::equal(alternate, library);
  const bool rings_ok = scatter_ok && gather_ok && alternate_ok;
  if (!rings_ok)
    print_rank("MISMATCH: reduce-scatter {}, all-gather {}, alternate ring {}", scatter_ok ? "right" : "WRONG",
               gather_ok ? "right" : "WRONG", alternate_ok ? "right" : "WRONG");
  return ok && rings_ok;
}

// --rings: each ring of ring_allreduce.cpp timed on the simulated link and set beside ring_seconds()'s
// prediction. TCP/IP carries 1448 payload bytes in each 1514-byte frame that tbf counts (MSS 1460 less
// 12 bytes of timestamps; 14 bytes of Ethernet header), so a link of R bit/s moves R/8 x 1448/1514 bytes/s
// of tensor. Each time is the fastest of the rounds (a busy machine only adds time: the link sets the
// floor), and must be within kRingTolerance of the prediction wherever that is at least 20 ms: below, tbf's
// burst (4 ms of traffic may leave at once after an idle moment) is a fifth of the time or more. The
// prediction takes a step's latency as 0: a ring of one float per rank measures it (printed), but that is
// mostly waking the processes, which a streaming ring hides (at 1 MB and more the bytes alone predict it).
bool bench_rings(ProcessGroup& pg, const std::vector<std::string>& sizes, int warmup, int iters, double budget_s,
                 Results& results) {
  const int W = pg.world_size();
  const double rate = LaunchEnv::from_environment().net_bit_s / 8 * 1448.0 / 1514.0;  // bytes/s of payload
  auto time_it = [&](const std::function<void()>& f) {
    auto mine = time_iterations(f, warmup, iters, budget_s, pg.device());
    auto counts = pg.all_gather(static_cast<double>(mine.size()));
    mine.resize(static_cast<size_t>(*std::min_element(counts.begin(), counts.end())));
    return summarize(max_over_ranks(pg, mine)).min;  // the fastest round: what the link allows
  };
  auto tiny = torch::zeros({W});
  const double step_latency = time_it([&] { ring_all_reduce(pg, tiny); }) / (2.0 * (W - 1));
  print0("a ring step alone: {:.3f} ms (a ring all-reduce of {} floats / {} steps); link payload {:.1f} MB/s",
         step_latency * 1e3, W, 2 * (W - 1), rate / 1e6);
  bool ok = true;
  for (const auto& size_text : sizes) {
    const uint64_t bytes = parse_size(size_text, "--sizes");
    auto t = torch::zeros({static_cast<int64_t>(bytes / sizeof(float))});
    for (Ring c : {Ring::kReduceScatter, Ring::kAllGather, Ring::kAllReduce, Ring::kAlternate}) {
      const double measured = time_it([&] {
        if (c == Ring::kReduceScatter) ring_reduce_scatter(pg, t);
        if (c == Ring::kAllGather) ring_all_gather(pg, t);
        if (c == Ring::kAllReduce) ring_all_reduce(pg, t);
        if (c == Ring::kAlternate) alternate_ring_all_reduce(pg, t);
      });
      const double predicted = ring_seconds(c, W, static_cast<double>(bytes), rate, 0.0);
      const bool checked = predicted >= 0.02;
      const bool within = std::abs(measured / predicted - 1) <= kRingTolerance;
      ok = ok && (!checked || within);
      results.add({{"ring", ring_name(c)},
                   {"world_size", W},
                   {"link", link_description()},
                   {"size", size_text},
                   {"bytes", bytes},
                   {"measured_s", measured},
                   {"predicted_s", predicted},
                   {"ratio", measured / predicted},
                   {"step_latency_s", step_latency}});
      print0("{} {:>14} x {} ranks: {:8.2f} ms measured, {:8.2f} ms predicted, ratio {:.3f}{}", size_text, ring_name(c),
             W, measured * 1e3, predicted * 1e3, measured / predicted,
             !checked ? " (under 20 ms: not checked)"
             : within ? ""
                      : " OUTSIDE the tolerance");
    }
  }
  return ok;
}

}  // namespace dp
