// Memory measurement: tensor bytes from the tensors themselves, resident memory from /proc.
#include "common/measure/memory.hpp"

#include "common/dist/runtime.hpp"

#include <fmt/format.h>
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_set>

#ifdef DP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace dp {

bool map_large_allocations(size_t bytes) { return mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes)) == 1; }

int64_t available_memory_bytes() {
  // A stand-in machine's memory, so that a test can reach the memory refusals without filling this one.
  if (const char* text = std::getenv("DP_AVAILABLE_MEMORY_BYTES")) {
    char* end = nullptr;
    errno = 0;
    const long long bytes = std::strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno == ERANGE || bytes <= 0)
      throw UsageError(
          fmt::format("DP_AVAILABLE_MEMORY_BYTES={}: not a whole number of bytes above 0; unset it to "
                      "read this machine's /proc/meminfo",
                      text));
    return bytes;
  }
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

void check_fits_in_memory(double bytes_per_rank, int ranks_here, const std::string& what, const std::string& remedy,
                          double available, const std::string& where) {
  const double avail = available >= 0 ? available : static_cast<double>(available_memory_bytes());
  const double need = bytes_per_rank * ranks_here;
  if (avail <= 0 || need <= avail) return;
  throw UsageError(
      fmt::format("{} needs about {:.1f} GB per rank, {:.1f} GB for the {} rank(s) on {}, "
                  "which has {:.1f} GB available: {}",
                  what, bytes_per_rank / 1e9, need / 1e9, ranks_here, where, avail / 1e9, remedy));
}

namespace optim = torch::optim;

int64_t tensor_bytes(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors)
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

int64_t optimizer_state_bytes(const optim::Optimizer& opt) {
  int64_t n = 0;
  for (const auto& kv : opt.state()) {
    const auto* st = kv.second.get();
    if (auto* a = dynamic_cast<const optim::AdamWParamState*>(st))
      n += tensor_bytes({a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()});
    else if (auto* b = dynamic_cast<const optim::AdamParamState*>(st))
      n += tensor_bytes({b->exp_avg(), b->exp_avg_sq(), b->max_exp_avg_sq()});
    else if (auto* c = dynamic_cast<const optim::SGDParamState*>(st))
      n += tensor_bytes({c->momentum_buffer()});
  }
  return n;
}

TrainingBytes count_training_bytes(const torch::nn::Module& model, const optim::Optimizer& opt) {
  return count_training_bytes(model.parameters(), opt);
}

TrainingBytes count_training_bytes(const std::vector<torch::Tensor>& params, const optim::Optimizer& opt) {
  TrainingBytes b;
  std::unordered_set<const void*> seen;
  for (const auto& p : params) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;  // tied weights once
    b.params += tensor_bytes({p});
    b.grads += tensor_bytes({p.grad()});
  }
  b.state = optimizer_state_bytes(opt);
  return b;
}

namespace {
// A "Field:   123 kB" line of /proc/self/status, in kB; -1 when absent.
int64_t proc_status_kb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream ss(line.substr(field.size() + 1));
    int64_t kb = 0;
    ss >> kb;
    return kb;
  }
  return -1;
}
}  // namespace

int64_t peak_rss_bytes() {
  int64_t kb = proc_status_kb("VmHWM");
  if (kb < 0) {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    kb = ru.ru_maxrss;  // kilobytes on Linux
  }
  return kb * 1024;
}

int64_t current_rss_bytes() {
  int64_t kb = proc_status_kb("VmRSS");
  return kb < 0 ? 0 : kb * 1024;
}

bool reset_peak_rss() {
  malloc_trim(0);  // freed tensors may still sit in malloc's free lists and count as resident
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

int64_t cuda_peak_allocated_bytes([[maybe_unused]] const torch::Device& device) {
#ifdef DP_WITH_CUDA
  // Index 0 of the stat arrays is the aggregate over small and large pools.
  if (device.is_cuda()) return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
#endif
  return 0;
}

void reset_cuda_peak([[maybe_unused]] const torch::Device& device) {
#ifdef DP_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

int64_t cuda_allocated_bytes([[maybe_unused]] const torch::Device& device) {
#ifdef DP_WITH_CUDA
  if (device.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
#endif
  return 0;
}

int64_t cuda_total_memory_bytes([[maybe_unused]] const torch::Device& device) {
#ifdef DP_WITH_CUDA
  cudaDeviceProp prop{};
  if (device.is_cuda() && cudaGetDeviceProperties(&prop, std::max<int>(0, device.index())) == cudaSuccess)
    return static_cast<int64_t>(prop.totalGlobalMem);
#endif
  return 0;
}

int ranks_per_gpu(int local_ranks) {
  const int gpus = std::max<int>(1, static_cast<int>(torch::cuda::device_count()));
  return (std::max(1, local_ranks) + gpus - 1) / gpus;
}

MemoryPool memory_pool(int local_ranks, bool on_gpu) {
  if (on_gpu)
    return {static_cast<double>(cuda_total_memory_bytes(torch::Device(torch::kCUDA, 0))), ranks_per_gpu(local_ranks),
            "one GPU"};
  return {static_cast<double>(available_memory_bytes()), local_ranks, "this machine"};
}

}  // namespace dp
