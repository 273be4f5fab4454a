// The launcher's command line and the environment contract it hands to every rank.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ddp_launch {

// --net: every rank in a network namespace of its own behind a rate-limited link (net.hpp).
struct NetSpec {
  std::string rate_text;         // the rate as given, lower-cased ("1gbit"); exported as DP_NET
  uint64_t rate_bit_s = 0;       // the same in bits per second; 0: no simulated network
  uint32_t subnet = 0xC6120000;  // network address in host byte order: 198.18.0.0 (RFC 2544)
  int prefix_len = 15;           // 198.18.0.0/15
  double delay_ms = 0;           // --net-delay: added one-way delay in milliseconds; 0: none
  // --net-nodes M: the ranks grouped into M simulated nodes of nproc/M consecutive ranks, each node a bridge of
  // its own joined to a spine bridge by an uplink shaped to --net-uplink. 0: one flat switch (no --net-nodes).
  int nodes = 0;
  std::string uplink_text;    // --net-uplink as given, lower-cased ("1gbit"); exported as DP_NET_UPLINK
  uint64_t uplink_bit_s = 0;  // the same in bits per second
  bool enabled() const { return rate_bit_s > 0; }
  // The simulated node of the launcher's rank index i (0 .. nproc-1), and the ranks each node holds.
  int ranks_per_node(int nproc) const { return nodes > 0 ? nproc / nodes : nproc; }
  int node_of(int i, int nproc) const { return nodes > 0 ? i / ranks_per_node(nproc) : 0; }
};

// Everything the launcher needs to know, already validated: every field holds a usable value.
struct LaunchOptions {
  int nproc = 2;      // ranks on this node (LOCAL_WORLD_SIZE)
  int nnodes = 1;     // nodes taking part
  int node_rank = 0;  // this node's index (GROUP_RANK)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;     // resolved: never 0 after parsing
  double timeout_s = 5.0;  // grace between SIGTERM and SIGKILL
  bool prefix = true;      // tag each output line with "[rank r/W] "
  int threads = 1;         // intra-op threads per rank
  // --cpus-per-rank K: local rank i runs on the i-th K of the cores this launcher may use, with K threads, as
  // each rank owns a GPU on a cluster; exported as DP_CPUS_PER_RANK (the benchmarks' single process then uses
  // K cores too). 0: not pinned, the ranks share every core.
  int cpus_per_rank = 0;
  std::vector<std::string> command;  // PROGRAM ARGS...
  NetSpec net;                       // --net, --net-subnet, --net-delay, --net-nodes, --net-uplink
  bool net_cleanup = false;          // --net-cleanup: remove leftovers of dead launchers, then exit
  int free_ports = 0;                // --free-ports N: print N free ports (pick_free_port), then exit
  std::string launch_command;        // this launcher's whole command line, shell-quoted (DP_LAUNCH_COMMAND)
  // --elastic: a failed rank no longer stops the others (stage 09); --max-restarts starts a new process
  // in its place, up to K times in all. The ranks meet in a store file the launcher owns (DP_ELASTIC_STORE).
  bool elastic = false;
  int min_nproc = 1;           // --min-nproc: exported as DP_ELASTIC_MIN; the program stops below it
  int max_restarts = 0;        // --max-restarts: replacements the launcher may start in all
  double restart_delay_s = 0;  // --restart-delay: seconds between a failure and its replacement
  std::string elastic_store;   // the store file; set by the supervisor before the first rank starts

  int world_size() const { return nnodes * nproc; }
  int global_rank(int local_rank) const { return node_rank * nproc + local_rank; }
};

// Bad input. The message is one sentence "<what is wrong>; <remedy>", printed after "ddp_launch: error: ".
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A port for rank 0's store on this node, not in `taken`; 0 if none was found. Not one the kernel hands out
// itself (bind to port 0): those come from the ephemeral range, which every outgoing connection draws from
// too, so in the moment before rank 0 binds it, a connection of another job on this machine (Gloo opens one
// per pair of ranks) can take it ("Address already in use": seen with four launches at once). So: a random
// port below or above ip_local_port_range that binds now, never 29500; the kernel's choice only as the last
// resort (`kernel_fallback`; --free-ports passes false, since its ports serve other servers). Scripts that
// need ports get them the same way: ddp_launch --free-ports N.
int pick_free_port(const std::vector<int>& taken = {}, bool kernel_fallback = true);

// Parses argv. Returns false when the caller should exit 0 at once (--help was printed).
// Throws UsageError for anything malformed or out of range.
bool parse_options(int argc, char** argv, LaunchOptions& out);

// The cores this launcher may run on (its affinity mask, in increasing order): what --cpus-per-rank divides.
std::vector<int> usable_cpus();

// With --cpus-per-rank K, the K cores of local rank `local_rank` (the (local_rank)-th K of usable_cpus());
// empty when the ranks are not pinned.
std::vector<int> cpus_of_rank(const LaunchOptions& opts, int local_rank);

// The kernels OpenBLAS should use on this CPU (OPENBLAS_CORETYPE) when it does not know the CPU's model and
// fell back to its Prescott ones, else "". Computed once per launcher.
std::string openblas_coretype_for_this_cpu();

// The full environment of one rank: the launcher's own environment, with the contract's variables
// (RANK, LOCAL_RANK, WORLD_SIZE, ...) overwritten and the thread-count variables, OMP_WAIT_POLICY and
// OPENBLAS_CORETYPE (openblas_coretype_for_this_cpu()) added where unset.
// `extra` (--net's MASTER_ADDR, GLOO_SOCKET_IFNAME, DP_NET) is applied last and wins.
// With --net-nodes M, LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK describe the rank's simulated node
// (local_rank mod nproc/M, nproc/M, local_rank / (nproc/M)); `local_rank` itself stays the launcher's index.
// With --elastic, also DP_ELASTIC_STORE, DP_ELASTIC_MIN and DP_RESTART (`restart`: how many processes this
// slot had before this one; torchrun calls it TORCHELASTIC_RESTART_COUNT).
std::vector<std::string> rank_environment(const LaunchOptions& opts, int local_rank,
                                          const std::vector<std::pair<std::string, std::string>>& extra = {},
                                          int restart = 0);

}  // namespace ddp_launch
