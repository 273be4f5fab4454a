// Stage 06's benchmark: the Transformer trained with plain AdamW (DDP), the CS336 design and true ZeRO-1,
// each measured for memory (tensor bytes and peak RSS around the first step) and speed.
#pragma once

#include "common/ddp_bench.hpp"
#include "common/dist.hpp"
#include "common/results.hpp"

#include <string>
#include <vector>

namespace dp {

/// What the benchmark runs.
struct Stage06Options {
  BenchConfig cfg;
  std::string which = "both";   ///< --optimizer: adamw | sharded | both
  std::string design = "all";   ///< --design: cs336 | zero1 | all (which sharded designs)
};

/// The sharded designs selected by `design`, in table order.
std::vector<std::string> selected_designs(const std::string& design);

/// Trains and measures every selected variant, one row each into `results`.
void run_benchmark(ProcessGroup& pg, const Stage06Options& o, Results& results);

/// The memory table and the time table (rank 0 prints them).
void print_tables(const Results& r);

}  // namespace dp
