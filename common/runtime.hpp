// Process-level plumbing shared by every program: errors and exit codes, rank-aware printing,
// CPU threads per rank, and the slow-BLAS check.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <stdexcept>
#include <string>

namespace dp {

/// Bad input from the user (an option, an environment variable, a file). Programs exit with code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A self-check failed (results differ from the reference). Programs exit with code 1.
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Runs `body` and turns exceptions into exit codes: UsageError -> 2, anything else -> 1,
/// each printed as one `[rank r/W] error: ...` line on stderr.
int run_main(const std::function<int()>& body);

/// Rank and world size used by the printing helpers (set once the process group exists).
void set_log_rank(int rank, int world_size);
int log_rank();
int log_world();

/// Prints a line from rank 0 only (summaries, tables, verdicts).
template <typename... Args>
void print0(fmt::format_string<Args...> f, Args&&... args) {
  if (log_rank() == 0) fmt::print("{}\n", fmt::format(f, std::forward<Args>(args)...)), std::fflush(stdout);
}
/// Prints a line from every rank, prefixed with `[rank r/W]`.
template <typename... Args>
void print_rank(fmt::format_string<Args...> f, Args&&... args) {
  fmt::print("[rank {}/{}] {}\n", log_rank(), log_world(), fmt::format(f, std::forward<Args>(args)...));
  std::fflush(stdout);
}

/// Gives this rank its share of the CPU: if OMP_NUM_THREADS is set (our launcher and torchrun set
/// it) torch uses that many threads; otherwise cores / LOCAL_WORLD_SIZE. Also keeps freed memory in
/// the heap (glibc otherwise returns big blocks to the kernel every step). Returns the thread count.
int configure_cpu_threads();

/// Sets this process's compute threads to `n` now: LibTorch's intra-op pool and, when the BLAS is
/// OpenBLAS, its own thread pool (which LibTorch does not resize). Benchmarks use it to run one
/// single-process step with every core between data-parallel steps that use a share of them.
void set_cpu_threads(int n);

/// Times a 1024x1024 float matmul and looks at which BLAS library is loaded. With Debian's reference
/// BLAS (about 2 GFLOP/s instead of tens), or below `warn_below` GFLOP/s, it prints a warning with the
/// remedy (install libopenblas0-pthread). Returns the measured GFLOP/s.
double check_blas(double warn_below = 1.0, bool quiet = false);

/// Fault injection for the hardening tests: with DP_FAULT=hang@R rank R blocks forever here, with
/// DP_FAULT=die@R it is killed by SIGKILL here. Does nothing when DP_FAULT is unset or names another
/// action (dp::maybe_inject_collective_fault() handles misorder@R).
void maybe_inject_fault(int rank);

/// True when DP_FAULT is ACTION@R with `action` and R == `rank`.
bool fault_requested(const std::string& action, int rank);

}  // namespace dp
