// Process-level plumbing shared by every program: exit codes, CPU threads per rank, and the slow-BLAS
// check. It brings errors.hpp and log.hpp along: every program throws those errors and prints that way.
#pragma once

#include "common/base/errors.hpp"
#include "common/base/log.hpp"

#include <functional>
#include <string>

namespace dp {

/// Runs `body` and turns exceptions into exit codes: UsageError -> 2, anything else -> 1,
/// each printed as one `[rank r/W] error: ...` line on stderr. Returns body's code or that one.
int exit_code_of(const std::function<int()>& body);

/// Ends the process with exit code `code`: flushes stdout and stderr and leaves through _exit(), without the
/// destructors of globals (LibTorch's cost 0.2-0.3 s of CPU a process), so everything the process writes
/// must be written before.
[[noreturn]] void flush_and_exit(int code);

/// flush_and_exit(code), unless DP_FULL_EXIT=1 is in the environment (a leak checker wants every
/// destructor): then it returns `code`, for main() to return.
int leave_process(int code);

/// What every program's main() returns: leave_process(exit_code_of(body)).
int run_main(const std::function<int()>& body);

/// Gives this rank its share of the CPU: if OMP_NUM_THREADS is set (our launcher and torchrun set
/// it) torch uses that many threads; otherwise cores / LOCAL_WORLD_SIZE. Also keeps freed memory in
/// the heap (glibc otherwise returns big blocks to the kernel every step). Returns the thread count.
int configure_cpu_threads();

/// Sets this process's compute threads to `n` now: LibTorch's intra-op pool and, when the BLAS is
/// OpenBLAS, its own thread pool (which LibTorch does not resize). Benchmarks use it to run one
/// single-process step with every core between data-parallel steps that use a share of them.
void set_cpu_threads(int n);

/// K when the launcher pinned each rank to K cores of its own (ddp_launch --cpus-per-rank K, DP_CPUS_PER_RANK),
/// as each rank owns a GPU on a cluster; 0 when the ranks share the machine's cores.
int cpus_per_rank();

/// Threads for one process that stands for the whole job in a benchmark (the single-process step data
/// parallelism must beat): cpus_per_rank() where the ranks are pinned, so that N ranks have N times its
/// compute; otherwise every core of the machine.
int single_process_threads();

/// Times a 512x512 float matmul and looks at which BLAS library is loaded. With Debian's reference
/// BLAS (about 2 GFLOP/s instead of tens), or below `warn_below` GFLOP/s, it prints a warning with the
/// remedy (install libopenblas0-pthread). Also warns when OpenBLAS fell back to its Prescott kernels on a CPU
/// with AVX2 (it did not know the model; the remedy: OPENBLAS_CORETYPE, which ddp_launch sets). Returns the
/// measured GFLOP/s.
double check_blas(double warn_below = 1.0, bool quiet = false);

}  // namespace dp
