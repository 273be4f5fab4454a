// The DDP benchmark every training stage shares: the same Transformer, batch and optimizer, timed the
// same way, so stages differ only in how they synchronize gradients.
#pragma once

#include "common/contract/grad_sync.hpp"
#include "common/contract/strategy.hpp"
#include "common/measure/accounting.hpp"
#include "common/measure/results.hpp"
#include "common/measure/timing.hpp"

#include <string>
#include <vector>

namespace CLI {
class App;  // CLI11's, from <CLI/CLI.hpp> where the options are added: its header is not for every includer
}

namespace dp {

/// What to train and how long to time it.
struct BenchConfig {
  std::string preset = "small";  ///< Transformer size preset (tiny, small, ..., xl, 2.7b)
  int64_t global_batch = 4;      ///< sequences per step, split evenly over the ranks
  int64_t context = 128;         ///< tokens per sequence
  int accumulate = 1;   ///< micro-batches per step, only the last synchronizing: a divisor of the rows per rank
  int warmup = 2;       ///< untimed steps
  int steps = 10;       ///< timed steps (rounds); fewer only if --budget cuts them, which is reported
  std::string budget;   ///< --budget text; empty: no budget
  double budget_s = 0;  ///< stop timing after this long (0: never); set by validate_bench_config
  std::string trace;    ///< --trace FILE: Chrome trace of the timed steps; empty: none
  /// Bytes per parameter a rank needs, for validate_bench_config()'s memory check: bench_variants()
  /// holds two replicas at a time (parameters, gradients, AdamW state, a gradient-sized buffer: 20 B
  /// each) and rank 0 a third, the single-process one. A stage that trains one replica at a time sets 20;
  /// a program that checks its own needs (extension 07a: each variant's shards and activations) sets 0,
  /// and validate_bench_config() leaves the memory to it.
  double bytes_per_param = 50;
};

/// One way of training to benchmark, given AdamW (lr 1e-4) to build. `make` is nullptr for the
/// no-communication baseline.
struct Variant {
  std::string name;
  MakeStrategy make;
  Variant(std::string n, MakeStrategy m) : name(std::move(n)), make(std::move(m)) {}
  /// A DDP stage's GradSync, then one AdamW over all parameters (dp::ddp_strategy()).
  Variant(std::string n, MakeGradSync m) : name(n), make(m ? ddp_strategy(std::move(m), n) : nullptr) {}
  Variant(std::string n, std::nullptr_t) : name(std::move(n)) {}
};

/// One variant's measurements. Every per-round sample is the slowest rank's (the next step cannot start
/// before it is done); round i of every variant ran back to back, so ratios are taken round by round.
struct BenchRow {
  std::string variant;
  std::string baseline;            ///< the no-communication row its ratios use
  int group = 0;                   ///< which group of interleaved variants it was measured in
  int64_t calls = 0;               ///< collectives per step, from Strategy::calls_per_step()
  double sent_bytes = 0;           ///< bytes this rank sent per step, from Strategy::sent_bytes_per_step()
  TrainingBytes bytes;             ///< Strategy::bytes() after the first step, the largest over ranks
  std::vector<double> step_s;      ///< whole step per round: forward, backward, sync, optimizer
  std::vector<double> baseline_s;  ///< the baseline's step in the same rounds
  Stats step, sync, forward, backward, optimizer;  ///< medians etc. ("sync": inside after_backward)
  std::vector<double> ratio;                       ///< per round: step / baseline step
  std::vector<double> overlap;                     ///< per round: overlap efficiency (empty for the baseline)
  std::vector<double> speedup;                     ///< per round: single-process step / this step (same global batch)
};

/// What bench_variants() measured besides the rows.
struct BenchRun {
  std::vector<BenchRow> rows;          ///< each group's baseline first, then its variants
  std::vector<double> flat_allreduce;  ///< per round: one all-reduce of all gradients (the communication time)
  std::vector<double> single_process;  ///< per round: rank 0 alone, whole global batch, all of its cores
  int steps_requested = 0;
  bool cut_by_budget = false;
  std::string device = "cpu";  ///< where the ranks computed (pg.device(): "cpu", "cuda:0", ...)
};

/// Benchmarks every variant on the same Transformer, batch and AdamW, with the no-communication
/// baseline. Variants are *interleaved*: step i of every variant runs before step i+1 of any, so a
/// machine that drifts (other load, clock changes) shifts all variants alike. Each round also times one
/// flat all-reduce of all gradients (what communication costs when nothing hides it) and, on rank 0 with
/// every core of its machine while the others wait, one single-process step on the whole global batch.
/// When all models do not fit in memory at once (about 20 bytes per parameter each), the variants are
/// split into groups, each with its own baseline row. Every rank must call it with the same arguments.
/// With cfg.trace set, the timed steps are recorded (common/base/trace.hpp) and written there.
BenchRun bench_variants(ProcessGroup& pg, const BenchConfig& cfg, const std::vector<Variant>& variants);

/// Throws dp::UsageError when `cfg` names an unknown preset, a batch that W ranks cannot split, a bad
/// budget, an unwritable trace path, or a model whose replicas (cfg.bytes_per_param per parameter, plus
/// activations) the ranks on this machine cannot hold in its available memory. Programs call it before their checks, so
/// bad input fails at once.
void validate_bench_config(BenchConfig& cfg, int world);

/// Adds the standard CLI options (--preset, --batch, --context, --warmup, --steps, --budget, --trace) to
/// `app`; --trace needs the program's --bench flag, which must already be defined.
void add_bench_options(CLI::App& app, BenchConfig& cfg);

/// The options of a checkpoint program (extensions 06c and 07b), with the defaults of a small run (tiny, 32 tokens,
/// 3 steps, 12 rows: split over 1-4 or 6 ranks): --checkpoint DIR (required; `folder_help` says what it holds),
/// --resume-only (`resume_help` says what it does), --preset, and --steps, which --resume-only excludes.
void add_checkpoint_options(CLI::App& app, BenchConfig& cfg, std::string& dir, bool& resume_only,
                            const std::string& folder_help, const std::string& resume_help);

/// Prints (rank 0) what is benchmarked: model, parameter count and bytes of parameters, gradients and
/// AdamW state, batch, context, ranks and the link (loopback, or the rate of a simulated network).
void print_bench_header(const ProcessGroup& pg, const BenchConfig& cfg);

/// Adds every row to `results` with its samples and derived figures (ratio, exposed communication,
/// overlap efficiency, tokens/s, speedup over one process) and prints one line per row (rank 0).
void record(Results& results, const BenchRun& run, const BenchConfig& cfg, int world);

/// The table every DDP stage prints.
std::string ddp_table(const Results& results);

/// What each row's rank holds after its first step (parameters, gradients, optimizer state: Strategy::bytes())
/// and sends per step: what a benchmark of sharded training prints beside ddp_table().
std::string memory_table(const Results& results);

}  // namespace dp
