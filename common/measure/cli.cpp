// Command-line parsing: CLI11 does the work; we add units and map every bad input to exit code 2.
#include "common/measure/cli.hpp"

#include "common/base/format.hpp"
#include "common/dist/dist.hpp"
#include "common/dist/runtime.hpp"

#include <fmt/format.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

namespace dp {

namespace {

// Splits "10.5MiB" into 10.5 and "mib"; throws when the number part is missing or malformed.
std::pair<double, std::string> split_number(const std::string& text, const std::string& what,
                                            const std::string& examples) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw UsageError(fmt::format("{} '{}' is not a number with a unit; write e.g. {}", what, text, examples));
  }
  std::string unit = lowercase(text.substr(pos));
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  if (!std::isfinite(v) || v <= 0)
    throw UsageError(fmt::format("{} '{}' must be positive; write e.g. {}", what, text, examples));
  return {v, unit};
}

}  // namespace

uint64_t parse_size(const std::string& text, const std::string& what) {
  static const std::map<std::string, double> units = {
      {"", 1},      {"b", 1},       {"kb", 1e3},       {"mb", 1e6},          {"gb", 1e9},
      {"tb", 1e12}, {"kib", 1024.}, {"mib", 1048576.}, {"gib", 1073741824.}, {"tib", 1099511627776.}};
  auto [v, unit] = split_number(text, what, "1MB (10^6 bytes) or 1MiB (2^20 bytes)");
  auto it = units.find(unit);
  if (it == units.end())
    throw UsageError(
        fmt::format("{} '{}' has unknown unit '{}'; use B, kB, MB, GB, TB (powers of 1000) "
                    "or KiB, MiB, GiB, TiB (powers of 1024)",
                    what, text, unit));
  double bytes = v * it->second;
  if (bytes < 1 || bytes > 1e15) throw UsageError(fmt::format("{} '{}' is out of range (1 byte .. 1 PB)", what, text));
  return static_cast<uint64_t>(std::llround(bytes));
}

double parse_seconds(const std::string& text, const std::string& what) {
  static const std::map<std::string, double> units = {{"", 1}, {"s", 1}, {"ms", 1e-3}, {"m", 60}, {"min", 60}};
  auto [v, unit] = split_number(text, what, "30s, 500ms or 2m");
  auto it = units.find(unit);
  if (it == units.end())
    throw UsageError(fmt::format("{} '{}' has unknown unit '{}'; use ms, s or m", what, text, unit));
  return v * it->second;
}

torch::ScalarType parse_compute_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return torch::kFloat32;
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  throw UsageError(
      fmt::format("unknown compute dtype '{}': use float32 (fp32) or bfloat16 (bf16); float16 "
                  "is not offered because LibTorch 1.13 has no fp16 matmul on the CPU",
                  name));
}

std::vector<bool> true_false_both(const std::string& value) {
  std::vector<bool> modes;
  if (value != "false") modes.push_back(true);
  if (value != "true") modes.push_back(false);
  return modes;
}

const CLI::Validator PositiveInt = CLI::Validator(
    [](std::string& s) -> std::string {
      try {
        size_t pos = 0;
        long long v = std::stoll(s, &pos);
        if (pos != s.size()) return "'" + s + "' is not an integer";
        if (v <= 0) return "'" + s + "' must be a positive integer (1 or more)";
      } catch (const std::exception&) {
        return "'" + s + "' is not an integer";
      }
      return {};
    },
    "POSITIVE");

// A check that refuses what `parse` refuses, with its dp::UsageError's message.
static CLI::Validator parses_with(void (*parse)(const std::string&), const std::string& name) {
  return CLI::Validator(
      [parse](std::string& s) -> std::string {
        try {
          parse(s);
        } catch (const UsageError& e) {
          return e.what();
        }
        return {};
      },
      name);
}

const CLI::Validator SizeText = parses_with([](const std::string& s) { parse_size(s); }, "SIZE");

void bench_only(CLI::App& app, const std::vector<std::string>& names) {
  CLI::Option* bench = app.get_option_no_throw("--bench");
  if (!bench) return;
  for (const auto& name : names) app.get_option(name)->needs(bench);  // throws for a name never added
}

// Finite numbers with a lower bound, named in words.
static CLI::Validator finite_at_least(double low, bool strict, const std::string& name) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        const std::string rule = fmt::format("must be a finite number {} {}", strict ? ">" : ">=", low);
        double v = 0;
        try {
          size_t pos = 0;
          v = std::stod(s, &pos);
          if (pos != s.size()) return "'" + s + "' is not a number: it " + rule;
        } catch (const std::exception&) {
          return "'" + s + "' is not a number: it " + rule;
        }
        if (!std::isfinite(v) || v < low || (strict && v == low)) return "'" + s + "': the value " + rule;
        return {};
      },
      name);
}

const CLI::Validator PositiveFinite = finite_at_least(0, true, "NUMBER > 0");
const CLI::Validator NonNegativeFinite = finite_at_least(0, false, "NUMBER >= 0");

const CLI::Validator ComputeDtypeText = parses_with([](const std::string& s) { parse_compute_dtype(s); }, "");

void check_writable(const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (path.empty() || p.filename().empty() || fs::is_directory(p, ec))
    throw UsageError(
        fmt::format("{} '{}': cannot write there: it names a folder, not a file; give a file name, "
                    "e.g. {}/out",
                    option, path, path.empty() ? "." : path));
  if (!fs::is_directory(dir, ec))
    throw UsageError(
        fmt::format("{} {}: cannot write there: the folder {} does not exist; create it (mkdir -p {}) "
                    "or give a path in an existing, writable folder",
                    option, path, dir.string(), dir.string()));
  // Outputs are written to a new file beside PATH and renamed over it: a device, pipe or socket there
  // (/dev/null) would be replaced by a plain file, not written to, and so would a symbolic link (/dev/stdout).
  const fs::file_status st = fs::symlink_status(p, ec);  // the path itself, a link not followed
  if (fs::is_symlink(st))
    throw UsageError(
        fmt::format("{} {}: cannot write there: it is a symbolic link, which the output would replace "
                    "(it is written beside it and renamed over it); give the path it points to",
                    option, path));
  if (fs::exists(st) && !fs::is_regular_file(st))
    throw UsageError(
        fmt::format("{} {}: cannot write there: it exists and is not a regular file (the output is "
                    "written beside it and renamed over it); give a file name",
                    option, path));
  // Try it rather than ask access(2), which says yes to root almost everywhere (/proc, a read-only mount):
  // open an existing file for writing without truncating it, and create and remove a file beside it.
  const auto refuse = [&](int err, const std::string& what) {
    throw UsageError(fmt::format("{} {}: cannot write there: {} failed ({}); give a path in a writable folder", option,
                                 path, what, std::strerror(err)));
  };
  if (fs::exists(st)) {
    const int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) refuse(errno, "opening it for writing");
    ::close(fd);
  }
  std::string probe = (dir / ("." + p.filename().string() + ".probe-XXXXXX")).string();
  const int fd = ::mkstemp(probe.data());  // a unique name: every rank may probe the same folder at once
  if (fd < 0) refuse(errno, "creating a file in " + dir.string());
  ::close(fd);
  ::unlink(probe.c_str());
}

Cli::Cli(const std::string& program, const std::string& description) : app_(description, program) {
  app_.option_defaults()->always_capture_default();
  app_.add_option("--backend", common_.backend, "Communication backend: gloo (CPU tensors) or nccl (CUDA tensors)")
      ->check(CLI::IsMember({"gloo", "nccl"}));
  app_.add_option("--device", common_.device,
                  "Where tensors live: cpu or cuda (default: cpu for gloo, cuda for nccl; gloo ranks can share a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app_.add_option("--timeout", common_.timeout,
                  "Rendezvous and collective timeout (e.g. 30s, 2m); a dead or hung peer fails the run after it");
  app_.add_option("--json", common_.json, "Write results as JSON to this file");
  app_.add_option("--seed", common_.seed, "Random seed")->check(NonNegativeFinite);  // strtoull takes -1 as 2^64 - 1
}

Cli::~Cli() = default;

int Cli::parse(int argc, char** argv) {
  // The test suite preloads a library that runs a program's bad-input cases as forks of one started process
  // (tests/support/fork_cases.hpp); a program started plainly finds no hook and goes on.
  using StartHook = void (*)(int*, char***);
  if (auto hook = reinterpret_cast<StartHook>(dlsym(RTLD_DEFAULT, "dp_start_hook"))) hook(&argc, &argv);
  try {
    app_.parse(argc, argv);
    parse_seconds(common_.timeout, "--timeout");
    if (!common_.json.empty()) check_writable("--json", common_.json);
    check_backend(common_.backend, -1, common_.device);  // cuda: a CUDA build and a GPU; nccl: one per rank
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app_.help());
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    fmt::print("{}", app_.help("", CLI::AppFormatMode::All));
    return 0;
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "{}: error: {}\nRun '{} --help' for the options.\n", app_.get_name(), e.what(), app_.get_name());
    return 2;
  } catch (const UsageError& e) {
    fmt::print(stderr, "{}: error: {}\n", app_.get_name(), e.what());
    return 2;
  }
  return -1;
}

long Cli::timeout_ms() const { return std::lround(parse_seconds(common_.timeout, "--timeout") * 1000); }

DistOptions Cli::dist_options() const {
  DistOptions o;
  o.backend = common_.backend;
  o.timeout = std::chrono::milliseconds(timeout_ms());
  o.device = common_.device;
  return o;
}

}  // namespace dp
