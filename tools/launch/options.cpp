// Command-line parsing and the per-rank environment.
//
// Numbers are read as strings and converted here rather than by CLI11, so that every bad value gets
// the same kind of message: what was wrong, the value itself, and what to type instead.
#include "options.hpp"

#include "net.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <random>

extern char** environ;

namespace ddp_launch {
namespace {

constexpr int kDefaultMultiNodePort = 29500;  // torchrun's default, so both nodes agree without a flag

const char* kFooter = R"(Environment given to every rank (the same contract as torchrun):
  RANK              global rank = node_rank * nproc + local_rank
  LOCAL_RANK        rank on this node, 0 .. nproc-1
  WORLD_SIZE        nnodes * nproc
  LOCAL_WORLD_SIZE  nproc
  GROUP_RANK        node_rank
  MASTER_ADDR       host of rank 0's rendezvous store (--master-addr)
  MASTER_PORT       its port (--master-port; one node: a free port, several nodes: 29500)
  OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS
                    --threads, but only those not already set in your environment
  OMP_WAIT_POLICY   PASSIVE unless set (spinning OpenMP threads slow a multi-threaded rank ~3x here)
  OPENBLAS_CORETYPE SkylakeX or Haswell unless set, where OpenBLAS does not know this CPU and fell back to its
                    Prescott kernels (about 4x slower matmuls here)
  DP_CPUS_PER_RANK  K with --cpus-per-rank K: local rank i runs on the i-th K of the launcher's cores only, with K
                    threads (as each rank owns a GPU); the benchmarks time their single process on K cores too
  DP_LAUNCHER=1     tells the program it was started by this launcher
  DP_LAUNCH_COMMAND this launcher's command line (programs record it beside their results)

Output: each line a rank prints is tagged "[rank r/W] " unless it already starts with "[rank ".
Failure: when a rank fails, the others get SIGTERM, then SIGKILL after --timeout seconds, and the
launcher exits with the first failing rank's code (128+N for signal N), or with 2 when a rank exits 2 (a
usage error) while the others stop. Ctrl-C stops every rank the same way and exits 130. Exit 2
means bad options (the launcher's or a rank's); 127 means the program could not be started.

Elastic mode (--elastic, for stages/09_elastic): a rank that fails no longer stops the others; they go
on without it. --max-restarts K starts a new process in a failed rank's place, K times in all over the
run, --restart-delay S seconds after the failure; --min-nproc M is handed to the program
(DP_ELASTIC_MIN), which stops, with a checkpoint, when fewer than M ranks are left. The ranks meet in a
store file the launcher creates and removes (DP_ELASTIC_STORE): it belongs to no rank, so no rank's
death takes it down. A replacement gets DP_RESTART = how many processes its slot had before it. The
launcher exits 0 once the run has finished (a rank exited 0) and no rank failed after that; a rank
exiting 2 still stops everyone. A rank exiting 3 says the run cannot go on at all (stage 09: nobody holds the
state and there is no checkpoint): no replacement starts after it, and the launcher exits 3. Each process
that ends is marked in DP_ELASTIC_STORE.dead/ as <slot>.<restart> (its DP_RESTART), for the survivors' rounds.
When every rank has died at once, replacements due still start. A rank still running 30 s after the first one finished (hung, or
SIGSTOPped and left out) is stopped.

A cluster on one machine (--net RATE; needs root, i.e. CAP_NET_ADMIN and CAP_SYS_ADMIN, and
iproute2): every rank runs in a network namespace of its own, with one veth interface into a Linux
bridge, shaped to RATE in each direction by tbf (tc's units: 1gbit, 500mbit, 10gbit; kbps, mbps,
gbps are bytes/s). Ranks get MASTER_ADDR = rank 0's address (198.18.0.1 in --net-subnet's default
198.18.0.0/15), GLOO_SOCKET_IFNAME = their interface (dpnet<local_rank>), DP_NET = RATE and
DP_NET_BIT_S = RATE in bits/s. Namespaces are named dpnet<launcher pid>-b (bridge) and dpnet<pid>-r<i> and removed when the
launcher exits; leftovers of a SIGKILLed launcher go with the next --net run or --net-cleanup.
--net-delay needs the kernel's netem qdisc (exit 2 without it). Exit 1: the network could not be
built. --net is refused with --nnodes > 1: two real machines need no simulation; --net simulates
a cluster on one machine. See docs/launching.md.

Two tiers (--net RATE --net-nodes M --net-uplink UPRATE): the ranks form M simulated nodes of nproc/M
consecutive ranks (node of rank i = i / (nproc/M)). Each node has a bridge of its own (dpnet-n<n>) for
its ranks' links at RATE, and one uplink (veth dpup<n> / dpup<n>-s, tbf UPRATE on both ends) to a spine
bridge (dpnet-br); all of them live in dpnet<pid>-b:

              spine dpnet-br
          UPRATE /        \ UPRATE        one uplink per node, shaped each way
       dpnet-n0             dpnet-n1      one bridge per node
      RATE /   \ RATE     RATE /   \ RATE
      rank 0  rank 1      rank 2  rank 3  (--nproc 4 --net-nodes 2)

--net-uplink has no default: it is required with --net-nodes (an uplink faster than RATE is allowed,
with a note). M must divide --nproc. Ranks then get LOCAL_RANK = i mod (nproc/M), LOCAL_WORLD_SIZE =
nproc/M, GROUP_RANK = i / (nproc/M) (RANK and WORLD_SIZE as ever; GLOO_SOCKET_IFNAME stays dpnet<i>),
and DP_NET_NODES = M, DP_NET_UPLINK = UPRATE, DP_NET_UPLINK_BIT_S = UPRATE in bits/s, so a program
knows that all M x nproc/M ranks share this machine. Without --net-nodes none of these are set.

Examples:
  ddp_launch --nproc 2 -- ./build/bin/stage01_allreduce
  ddp_launch --nproc 4 --net 1gbit -- ./build/bin/stage01_allreduce --bench --sizes 10MB
  ddp_launch --nproc 4 --net 10gbit --net-nodes 2 --net-uplink 1gbit -- ./build/bin/stage01_allreduce --bench

  # two machines, two ranks each: node 0 is 10.0.0.1 and hosts rank 0's store
  ddp_launch --nnodes 2 --node-rank 0 --nproc 2 --master-addr 10.0.0.1 --master-port 29500 \
      -- ./build/bin/stage01_allreduce            # on 10.0.0.1
  ddp_launch --nnodes 2 --node-rank 1 --nproc 2 --master-addr 10.0.0.1 --master-port 29500 \
      -- ./build/bin/stage01_allreduce            # on the second machine
)";

// A whole number in [lo, hi], or a UsageError that names the flag, the value and the fix.
int parse_int(const std::string& flag, const std::string& text, long lo, long hi, const std::string& remedy) {
  errno = 0;
  char* end = nullptr;
  // strtol would skip leading blanks and accept "" as 0; neither is a number a user meant to type.
  const bool starts_ok =
      !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-' || text[0] == '+');
  const long value = starts_ok ? std::strtol(text.c_str(), &end, 10) : 0;
  if (!starts_ok || *end != '\0' || errno == ERANGE) {
    throw UsageError(fmt::format("{} expects a whole number, got '{}'; {}", flag, text, remedy));
  }
  if (value < lo || value > hi) {
    const std::string range =
        hi == std::numeric_limits<int>::max() ? fmt::format(">= {}", lo) : fmt::format("{}..{}", lo, hi);
    throw UsageError(fmt::format("{} must be {}, got '{}'; {}", flag, range, text, remedy));
  }
  return static_cast<int>(value);
}

double parse_seconds(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double value = text.empty() ? NAN : std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value) || value < 0 || value > 86400) {
    throw UsageError(fmt::format("{} expects seconds between 0 and 86400, got '{}'; e.g. {} 5", flag, text, flag));
  }
  return value;
}

// Binds a TCP socket to `address` (host byte order) and `port` (0: the kernel picks), and closes it again.
// Returns the port it bound, or 0 when the bind failed.
int bind_probe(uint32_t address, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(address);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  int bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    bound = ntohs(addr.sin_port);
  }
  ::close(fd);
  return bound;
}

std::pair<int, int> ephemeral_port_range() {
  int lo = 32768, hi = 60999;  // Linux's default
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int a = 0, b = 0;
  if (in >> a >> b && a > 0 && a <= b && b <= 65535) lo = a, hi = b;
  return {lo, hi};
}

}  // namespace

int pick_free_port(const std::vector<int>& taken, bool kernel_fallback) {
  const auto [lo, hi] = ephemeral_port_range();
  std::vector<std::pair<int, int>> spans;  // ports outside the ephemeral range, above the well-known ones
  if (lo > 10000) spans.push_back({10000, lo - 1});
  if (hi < 65535) spans.push_back({hi + 1, 65535});
  int outside = 0;
  for (auto [a, b] : spans) outside += b - a + 1;
  const auto is_taken = [&](int port) { return std::find(taken.begin(), taken.end(), port) != taken.end(); };
  const auto usable = [&](int port) {  // rank 0's store listens on every address
    return port != kDefaultMultiNodePort && !is_taken(port) && bind_probe(INADDR_ANY, port) != 0;
  };
  std::random_device seed;
  std::mt19937 rng(seed());
  for (int attempt = 0; outside > 0 && attempt < 64; ++attempt) {
    int k = std::uniform_int_distribution<int>(0, outside - 1)(rng);
    for (auto [a, b] : spans) {
      if (k <= b - a) {
        if (usable(a + k)) return a + k;
        break;
      }
      k -= b - a + 1;
    }
  }
  for (int attempt = 0; kernel_fallback && attempt < 8; ++attempt) {  // last resort: the kernel's choice
    const int port = bind_probe(INADDR_LOOPBACK, 0);
    if (port != 0 && !is_taken(port)) return port;
  }
  return 0;
}

namespace {

// CLI11 knows nothing of the program behind "--", so its usage line would hide it.
struct LauncherFormatter : CLI::Formatter {
  std::string make_usage(const CLI::App*, std::string name) const override {
    return fmt::format("Usage: {} [OPTIONS] -- PROGRAM [ARGS...]\n", name);
  }
};

}  // namespace

bool parse_options(int argc, char** argv, LaunchOptions& out) {
  CLI::App app{"Start N ranks of PROGRAM with the torchrun environment and supervise them.", "ddp_launch"};
  app.formatter(std::make_shared<LauncherFormatter>());
  // Stop at the first word that is not one of our options: it and everything after it is the
  // program's command line, so the program's own flags never reach CLI11. "--" also ends our options.
  app.prefix_command();
  app.footer(kFooter);

  std::string nproc_s = "2", nnodes_s = "1", node_rank_s = "0", port_s, timeout_s = "5", threads_s;
  std::string net_s, subnet_s, delay_s, net_nodes_s, uplink_s;
  bool no_prefix = false;
  std::string min_nproc_s, max_restarts_s, restart_delay_s;
  app.add_option("--nproc,--nproc-per-node", nproc_s, "ranks to start on this node (default 2)")->type_name("N");
  app.add_option("--nnodes", nnodes_s, "number of nodes (default 1)")->type_name("N");
  app.add_option("--node-rank", node_rank_s, "index of this node, 0 .. nnodes-1 (default 0)")->type_name("K");
  app.add_option("--master-addr", out.master_addr, "host of rank 0 (default 127.0.0.1)")->type_name("HOST");
  app.add_option("--master-port", port_s, "port of rank 0's store (default: a free port; 29500 if nnodes > 1)")
      ->type_name("PORT");
  app.add_option("--timeout", timeout_s, "seconds from SIGTERM to SIGKILL when stopping (default 5)")
      ->type_name("SECONDS");
  app.add_option("--threads", threads_s, "threads per rank (default: online cores / nproc, at least 1)")
      ->type_name("T");
  std::string cpus_per_rank_s;
  app.add_option("--cpus-per-rank", cpus_per_rank_s,
                 "pin each rank to K cores of its own with K threads, as a GPU per rank (nproc x K <= cores)")
      ->type_name("K");
  app.add_flag("--no-prefix", no_prefix, "print the ranks' lines without the [rank r/W] tag");
  auto* master_opt = app.get_option("--master-addr");
  app.add_option("--net", net_s, "each rank in its own network namespace, linked at RATE each way (e.g. 1gbit)")
      ->type_name("RATE");
  app.add_option("--net-subnet", subnet_s, "with --net: the ranks' IPv4 network (default 198.18.0.0/15)")
      ->type_name("CIDR");
  app.add_option("--net-delay", delay_s, "with --net: added one-way delay per link (needs netem)")->type_name("MS");
  app.add_option("--net-nodes", net_nodes_s,
                 "with --net: group the ranks into M simulated nodes of nproc/M, a bridge each, joined by uplinks")
      ->type_name("M");
  app.add_option("--net-uplink", uplink_s,
                 "with --net-nodes (required there): each node's uplink rate, each way (e.g. 1gbit)")
      ->type_name("RATE");
  app.add_flag("--elastic", out.elastic, "a failed rank does not stop the others (stages/09_elastic)");
  app.add_option("--min-nproc", min_nproc_s, "with --elastic: fewest ranks the run goes on with (default 1)")
      ->type_name("M");
  app.add_option("--max-restarts", max_restarts_s, "with --elastic: replacements started in all (default 0)")
      ->type_name("K");
  app.add_option("--restart-delay", restart_delay_s, "with --elastic: seconds before a replacement starts (default 0)")
      ->type_name("SECONDS");
  app.add_flag("--net-cleanup", out.net_cleanup, "remove what SIGKILLed --net launchers left behind, then exit");
  std::string free_ports_s;
  app.add_option("--free-ports", free_ports_s,
                 "print N distinct ports free now, outside the kernel's ephemeral range, one per line, then exit")
      ->type_name("N");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help
      std::cout << app.help();
      return false;
    }
    throw UsageError(fmt::format("{}; see ddp_launch --help", e.what()));
  }

  // What CLI11 did not consume is the program's command line, possibly behind a "--".
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() != "--" && rest.front().rfind('-', 0) == 0) {
    throw UsageError(
        fmt::format("unknown option '{}'; see ddp_launch --help, and put the program after '--'", rest.front()));
  }
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (!free_ports_s.empty() && out.net_cleanup)
    throw UsageError("--free-ports and --net-cleanup each do one thing and exit; give one of them per call");
  if (!free_ports_s.empty()) {
    out.free_ports = parse_int("--free-ports", free_ports_s, 1, 64, "e.g. --free-ports 1");
    if (!rest.empty())
      throw UsageError("--free-ports prints ports and exits, it runs no program; drop '" + rest.front() +
                       "' and what follows");
    return true;
  }
  if (out.net_cleanup) {
    if (!rest.empty())
      throw UsageError("--net-cleanup removes leftovers and exits, it runs no program; drop '" + rest.front() +
                       "' and what follows");
    return true;
  }
  if (rest.empty()) {
    throw UsageError("no program given; put it after '--', e.g. ddp_launch --nproc 2 -- ./build/bin/stage01_allreduce");
  }
  out.command = rest;

  const long kMaxInt = std::numeric_limits<int>::max();
  out.nproc = parse_int("--nproc", nproc_s, 1, 4096, "e.g. --nproc 2");
  out.nnodes = parse_int("--nnodes", nnodes_s, 1, 65536, "e.g. --nnodes 1");
  out.node_rank = parse_int("--node-rank", node_rank_s, 0, kMaxInt, "e.g. --node-rank 0");
  if (out.node_rank >= out.nnodes) {
    throw UsageError(fmt::format("--node-rank {} is out of range for --nnodes {}; use 0 .. {}", out.node_rank,
                                 out.nnodes, out.nnodes - 1));
  }
  if (out.master_addr.empty()) throw UsageError("--master-addr is empty; e.g. --master-addr 127.0.0.1");
  out.timeout_s = parse_seconds("--timeout", timeout_s);
  out.prefix = !no_prefix;

  if (!port_s.empty()) {
    out.master_port = parse_int("--master-port", port_s, 1, 65535, "e.g. --master-port 29500");
  } else if (out.nnodes > 1) {
    out.master_port = kDefaultMultiNodePort;  // every node must use the same port: a random one cannot work
  } else {
    out.master_port = pick_free_port();
    if (out.master_port == 0) out.master_port = kDefaultMultiNodePort;
  }

  if (!net_s.empty()) {
    // Checked in this order so that one message names the first real problem.
    if (out.nnodes > 1) {
      throw UsageError(
          fmt::format("--net cannot be used with --nnodes {}: two real machines need no simulation; "
                      "--net simulates a cluster on one machine, so drop --net or --nnodes",
                      out.nnodes));
    }
    if (master_opt->count() > 0) {
      throw UsageError(
          "--master-addr cannot be used with --net: rank 0's address in the simulated network is the "
          "master address; drop --master-addr");
    }
    out.net.rate_bit_s = parse_rate(net_s);
    out.net.rate_text = net_s;
    std::transform(out.net.rate_text.begin(), out.net.rate_text.end(), out.net.rate_text.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (!subnet_s.empty()) parse_subnet(subnet_s, out.nproc, out.net);
    if (!delay_s.empty()) out.net.delay_ms = parse_delay_ms(delay_s);
    if (!net_nodes_s.empty()) {
      int divisor = out.nproc;  // the smallest divisor of --nproc above 1, for the examples (1 if there is none)
      for (int d = out.nproc - 1; d > 1; --d)
        if (out.nproc % d == 0) divisor = d;
      if (out.nproc == 1) divisor = 1;
      out.net.nodes = parse_int("--net-nodes", net_nodes_s, 1, out.nproc,
                                fmt::format("it counts simulated nodes of at least one rank each, so use a divisor "
                                            "of --nproc ({}), e.g. --net-nodes {}",
                                            out.nproc, divisor));
      if (out.nproc % out.net.nodes != 0)
        throw UsageError(
            fmt::format("--net-nodes {} does not divide --nproc {}: every simulated node holds nproc/M ranks; use a "
                        "divisor of {} (e.g. --net-nodes {}) or --nproc {}",
                        out.net.nodes, out.nproc, out.nproc, divisor, (out.nproc / out.net.nodes + 1) * out.net.nodes));
      if (uplink_s.empty())
        throw UsageError(fmt::format(
            "--net-nodes {} needs --net-uplink RATE, the rate of each node's link to the spine (--net {} is "
            "the rate of each rank's link within its node); add e.g. --net-uplink 1gbit",
            out.net.nodes, out.net.rate_text));
      out.net.uplink_bit_s = parse_rate(uplink_s, "--net-uplink");
      out.net.uplink_text = uplink_s;
      std::transform(out.net.uplink_text.begin(), out.net.uplink_text.end(), out.net.uplink_text.begin(),
                     [](unsigned char c) { return std::tolower(c); });
    } else if (!uplink_s.empty()) {
      throw UsageError(
          fmt::format("--net-uplink {} is the rate between simulated nodes and there are none; add --net-nodes M "
                      "(e.g. --net-nodes 2), or drop --net-uplink",
                      uplink_s));
    }
  } else if (!subnet_s.empty() || !delay_s.empty() || !net_nodes_s.empty() || !uplink_s.empty()) {
    const std::string flag = !subnet_s.empty()      ? "--net-subnet"
                             : !delay_s.empty()     ? "--net-delay"
                             : !net_nodes_s.empty() ? "--net-nodes " + net_nodes_s
                                                    : "--net-uplink " + uplink_s;
    throw UsageError(fmt::format("{} only applies to a simulated network; add --net RATE, e.g. --net 1gbit", flag));
  }

  if (out.elastic) {
    if (out.nnodes > 1)
      throw UsageError(
          fmt::format("--elastic works on one node (its store is a file on this machine), not with "
                      "--nnodes {}; drop --nnodes or --elastic",
                      out.nnodes));
    if (!min_nproc_s.empty())
      out.min_nproc = parse_int("--min-nproc", min_nproc_s, 1, out.nproc,
                                fmt::format("it counts ranks, so use 1 .. --nproc ({})", out.nproc));
    if (!max_restarts_s.empty())
      out.max_restarts = parse_int("--max-restarts", max_restarts_s, 0, 1000, "e.g. --max-restarts 1");
    if (!restart_delay_s.empty()) out.restart_delay_s = parse_seconds("--restart-delay", restart_delay_s);
  } else if (!min_nproc_s.empty() || !max_restarts_s.empty() || !restart_delay_s.empty()) {
    throw UsageError(fmt::format("{} only applies to elastic mode; add --elastic", !min_nproc_s.empty() ? "--min-nproc"
                                                                                   : !max_restarts_s.empty()
                                                                                       ? "--max-restarts"
                                                                                       : "--restart-delay"));
  }

  // The command that reproduces this run, as the ranks' results record it next to their numbers.
  out.launch_command.clear();
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const bool quote = a.empty() || a.find_first_of(" \t'\"$*?;&|<>()") != std::string::npos;
    out.launch_command += (i ? " " : "") + (quote ? "'" + a + "'" : a);
  }
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  out.threads = threads_s.empty() ? static_cast<int>(std::max(1L, cores / out.nproc))
                                  : parse_int("--threads", threads_s, 1, 4096, "e.g. --threads 1");
  if (!cpus_per_rank_s.empty()) {
    // A core per rank (or K) as a GPU per rank on a cluster: the ranks never share one, so N ranks have N
    // times one rank's compute, and the benchmarks' single process is measured on K cores as well.
    const int usable = static_cast<int>(usable_cpus().size());
    out.cpus_per_rank = parse_int("--cpus-per-rank", cpus_per_rank_s, 1, 4096, "e.g. --cpus-per-rank 1");
    if (out.nproc * out.cpus_per_rank > usable)
      throw UsageError(fmt::format(
          "--cpus-per-rank {} with --nproc {} needs {} cores of its own and this launcher may use {}; use "
          "--cpus-per-rank {} or fewer ranks, or leave it out to share the cores",
          out.cpus_per_rank, out.nproc, out.nproc * out.cpus_per_rank, usable, std::max(1, usable / out.nproc)));
    if (!threads_s.empty() && out.threads != out.cpus_per_rank)
      throw UsageError(
          fmt::format("--threads {} with --cpus-per-rank {}: a pinned rank runs one thread per core "
                      "it owns; leave --threads out",
                      out.threads, out.cpus_per_rank));
    out.threads = out.cpus_per_rank;
  }
  return true;
}

std::vector<int> usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty())  // no mask to read: every online core
    for (long c = 0; c < std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)); ++c) cpus.push_back(static_cast<int>(c));
  return cpus;
}

std::vector<int> cpus_of_rank(const LaunchOptions& o, int local_rank) {
  if (o.cpus_per_rank <= 0) return {};
  const std::vector<int> all = usable_cpus();
  const auto first = all.begin() + static_cast<std::ptrdiff_t>(local_rank) * o.cpus_per_rank;
  return std::vector<int>(first, first + o.cpus_per_rank);
}

// OpenBLAS picks its kernels when it loads, from the CPU's model number. Debian 12's OpenBLAS (0.3.21) does not
// know the newer Xeons (this course's machines: Emerald Rapids, model 207) and falls back to its Prescott (SSE3)
// kernels: a 512x512 float matmul on one core ran at 18-23 GFLOP/s here, 77 with its SkylakeX kernels, and the
// Prescott gemm was the suite's largest single CPU cost (14%, perf). OPENBLAS_CORETYPE names the kernels to use
// instead. Returns that name when OpenBLAS fell back and the CPU can run better ones, else "". The library
// itself says what it chose: it is loaded here once, with one thread (it would start one per core), and
// unloaded. The same rule warns in common/dist/runtime.cpp's check_blas() when a program runs without it.
std::string openblas_coretype_for_this_cpu() {
  static const std::string name = [] {
    const char* had = std::getenv("OPENBLAS_NUM_THREADS");
    const std::string saved = had ? had : "";
    ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
    void* lib = ::dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (had)
      ::setenv("OPENBLAS_NUM_THREADS", saved.c_str(), 1);
    else
      ::unsetenv("OPENBLAS_NUM_THREADS");
    if (!lib) return std::string();  // another BLAS, or none: nothing to choose
    using CoreName = char* (*)();
    auto corename = reinterpret_cast<CoreName>(::dlsym(lib, "openblas_get_corename"));
    const std::string chosen = corename ? corename() : "";
    ::dlclose(lib);
    if (chosen != "Prescott") return std::string();  // OpenBLAS knew this CPU (or it is that old)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
      return std::string("SkylakeX");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return std::string("Haswell");
    return std::string();
  }();
  return name;
}

std::vector<std::string> rank_environment(const LaunchOptions& o, int local_rank,
                                          const std::vector<std::pair<std::string, std::string>>& extra, int restart) {
  // Ordered map: the contract's variables replace any inherited ones of the same name.
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env[std::string(*e, static_cast<std::size_t>(eq - *e))] = eq + 1;
  }
  // Thread counts: a value the user exported wins; we only fill the gaps, so that N ranks share the
  // cores instead of each starting one thread per core (N-fold oversubscription).
  for (const char* key : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}) {
    auto it = env.find(key);
    if (it == env.end() || it->second.empty()) env[key] = std::to_string(o.threads);
  }
  if (o.cpus_per_rank > 0) env["DP_CPUS_PER_RANK"] = std::to_string(o.cpus_per_rank);
  env["RANK"] = std::to_string(o.global_rank(local_rank));
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(o.world_size());
  env["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc);
  env["GROUP_RANK"] = std::to_string(o.node_rank);
  if (o.net.nodes > 0) {  // --net-nodes: torchrun's contract as the simulated nodes would see it (--net: one node)
    const int per_node = o.net.ranks_per_node(o.nproc);
    env["LOCAL_RANK"] = std::to_string(local_rank % per_node);
    env["LOCAL_WORLD_SIZE"] = std::to_string(per_node);
    env["GROUP_RANK"] = std::to_string(o.net.node_of(local_rank, o.nproc));
  }
  env["MASTER_ADDR"] = o.master_addr;
  env["MASTER_PORT"] = std::to_string(o.master_port);
  // OpenMP threads that finish a parallel region spin for a while before they sleep (the "active"
  // wait policy). With OpenBLAS's own threads beside them they fight for the cores: measured here, a
  // 2-thread process ran a training step 2.8x slower than with PASSIVE (0.637 s vs 0.224 s). A value
  // the user exported wins.
  if (env["OMP_WAIT_POLICY"].empty()) env["OMP_WAIT_POLICY"] = "PASSIVE";
  // OpenBLAS's own kernels for this CPU where it does not know the model (openblas_coretype_for_this_cpu()). A
  // value the user exported wins; an empty one is never set (OpenBLAS reads "" as a core it cannot find).
  if (env.count("OPENBLAS_CORETYPE") == 0)
    if (auto core = openblas_coretype_for_this_cpu(); !core.empty()) env["OPENBLAS_CORETYPE"] = core;
  env["DP_LAUNCHER"] = "1";
  env["DP_LAUNCH_COMMAND"] = o.launch_command;
  if (o.elastic) {
    env["DP_ELASTIC_STORE"] = o.elastic_store;
    env["DP_ELASTIC_MIN"] = std::to_string(o.min_nproc);
    env["DP_RESTART"] = std::to_string(restart);
  }
  for (const auto& [key, value] : extra) env[key] = value;

  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

}  // namespace ddp_launch
