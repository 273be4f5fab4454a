// Memory measurement: training bytes counted tensor by tensor, resident memory (RSS) and CUDA peaks.
// Tensor bytes come from the tensors themselves, resident memory from the operating system; what they
// should come to is common/measure/accounting.hpp.
#pragma once

#include "common/measure/accounting.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dp {

/// Bytes of a list of tensors (elements x element size; undefined tensors count 0).
int64_t tensor_bytes(const std::vector<torch::Tensor>& tensors);

/// Bytes of the state tensors of an Adam, AdamW or SGD optimizer (exp_avg, exp_avg_sq, max_exp_avg_sq,
/// momentum_buffer). Other optimizer types count 0.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& opt);

/// Counts a model's parameters and gradients (tied weights once) and an optimizer's state.
TrainingBytes count_training_bytes(const torch::nn::Module& model, const torch::optim::Optimizer& opt);
/// The same over a list of tensors (each once), such as the shards a rank keeps between steps.
TrainingBytes count_training_bytes(const std::vector<torch::Tensor>& params, const torch::optim::Optimizer& opt);

/// Peak resident set size of this process so far (VmHWM in /proc/self/status, or getrusage's
/// ru_maxrss when /proc is missing), in bytes.
int64_t peak_rss_bytes();

/// Current resident set size (VmRSS), in bytes; 0 when unknown.
int64_t current_rss_bytes();

/// Gives freed heap memory back to the OS (malloc_trim) and resets the peak to the current RSS
/// (writes "5" to /proc/self/clear_refs, Linux >= 4.0). Returns false if the reset is not allowed.
bool reset_peak_rss();

/// Makes glibc serve every allocation of `bytes` or more with its own mmap, unmapped (returned to the
/// OS) when freed: M_MMAP_THRESHOLD fixed at `bytes`. By default glibc raises that threshold each time a
/// large block is freed (up to 32 MB), after which freed tensors of that size stay in the heap, holes
/// between live ones are never returned, and resident memory stops following the live tensors (measured
/// on FSDP `medium`, 2 ranks: 10.7 GB resident per rank for 3.4 GB of tensors). The price: fresh pages
/// (page faults) for every large allocation. Returns false if glibc refused.
bool map_large_allocations(size_t bytes = size_t(1) << 20);

/// MemAvailable of /proc/meminfo: what this machine can still give processes without swapping, in
/// bytes; 0 when unknown. The environment variable DP_AVAILABLE_MEMORY_BYTES (a whole number of bytes)
/// stands in for it, so that tests reach the refusals below on any machine; a value that is not one
/// throws dp::UsageError naming it.
int64_t available_memory_bytes();

/// Throws dp::UsageError (exit 2) when `ranks_here` processes needing about `bytes_per_rank` each would
/// not fit in available_memory_bytes(), before anything is allocated, so that the kernel's OOM killer
/// does not end the run halfway. The message names `what`, the figures and `remedy`. Does nothing when
/// the available memory is unknown. `available` >= 0 replaces available_memory_bytes() (a GPU's memory:
/// cuda_total_memory_bytes()), and `where` names what holds it in the message.
void check_fits_in_memory(double bytes_per_rank, int ranks_here, const std::string& what, const std::string& remedy,
                          double available = -1, const std::string& where = "this machine");

/// Where a rank's tensors live, for check_fits_in_memory(): this machine's available memory, shared by its
/// `local_ranks` ranks, or (`on_gpu`) one GPU's total memory, shared by the ranks bound to it (its total: every
/// rank decides alike, whatever the others allocated already).
struct MemoryPool {
  double available = 0;  ///< bytes (0: unknown, and check_fits_in_memory() checks nothing)
  int ranks = 1;         ///< the ranks that share it
  std::string where;     ///< "this machine" or "one GPU", for messages
};
MemoryPool memory_pool(int local_ranks, bool on_gpu);

/// Peak bytes allocated by the CUDA caching allocator on `device` since the last reset_cuda_peak()
/// (on a GPU the number that matters, not the host's RSS); 0 for a CPU device or a build without CUDA.
int64_t cuda_peak_allocated_bytes(const torch::Device& device);

/// Resets that peak; does nothing for a CPU device or without CUDA.
void reset_cuda_peak(const torch::Device& device);

/// Bytes allocated by the CUDA caching allocator on `device` now; 0 for a CPU device or without CUDA.
int64_t cuda_allocated_bytes(const torch::Device& device);

/// Total memory of the GPU `device` (cudaDeviceProp::totalGlobalMem: the same for every rank that asks,
/// where its free memory depends on what the others allocated so far); 0 for a CPU device or without CUDA.
int64_t cuda_total_memory_bytes(const torch::Device& device);

/// How many of this node's `local_ranks` ranks keep their tensors on one GPU when they compute on CUDA:
/// rank i binds GPU i mod the GPUs visible (common/dist/dist.cpp), so ceil(local_ranks / GPUs); NCCL's one GPU
/// per rank gives 1, Gloo's ranks may share one.
int ranks_per_gpu(int local_ranks);

}  // namespace dp
