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

/// One way of synchronizing gradients to benchmark. `make` is nullptr for the no-communication baseline.
struct Variant {
  std::string name;
  MakeGradSync make;
};

/// One variant's measurements (seconds; medians over timed steps of the slowest rank).
struct BenchRow {
  std::string variant;
  Stats step;            ///< whole step: forward, backward, gradient sync, optimizer
  Stats comm;            ///< time inside GradSync::after_backward (communication not hidden by backward)
  int64_t calls = 0;     ///< collectives per step, from GradSync::calls_per_step() (0 for the baseline)
  double ratio = 1;      ///< median over rounds of (this step / the baseline's step in the same round)
  int group = 0;         ///< which group of interleaved variants it was measured in
  double exposed_s = 0;  ///< median step minus the group's no-communication median step
};

/// Benchmarks every variant on the same Transformer, batch and AdamW, with the no-communication
/// baseline. Variants are *interleaved*: step i of every variant runs before step i+1 of any, so a
/// machine that drifts (other load, clock changes) shifts all variants alike, and each variant's
/// ratio to the baseline is taken round by round. When all models do not fit in memory at once (about
/// 20 bytes per parameter each), the variants are split into groups, each with its own baseline.
/// Every rank must call it with the same arguments. Rows: the baseline first, then the variants.
std::vector<BenchRow> bench_variants(ProcessGroup& pg, const BenchConfig& cfg, const std::vector<Variant>& variants);

/// Throws dp::UsageError when `cfg` names an unknown preset or a batch that W ranks cannot split.
/// Programs call it before their checks, so bad input fails in a second, not after minutes.
void validate_bench_config(const BenchConfig& cfg, int world);

/// Adds the standard CLI options (--preset, --batch, --context, --warmup, --steps, --budget) to `app`.
void add_bench_options(CLI::App& app, BenchConfig& cfg, std::string& budget_text);

/// Prints (rank 0) what is benchmarked: model, parameter count and bytes of parameters, gradients and
/// AdamW state, batch, context and ranks.
void print_bench_header(const ProcessGroup& pg, const BenchConfig& cfg);

/// Adds every row to `results` (exposed communication and ratios against its group's baseline) and
/// prints one line per row.
void record(Results& results, const std::vector<BenchRow>& rows, const BenchConfig& cfg, int world);

/// The table every DDP stage prints.
std::string ddp_table(const Results& results);

}  // namespace dp
