// Benchmark results: machine-readable JSON (one object per configuration) and a Markdown table.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dp {

/// Rows of results from one benchmark run. Every row is a JSON object; docs/results.md lists the fields.
class Results {
 public:
  explicit Results(std::string benchmark);
  /// Adds one configuration's measurements.
  void add(nlohmann::json row);
  const std::vector<nlohmann::json>& rows() const { return rows_; }
  /// Extra top-level fields written beside the rows (e.g. a fitted model).
  nlohmann::json meta = nlohmann::json::object();
  /// Writes {"benchmark", "machine", "command", "rows": [...]} to `path` (atomically: temp file + rename).
  void write_json(const std::string& path, const std::string& command) const;
  /// A Markdown table with the given columns (JSON keys) and headers; numbers get `precision` digits.
  std::string markdown(const std::vector<std::string>& keys, const std::vector<std::string>& headers,
                       int precision = 3) const;

 private:
  std::string benchmark_;
  std::vector<nlohmann::json> rows_;
};

/// One line describing this machine (CPU model, cores, memory, LibTorch version) for results.
std::string machine_description();
/// The link the ranks talk over: "simulated 1gbit link per rank" under ddp_launch --net (DP_NET), with ", 2 nodes
/// joined by 1gbit uplinks" under --net-nodes; else "loopback" when every rank is on this node, else "network".
std::string link_description();
/// The command that reproduces this run (for the "command" field next to the numbers): the launcher's
/// whole command line when ddp_launch started us (DP_LAUNCH_COMMAND), else argv joined back.
std::string command_line(int argc, char** argv);

}  // namespace dp
