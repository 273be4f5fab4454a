// Extension 06d's benchmark: the Transformer trained with plain AdamW (DDP), extension 06b's CS336 design and
// stage 06's ZeRO-1, one after the other, each measured for memory (tensor bytes and peak RSS around the first
// optimizer step, CS336's optimizer_state_sharding_accounting) and speed.
#pragma once

#include "common/dist/dist.hpp"
#include "common/harness/ddp_bench.hpp"
#include "common/measure/results.hpp"

#include <string>
#include <vector>

namespace dp {

/// What the benchmark runs.
struct MemoryBenchOptions {
  BenchConfig cfg;
  std::string which = "both";  ///< --optimizer: adamw | sharded | both
  std::string design = "all";  ///< --design: cs336 | zero1 | all (which sharded designs)
};

/// Trains and measures every selected variant, one row each into `results`.
void run_benchmark(ProcessGroup& pg, const MemoryBenchOptions& o, Results& results);

/// The memory table and the time table (rank 0 prints them).
void print_tables(const Results& r);

}  // namespace dp
