// Extension 07a's benchmark: the Transformer trained with stage 05's bucketed DDP, stage 06's ZeRO-1 and
// stage 07's FSDP (resharding after forward or keeping the gathered weights), step by step in turn, for
// memory and speed.
#pragma once

#include "common/dist/dist.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/measure/results.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <string>
#include <vector>

namespace dp {

/// What the benchmark runs.
struct FsdpBenchOptions {
  BenchConfig cfg;
  /// "ddp", "zero1", "fsdp" (reshard after forward), "fsdp-keep" (keep gathered weights until backward)
  std::vector<std::string> variants{"ddp", "fsdp", "fsdp-keep"};
  torch::ScalarType compute_dtype = torch::kFloat32;  ///< --compute-dtype, for the FSDP variants
  /// The ranks compute on GPUs (--device cuda, or --backend nccl): check_memory() counts one GPU's memory,
  /// shared by the ranks bound to it, instead of this machine's.
  bool cuda = false;
};

/// Estimated bytes one rank needs for `variant` (training state, gathered units, activations).
double estimated_bytes_per_rank(const FsdpBenchOptions& o, const std::string& variant, int world);

/// Drops the variants that the ranks of this machine (o.cuda: of one GPU) cannot hold together (with a
/// note); throws dp::UsageError (exit 2, with the figures and the remedy) when not even FSDP fits. Call
/// before any work.
void check_memory(FsdpBenchOptions& o, int world);

/// Trains every variant in turn, step by step; one row per variant into `results`. On CUDA the rows also
/// carry the caching allocator's figures: peak_cuda_MB (the process's peak allocated, as peak RSS: one
/// variant per process only) and step_peak_cuda_MB (the most a variant's step allocated on top of what was
/// allocated before it, after its first step: gathered units, activations, gradients in flight).
void run_benchmark(ProcessGroup& pg, const FsdpBenchOptions& o, Results& results);

/// The memory table and the time table (rank 0 prints them).
void print_tables(const Results& r);

}  // namespace dp
