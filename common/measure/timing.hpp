// Timing: warm-up then measured iterations, robust statistics, and the slowest rank's view.
#pragma once

#include "common/base/libtorch.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <vector>

namespace dp {

class ProcessGroup;
class Mesh;

/// Waits for all queued device work (CUDA kernels) so a wall clock can be read; no-op on CPU.
void sync_device(const torch::Device& device);

/// A wall-clock stopwatch in seconds. On a CUDA device it synchronizes before reading the clock,
/// because kernels and NCCL calls return before the work is done.
class Timer {
 public:
  explicit Timer(torch::Device device = torch::kCPU) : device_(device) { start(); }
  void start();
  /// Seconds since start().
  double seconds() const;

 private:
  torch::Device device_;
  std::chrono::steady_clock::time_point t0_;
};

/// Median, minimum, maximum and mean of a sample (seconds).
struct Stats {
  double median = 0, min = 0, max = 0, mean = 0;
  int n = 0;
};
Stats summarize(std::vector<double> xs);

/// The least-squares slope of log y over log x (how y grows with x: 0 flat, 0.5 as sqrt x); 0 for fewer than two
/// distinct x. Every value must be positive.
double log_log_slope(const std::vector<double>& x, const std::vector<double>& y);

/// Per-iteration maximum over ranks: iteration i took as long as its slowest rank.
/// Every rank must call it with the same number of samples.
std::vector<double> max_over_ranks(ProcessGroup& pg, const std::vector<double>& per_iter);

/// Runs `fn` `warmup` times, then times it `iters` times (stopping early after `budget_s` seconds
/// of measurement, at least 1 iteration); returns the per-iteration seconds on this rank.
/// On a CUDA device each iteration is timed by CUDA events recorded on the current stream, which a
/// blocking collective orders after its communication stream; on the CPU, by the wall clock.
std::vector<double> time_iterations(const std::function<void()>& fn, int warmup, int iters, double budget_s = 1e9,
                                    torch::Device device = torch::kCPU);

/// The overhead model of one all-reduce of b bytes: about o + b / w seconds, o the fixed cost of a call
/// and w the bandwidth. Stage 05 uses it to predict the best bucket size.
struct CommModel {
  double o = 0;  ///< seconds per call
  double w = 0;  ///< bytes per second
  /// The bucket cap that minimises t(n_b) = s / (n_b w) + n_b o for `grad_bytes` s of gradients: after
  /// backward the last bucket (s / n_b bytes) is still to send, and every call costs o. The minimum is at
  /// n_b = sqrt(s / (w o)), a cap of sqrt(s w o) bytes; returned in MB (10^6 bytes).
  double best_bucket_cap_mb(double grad_bytes) const;
};

/// The bus bandwidth, in bits/s, of an all-reduce of `bytes` (fp32 ones) among the ranks of `group` while the
/// other ranks of `world` wait: 2(n-1)/n x bytes x 8 over the median, of `rounds` rounds after a warm-up, of the
/// slowest member's time, n = group.world_size() (stage 10 measures each tier of a cluster alone with it). Every
/// rank of `world` calls it, `member` saying whether it takes part; what a non-member gets back means nothing.
double bus_bandwidth_alone(ProcessGroup& world, ProcessGroup& group, bool member, double bytes, int rounds = 5);

/// Each tier of a cluster measured alone with bus_bandwidth_alone(): an all-reduce of `bytes` among node 0's ranks
/// (the link inside a node), then among the ranks of local index 0, one per node (the uplinks). Prints one line
/// per tier (rank 0), each against its link's rate from the launch environment (ddp_launch --net, --net-uplink),
/// and returns them as {"inside a node": {ranks, busbw_bit_s, link_bit_s}, "across nodes": {...}}; a tier of one
/// rank is left out. A collective of the mesh's world.
nlohmann::json measure_tiers(Mesh& mesh, double bytes);

/// Measures o and w on `pg` (collective): the slowest rank's median of a 4 kB all-reduce, which is all
/// overhead (4 kB at GB/s is microseconds), gives o; a 32 MB one, mostly bytes, gives w.
CommModel measure_comm_model(ProcessGroup& pg);

}  // namespace dp
