// Timing: warm-up then measured iterations, robust statistics, and the slowest rank's view.
#pragma once

#include "common/base/libtorch.hpp"

#include <chrono>
#include <functional>
#include <vector>

namespace dp {

class ProcessGroup;

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

/// Measures o and w on `pg` (collective): the slowest rank's median of a 4 kB all-reduce, which is all
/// overhead (4 kB at GB/s is microseconds), gives o; a 32 MB one, mostly bytes, gives w.
CommModel measure_comm_model(ProcessGroup& pg);

}  // namespace dp
