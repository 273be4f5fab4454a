// --net RATE: a small cluster on one machine.
//
// On one machine Gloo talks over loopback, where sending costs CPU time but no wire time, so a
// benchmark never sees what a real network does to data parallelism. With --net every rank gets a
// network namespace of its own with one veth "NIC" into a Linux bridge (the "switch", in a namespace
// of its own too), and each NIC is shaped to RATE in both directions by a tbf qdisc on each end of
// its veth pair. Nothing is attached to the root namespace and there is no default route, so no
// packet can leave the machine. docs/launching.md draws the picture and lists the commands.
//
// Names carry the launcher's pid: namespaces dpnet<pid>-b (bridge) and dpnet<pid>-r<i> (rank i);
// inside them the rank's interface is dpnet<i>, its bridge-side peer dpnet<i>-br, the bridge dpnet-br.
//
// --net-nodes M (two tiers): the ranks form M simulated nodes of nproc/M consecutive ranks. Node n has a
// bridge of its own, dpnet-n<n>, where its ranks' dpnet<i>-br are ports; a veth pair dpup<n> (in dpnet-n<n>)
// / dpup<n>-s (in dpnet-br, now the spine) is its uplink, both ends shaped to --net-uplink: dpup<n> limits
// what leaves node n, dpup<n>-s what enters it. Every bridge and uplink lives in dpnet<pid>-b, so the
// cleanup and the teardown are those of the flat network.
// A launcher killed by SIGKILL cannot clean up; the next --net run (or --net-cleanup) removes the
// namespaces of launchers that are gone, and deleting a namespace deletes its veths and its bridge.
#pragma once

#include "options.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ddp_launch {

// Setup failed for a reason that is not the user's input (an ip or tc command failed): exit 1.
struct NetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --net's (or --net-uplink's: `flag`, named in the message) value, tc's units: bit, kbit, mbit, gbit, tbit
// (bits/s), bps, kbps, mbps, gbps, tbps (bytes/s, as in tc), and the 1024-based kibit, mibit, ... Returns
// bits/s; throws UsageError.
uint64_t parse_rate(const std::string& text, const std::string& flag = "--net");

// --net-subnet "a.b.c.d/len" into spec.subnet and spec.prefix_len; it must hold `hosts` addresses
// besides its network and broadcast addresses. Throws UsageError.
void parse_subnet(const std::string& text, int hosts, NetSpec& spec);

// --net-delay in milliseconds, > 0 and at most 10 s. Throws UsageError.
double parse_delay_ms(const std::string& text);

// "198.18.0.1": an address in host byte order.
std::string ipv4_text(uint32_t addr);

// Throws UsageError (exit 2) naming what --net lacks: CAP_NET_ADMIN and CAP_SYS_ADMIN (links and
// qdiscs; creating and entering namespaces), or `ip` / `tc` on PATH.
void check_net_prerequisites();

// Deletes the namespaces dpnet<pid>-* whose launcher (pid) is gone -- no process with that pid, or
// one that is not a ddp_launch (pids are reused) -- or that carry this process's own pid (called
// before this launcher builds anything, they are a dead namesake's). Returns one line per namespace
// removed ("removed network namespace dpnet12-r0 (launcher pid 12 is gone)") and, in `failures`, one
// per namespace that could not be removed.
std::vector<std::string> remove_stale_namespaces(std::vector<std::string>& failures);

// --net-cleanup: the above, printed on stdout. Returns the exit code.
int net_cleanup_main();

// The namespaces, links and qdiscs of one launcher. The constructor builds everything (first removing
// dead launchers' leftovers) or throws -- UsageError (exit 2: no privilege, no tools, no netem for
// --net-delay) or NetError -- after removing whatever it had already created. The destructor removes
// it all; the owner destroys it on every return path, after the last rank has been reaped.
class Network {
 public:
  Network(const NetSpec& spec, int nproc);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // An open descriptor of rank i's namespace (/run/netns/NAME), close-on-exec, for setns() in the
  // forked child before exec.
  int netns_fd(int local_rank) const { return fds_.at(static_cast<std::size_t>(local_rank)); }

  // What rank i adds to the contract: MASTER_ADDR (rank 0's address), GLOO_SOCKET_IFNAME, DP_NET,
  // DP_NET_BIT_S; with --net-nodes also DP_NET_NODES, DP_NET_UPLINK and DP_NET_UPLINK_BIT_S.
  std::vector<std::pair<std::string, std::string>> rank_env(int local_rank) const;

 private:
  void build();
  void build_uplink(int node);
  void build_rank(int i);
  void shape(const std::string& ns, const std::string& dev, uint64_t rate_bit_s, bool with_delay);
  void check_netem();
  void add_namespace(const std::string& name);
  void teardown() noexcept;

  NetSpec spec_;
  int nproc_;
  std::string tag_;                   // "dpnet<pid>"
  std::vector<std::string> created_;  // namespaces in creation order, removed in reverse
  std::vector<int> fds_;
};

}  // namespace ddp_launch
