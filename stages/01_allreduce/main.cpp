// Stage 01: process groups, ranks and the all-reduce collective, and how to benchmark it.
//
// What it adds: W processes ("ranks") join one process group through a rendezvous store, then call
// all_reduce: every rank hands in a tensor and every rank gets back the element-wise sum of all of them.
// Every later stage is built from this one call. ring_allreduce.cpp builds the same sum from sends and
// receives alone, the ring that Gloo and NCCL run inside, and the program checks it against all_reduce.
//
// Run it (two ranks on this machine, through the launcher):
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage01_allreduce
//   ./build/bin/ddp_launch --nproc 4 -- ./build/bin/stage01_allreduce --bench --sizes 1MB,10MB,100MB
// On a GPU (a CUDA build): --backend nccl (one rank per GPU), or --device cuda with Gloo (ranks may share
// one GPU; Gloo copies through host memory); timings then come from CUDA events.
// Correct output: each rank prints its tensor before and after; after, all ranks print the same sums;
// then "PASS ring all-reduce ..."; the last line is "PASS all-reduce ...". The benchmark then prints latency and
// bandwidth per size. The whole grid (sizes x 2/4/6 processes, one table and plot) is scripts/bench/bench_allreduce.sh.
//
// What it leaves for the next stage: nothing is trained yet. Stage 02 uses all_reduce to average
// the gradients of a model that every rank trains on its own slice of the batch.
#include "common/base/format.hpp"  // format_bytes
#include "common/dist/dist.hpp"
#include "common/dist/fault.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/memory.hpp"  // check_fits_in_memory
#include "common/measure/results.hpp"
#include "common/measure/timing.hpp"
#include "stages/01_allreduce/ring_check.hpp"

#include <fmt/ranges.h>

using namespace dp;

// A small int64 tensor as text, wherever it lives.
static std::string show(const torch::Tensor& t) {
  auto c = t.cpu().contiguous();
  return fmt::format("{}", fmt::join(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel(), " "));
}

// Each rank makes a small random integer tensor, and all_reduce must give the sum of all of them.
// We check against the closed form: gather every rank's *input*, add them up ourselves.
static bool demo(ProcessGroup& pg, uint64_t seed) {
  // [demo]
  torch::manual_seed(seed + pg.rank());                                   // a different tensor on every rank
  auto data = torch::randint(0, 10, {4}, torch::kInt64).to(pg.device());  // --device cuda: on the GPU
  print_rank("before all_reduce: {}", show(data));
  auto inputs = pg.all_gather(data);  // [W] tensors of shape [4], in rank order
  pg.all_reduce(data);                // in place: data = sum over ranks
  print_rank("after  all_reduce: {}", show(data));
  // [demo]
  auto expected = torch::stack(inputs).sum(0);
  bool ok = torch::equal(data, expected);
  if (!ok) print_rank("MISMATCH: expected {}", show(expected));
  return ok;
}

// Bus bandwidth: a ring all-reduce moves 2(n-1)/n of the buffer through every link, so algbw x 2(n-1)/n
// is what each link carried per second. It is comparable across process counts; algbw is not.
static double bus_factor(int n) { return n > 1 ? 2.0 * (n - 1) / n : 1.0; }

static void bench(ProcessGroup& pg, const std::vector<std::string>& sizes, int warmup, int iters, double budget_s,
                  Results& results) {
  const int W = pg.world_size();
  int done = 0;
  for (const auto& size_text : sizes) {
    const uint64_t bytes = parse_size(size_text, "--sizes");
    const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
    // [bench]
    auto t = torch::full({n}, static_cast<float>(pg.rank() + 1), torch::TensorOptions().device(pg.device()));
    pg.all_reduce(t);  // correctness first: 1 + 2 + ... + W on every element
    const float want = W * (W + 1) / 2.0f;
    if (!torch::all(t == want).item<bool>())
      throw CheckFailed(fmt::format("all_reduce of {} gave wrong values (expected {} everywhere)", size_text, want));
    t.zero_();  // zeros stay zeros: no overflow or denormals while timing
    pg.barrier();
    auto mine = time_iterations([&] { pg.all_reduce(t); }, warmup, iters, budget_s, pg.device());
    // Every rank may have stopped at a different count when the budget ran out: agree on the minimum.
    auto counts = pg.all_gather(static_cast<double>(mine.size()));
    mine.resize(static_cast<size_t>(*std::min_element(counts.begin(), counts.end())));
    auto s = summarize(max_over_ranks(pg, mine));  // the slowest rank sets each iteration's time
    // [bench]
    double algbw = bytes / s.median / 1e9;
    nlohmann::json row{{"backend", pg.backend()},
                       {"device", pg.device().str()},
                       {"world_size", W},
                       {"link", link_description()},
                       {"size", size_text},
                       {"bytes", bytes},
                       {"iters", s.n},
                       {"iters_requested", iters},
                       {"latency_median_s", s.median},
                       {"latency_min_s", s.min},
                       {"latency_max_s", s.max},
                       {"algbw_GBps", algbw},
                       {"busbw_GBps", algbw * bus_factor(W)}};
    std::string copy_note;
    if (pg.device().is_cuda()) {
      // The yardstick on a GPU: one device-to-device copy of the same buffer (it reads and writes `bytes`
      // each, so memory moves 2 x bytes). The bus bandwidth cannot beat it; NCCL at world 1 is about it.
      auto dst = torch::empty_like(t);
      auto copy = summarize(time_iterations([&] { dst.copy_(t); }, warmup, iters, budget_s, pg.device()));
      row["copy_GBps"] = bytes / copy.median / 1e9;
      copy_note = fmt::format(", a copy of it on the device {:.1f} GB/s", bytes / copy.median / 1e9);
    }
    results.add(row);
    if (s.n < iters) print0("note: --budget reached after {} of {} timed iterations of {}", s.n, iters, size_text);
    // One rank has nothing to send: the time is the call's own cost (NCCL in place does no work at all).
    const std::string bw = W > 1 ? fmt::format("bus bandwidth {:.2f} GB/s", algbw * bus_factor(W))
                                 : std::string("no bandwidth at 1 rank: nothing crosses a link");
    print0("[{}/{}] {} x {} ranks: median {:.3f} ms over {} iterations, {}{}", ++done, sizes.size(), size_text, W,
           s.median * 1e3, s.n, bw, copy_note);
  }
}

int main(int argc, char** argv) {
  Cli cli("stage01_allreduce", "Stage 01: all-reduce demo (checked against the closed form) and benchmark");
  bool run_bench = false;
  std::vector<std::string> sizes{"1MB", "10MB", "100MB"};
  int warmup = 5, iters = 20;
  std::string budget = "10s";
  bool rings = false;
  cli.app().add_flag("--bench", run_bench, "After the demo, benchmark all-reduce at --sizes");
  cli.app().add_flag("--rings", rings,
                     "With --bench on ddp_launch --net: time each ring of ring_allreduce.cpp beside ring_seconds()");
  cli.app()
      .add_option("--sizes", sizes, "Tensor sizes (float32), e.g. 1MB,10MB,100MB,1GB (MB = 10^6 B, MiB = 2^20 B)")
      ->delimiter(',')
      ->check(SizeText)
      ->check(CLI::Validator(
          [](std::string& s) {  // the table's bytes must be the bytes sent: whole floats
            const uint64_t b = parse_size(s);
            return b % sizeof(float) == 0 ? std::string()
                                          : fmt::format(
                                                "size '{}' is {} bytes, not a whole number of 4-byte floats; use "
                                                "a multiple of 4, e.g. {}B",
                                                s, b, (b / 4 + 1) * 4);
          },
          "SIZE"));
  cli.app().add_option("--warmup", warmup, "Untimed iterations before measuring")->check(NonNegativeFinite);
  cli.app().add_option("--iters", iters, "Timed iterations per size")->check(PositiveInt);
  cli.app().add_option("--budget", budget, "Stop measuring a size after this long (e.g. 10s)");
  bench_only(cli.app(),
             {"--sizes", "--warmup", "--iters", "--budget", "--rings"});  // without --bench: refused, not ignored
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;

  return run_main([&] {
    const double budget_s = parse_seconds(budget, "--budget");
    const LaunchEnv env = LaunchEnv::from_environment();
    if (rings && (env.net_bit_s <= 0 || env.world_size < 2))
      throw UsageError(fmt::format(
          "--rings predicts times on a link of known rate between at least 2 ranks (here: {} rank(s), link {}); run "
          "./build/bin/ddp_launch --nproc 3 --net 1gbit -- ./build/bin/stage01_allreduce --bench --rings",
          env.world_size, env.net.empty() ? "none" : env.net));
    // Every rank here holds the largest tensor: a size this machine cannot hold is refused now, not failed
    // in an allocation after the demo. Measured: 1GB at 2 ranks peaks at 1.39 GB resident per rank (LibTorch
    // itself about 0.3 GB, Gloo's buffers little). On a GPU the tensors live in the GPU's memory instead.
    if (run_bench && !cli.dist_options().on_gpu()) {
      uint64_t largest = 0;
      for (const auto& size : sizes) largest = std::max(largest, parse_size(size, "--sizes"));
      check_fits_in_memory(1.1 * static_cast<double>(largest) + 0.4e9, env.ranks_on_this_machine(),
                           "--sizes " + format_bytes(static_cast<double>(largest)),
                           "use smaller --sizes or fewer ranks");
    }
    configure_cpu_threads();
    check_blas();
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    print0("process group: backend {}, world size {}, device {}", pg.backend(), pg.world_size(), pg.device().str());

    maybe_inject_fault(pg.rank());      // hardening tests only (DP_FAULT); a no-op otherwise
    maybe_inject_collective_fault(pg);  // docs/debugging.md: DP_FAULT=misorder@R
    const bool ok = demo(pg, cli.common().seed);
    auto oks = pg.all_gather(ok ? 1.0 : 0.0);  // every rank learns whether every rank passed
    if (std::count(oks.begin(), oks.end(), 1.0) != pg.world_size())
      throw CheckFailed("all_reduce result differs from the sum of the inputs on some rank");
    const bool ring_ok = check_rings(pg, cli.common().seed);
    auto ring_oks = pg.all_gather(ring_ok ? 1.0 : 0.0);
    if (std::count(ring_oks.begin(), ring_oks.end(), 1.0) != pg.world_size())
      throw CheckFailed("a ring of ring_allreduce.cpp differs from the library's collective on some rank");
    print0(
        "PASS ring reduce-scatter, all-gather, all-reduce and the alternate ring from sends and receives equal "
        "the library's ({}, 1001 elements)",
        count_of(pg.world_size(), "rank"));

    if (run_bench && rings) {
      Results results("rings");
      const bool ok_rings = bench_rings(pg, sizes, warmup, iters, budget_s, results);
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
      if (!ok_rings)
        throw CheckFailed(fmt::format("a ring's time is outside {:.0f}% of ring_seconds()'s prediction (exercise 01.4)",
                                      kRingTolerance * 100));
      print0("PASS every ring's time within {:.0f}% of ring_seconds()'s prediction (those of 20 ms or more)",
             kRingTolerance * 100);
    } else if (run_bench) {
      Results results("allreduce");
      bench(pg, sizes, warmup, iters, budget_s, results);
      std::vector<std::string> keys{"backend",          "world_size", "size",      "iters",
                                    "latency_median_s", "algbw_GBps", "busbw_GBps"};
      std::vector<std::string> heads{"backend",      "ranks",       "size", "iters", "median latency (s)",
                                     "algbw (GB/s)", "busbw (GB/s)"};
      if (pg.device().is_cuda()) {
        keys.push_back("copy_GBps");
        heads.push_back("device copy (GB/s)");
      }
      print0("\n{}", results.markdown(keys, heads));
      if (pg.rank() == 0 && !cli.common().json.empty()) results.write_json(cli.common().json, command_line(argc, argv));
    }
    pg.barrier();
    print0("PASS all-reduce over {} ranks ({}) equals the sum of the inputs", pg.world_size(), pg.backend());
    pg.shutdown();
    return 0;
  });
}
