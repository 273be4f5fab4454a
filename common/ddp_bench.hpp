// The DDP benchmark every training stage shares: the same Transformer, batch and optimizer, timed the
// same way, so stages differ only in how they synchronize gradients.
#pragma once

#include "common/ddp_check.hpp"
#include "common/results.hpp"
#include "common/timing.hpp"

#include <string>
#include <vector>

namespace dp {

/// What to train and how long to time it.
struct BenchConfig {
  std::string preset = "small";  ///< Transformer size preset (tiny, small, ..., xl, 2.7b)
  int64_t global_batch = 4;      ///< sequences per step, split evenly over the ranks
  int64_t context = 128;         ///< tokens per sequence
  int warmup = 2;                ///< untimed steps
  int steps = 5;                 ///< timed steps (fewer if the budget runs out)
  double budget_s = 120;         ///< stop timing a variant after this long
};

/// One variant's measurements (seconds; medians over timed steps of the slowest rank).
struct BenchRow {
  std::string variant;
  Stats step;     ///< whole step: forward, backward, gradient sync, optimizer
  Stats comm;     ///< time spent inside GradSync::after_backward (communication not hidden by backward)
  int64_t calls = 0;  ///< collectives per step (reported by the variant, -1 if unknown)
};

/// Trains the Transformer with AdamW for warmup + steps steps, synchronizing gradients with the
/// GradSync that `make` builds (nullptr: no communication at all, the baseline every variant is
/// compared with). Every rank must call it with the same arguments.
BenchRow bench_ddp(ProcessGroup& pg, const BenchConfig& cfg, const std::string& variant, const MakeGradSync& make,
                   int64_t calls_per_step = -1);

/// Throws dp::UsageError when `cfg` names an unknown preset or a batch that W ranks cannot split.
/// Programs call it before their checks, so bad input fails in a second, not after minutes.
void validate_bench_config(const BenchConfig& cfg, int world);

/// Adds the standard CLI options (--preset, --batch, --context, --warmup, --steps, --budget) to `app`.
void add_bench_options(CLI::App& app, BenchConfig& cfg, std::string& budget_text);

/// Adds `row` to `results` with ratios against `baseline` (the no-communication step) and prints a line.
void record(Results& results, const BenchRow& row, const BenchRow& baseline, const BenchConfig& cfg, int world);

/// The table every DDP stage prints.
std::string ddp_table(const Results& results);

}  // namespace dp
