// Exit codes, CPU threads per rank and the slow-BLAS check.
#include "common/dist/runtime.hpp"

#include "common/base/format.hpp"
#include "common/dist/launch_env.hpp"

#include "common/base/libtorch.hpp"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <thread>

namespace dp {
namespace {

int env_positive(const char* name) {
  const char* s = std::getenv(name);
  if (!s || !*s) return 0;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  return (*end == '\0' && v > 0 && v < 4096) ? static_cast<int>(v) : 0;
}
}  // namespace

int exit_code_of(const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    fmt::print(stderr, "{} error: {}\n", log_tag(), e.what());
    return 2;
  } catch (const CannotContinue& e) {
    fmt::print(stderr, "{} error: {}\n", log_tag(), e.what());
    return kCannotContinueCode;
  } catch (const CheckFailed& e) {
    fmt::print(stderr, "{} CHECK FAILED: {}\n", log_tag(), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{} error: {}\n", log_tag(), first_line(e.what()));
    return 1;
  }
}

// Every file the program writes is closed by the time its body returns (each is written and closed inside it);
// what is left to destroy is LibTorch's globals. Their destructors (the operator registry deregistering each of
// its thousands of kernels) cost 0.2-0.3 s of CPU per rank process, measured with `perf stat` on stage 05's
// checks: 3.9 s of CPU for 4 ranks, 2.8 s with _exit(); the default suite went from 477 s to 405 s.
void flush_and_exit(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  _exit(code);
}

int leave_process(int code) {
  if (std::getenv("DP_FULL_EXIT")) return code;  // for a leak checker: every destructor runs
  flush_and_exit(code);
}

int run_main(const std::function<int()>& body) { return leave_process(exit_code_of(body)); }

// glibc hands large freed blocks back to the kernel (munmap, or trimming the heap) and the next step
// page-faults them in again: hundreds of MB per training step, and the first steps of a process are
// slower than later ones while its thresholds adapt. Keeping freed memory in the heap makes step times
// steady (the reason PyTorch suggests jemalloc or tcmalloc for CPU training).
static void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 512 << 20);  // blocks below 512 MiB come from the heap...
  mallopt(M_TRIM_THRESHOLD, 1 << 30);    // ...and stay there once freed (up to 1 GiB of slack)
}

int configure_cpu_threads() {
  keep_freed_memory();
  // torchrun's rule: ranks that share a machine split its cores, or they oversubscribe and every
  // rank runs slower than one alone. Our launcher exports OMP_NUM_THREADS; honour it (and a user's).
  int n = env_positive("OMP_NUM_THREADS");
  if (n == 0) {
    const int local = std::max(1, LaunchEnv::from_environment().ranks_on_this_machine());
    n = std::max(1u, std::thread::hardware_concurrency() / local);
  }
  torch::set_num_threads(n);
  return n;
}

int cpus_per_rank() { return env_positive("DP_CPUS_PER_RANK"); }

int single_process_threads() {
  const int pinned = cpus_per_rank();
  return pinned > 0 ? pinned : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void set_cpu_threads(int n) {
  torch::set_num_threads(n);
  // OpenBLAS (pthread build) sizes its pool from OPENBLAS_NUM_THREADS at load time; resize it too.
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
}

// Which BLAS did the dynamic loader pick for libblas.so.3 (Debian's alternatives)? The reference
// BLAS lives in .../blas/, OpenBLAS in .../openblas-pthread/ (or -openmp, -serial).
static std::string loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("libblas.so") != std::string::npos)
      return line.find("/blas/libblas.so") != std::string::npos ? "reference" : "optimized";
  return "unknown";
}

// OpenBLAS on its Prescott (SSE3) kernels on a CPU that has AVX2: it did not know the CPU's model (Debian 12's
// 0.3.21 on newer Xeons), and matmuls run about 4x slower. Returns the OPENBLAS_CORETYPE that fixes it, else "".
// The launcher sets that variable by the same rule (tools/launch/options.cpp), so this warns only for runs
// started another way (torchrun, srun, a program run alone).
static std::string better_openblas_core() {
  using CoreName = char* (*)();
  auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!corename || std::getenv("OPENBLAS_CORETYPE") || std::string(corename()) != "Prescott") return "";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell" : "";
}

double check_blas(double warn_below, bool quiet) {
  // 512 x 512: 0.27 GFLOP a product, a few ms with OpenBLAS and about a second with the reference BLAS.
  // Every process of every run pays it (1024 x 1024 cost about 0.3 s a process on 2 busy cores).
  constexpr int64_t n = 512;
  auto a = torch::randn({n, n});
  auto b = torch::randn({n, n});
  auto c = torch::mm(a, b);  // first call pays for thread-pool start-up
  const int reps = 4;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) c = torch::mm(a, b);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double gflops = reps * 2.0 * n * n * n / s / 1e9;
  // The reference BLAS is ~100x slower than OpenBLAS; a busy machine is only a few times slower, so
  // the library's name decides, and the speed only backs it up.
  bool reference = loaded_blas() == "reference";
  if ((reference || gflops < warn_below) && !quiet && log_rank() == 0) {
    fmt::print(stderr,
               "warning: a {}x{} float matmul ran at {:.1f} GFLOP/s on {} thread(s){}. Install an optimized "
               "BLAS: apt-get install libopenblas0-pthread\n",
               n, n, gflops, torch::get_num_threads(),
               reference ? " with the reference BLAS (libblas.so.3 from Debian's 'libblas3')" : "");
  }
  if (const auto core = better_openblas_core(); !core.empty() && !quiet && log_rank() == 0)
    fmt::print(stderr,
               "warning: OpenBLAS does not know this CPU and runs its Prescott (SSE3) kernels: matmuls about 4x "
               "slower ({:.1f} GFLOP/s here). Start the program through ddp_launch, which sets OPENBLAS_CORETYPE, or "
               "export OPENBLAS_CORETYPE={}\n",
               gflops, core);
  return gflops;
}

}  // namespace dp
