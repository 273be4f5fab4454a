// Command-line options for every program: CLI11 underneath, sizes with units, exit code 2 on bad input.
#pragma once

#include <CLI/CLI.hpp>

#include "common/dist/dist.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dp {

/// Parses a size such as "1MB" (10^6 bytes), "10MiB" (2^20), "1GB", "512" (bytes) or "0.5MB".
/// Decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB) of 1024.
/// Throws dp::UsageError naming `what` and the text when it does not parse or is not positive.
uint64_t parse_size(const std::string& text, const std::string& what = "size");

/// Parses a duration such as "30s", "500ms", "2m" or "45" (seconds). Throws dp::UsageError.
double parse_seconds(const std::string& text, const std::string& what = "duration");

/// "float32" / "bfloat16" (or fp32 / bf16) -> the dtype a mixed-precision scheme computes in. Throws
/// dp::UsageError naming the value and the choices (float16 is refused: LibTorch 1.13 has no fp16 matmul
/// on the CPU).
torch::ScalarType parse_compute_dtype(const std::string& name);

/// The modes an option of true, false or both asks for, true first: {true}, {false} or {true, false}
/// (the option checks its value with CLI::IsMember({"true", "false", "both"})).
std::vector<bool> true_false_both(const std::string& value);

/// Options every distributed program shares.
struct CommonOptions {
  std::string backend = "gloo";  ///< --backend gloo|nccl
  std::string device;            ///< --device cpu|cuda; empty: the backend's own (gloo: cpu, nccl: cuda)
  std::string timeout = "120s";  ///< --timeout for rendezvous and collectives
  std::string json;              ///< --json FILE: append results as JSON
  uint64_t seed = 0;             ///< --seed
};

/// A CLI11 app preloaded with --backend, --device, --timeout, --json and --seed.
class Cli {
 public:
  Cli(const std::string& program, const std::string& description);
  /// Out of line on purpose: CLI::App's destructor and virtual functions are then compiled once, in
  /// cli.cpp, not in every main (about 2.5 s of each main's compile, measured with gcc 12).
  ~Cli();
  CLI::App& app() { return app_; }
  CommonOptions& common() { return common_; }
  /// Parses argv. Returns -1 to go on, or the exit code to return now (0 after --help, 2 on bad input,
  /// with a message naming the option and the remedy on stderr).
  int parse(int argc, char** argv);
  /// Timeout in milliseconds from --timeout (validated in parse()).
  long timeout_ms() const;
  /// The process group's options from --backend, --device and --timeout.
  DistOptions dist_options() const;

 private:
  CLI::App app_;
  CommonOptions common_;
};

/// CLI11 check: the value must be a positive integer (for counts such as --steps).
extern const CLI::Validator PositiveInt;
/// CLI11 check: the value must parse with parse_size() (for options such as --size 100MB).
extern const CLI::Validator SizeText;
/// CLI11 check: a finite number above 0 (rates and caps such as --lr, --caps). nan, inf and 0 are
/// refused with the rule in words ("must be a finite number > 0"), not CLI11's 308-digit range.
extern const CLI::Validator PositiveFinite;
/// CLI11 check: a finite number, 0 or more (such as --warmup).
extern const CLI::Validator NonNegativeFinite;
/// CLI11 check: the value must parse with parse_compute_dtype() (for --compute-dtype).
extern const CLI::Validator ComputeDtypeText;

/// Marks the named options of `app` as meaningful only with its --bench flag, where it has one: given
/// without --bench, parse() refuses them ("--preset requires --bench", exit 2) rather than run the checks
/// alone and ignore them. A program that always benchmarks (no --bench) takes them as they are.
void bench_only(CLI::App& app, const std::vector<std::string>& names);

/// Throws dp::UsageError naming `option` and `path` unless a file can be written there: the path is not a
/// folder, its folder exists, anything already there is a regular file (not a link) that opens for
/// writing, and a file can be created beside it (tried: a uniquely named empty file is created and
/// removed; an existing file is not changed), since outputs are written beside the path and renamed over
/// it. Every program calls it for each output file (results, traces, curves, checkpoints) before any
/// work, so a typo fails in a second instead of after the run; Cli::parse() does it for --json.
void check_writable(const std::string& option, const std::string& path);

}  // namespace dp
