// The launcher's command line and the environment contract it hands to every rank.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace ddp_launch {

// Everything the launcher needs to know, already validated: every field holds a usable value.
struct LaunchOptions {
  int nproc = 2;                        // ranks on this node (LOCAL_WORLD_SIZE)
  int nnodes = 1;                       // nodes taking part
  int node_rank = 0;                    // this node's index (GROUP_RANK)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                  // resolved: never 0 after parsing
  double timeout_s = 5.0;               // grace between SIGTERM and SIGKILL
  bool prefix = true;                   // tag each output line with "[rank r/W] "
  int threads = 1;                      // intra-op threads per rank
  std::vector<std::string> command;     // PROGRAM ARGS...

  int world_size() const { return nnodes * nproc; }
  int global_rank(int local_rank) const { return node_rank * nproc + local_rank; }
};

// Bad input. The message is one sentence "<what is wrong>; <remedy>", printed after "ddp_launch: error: ".
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses argv. Returns false when the caller should exit 0 at once (--help was printed).
// Throws UsageError for anything malformed or out of range.
bool parse_options(int argc, char** argv, LaunchOptions& out);

// The full environment of one rank: the launcher's own environment, with the contract's variables
// (RANK, LOCAL_RANK, WORLD_SIZE, ...) overwritten and the thread-count variables added where unset.
std::vector<std::string> rank_environment(const LaunchOptions& opts, int local_rank);

}  // namespace ddp_launch
