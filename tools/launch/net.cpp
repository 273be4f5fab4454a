// Building and removing --net's namespaces with iproute2 (net.hpp says what and why).
#include "net.hpp"

#include "command.hpp"
#include "output.hpp"

#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace ddp_launch {
namespace {

const std::string kNetnsDir = "/run/netns";  // where `ip netns add` mounts named namespaces
const std::string kPrefix = "dpnet";
const std::string kBridge = "dpnet-br";  // inside the bridge namespace; with --net-nodes, the spine

// --net-nodes: node n's bridge, and its uplink's two ends (in node n's bridge and in the spine).
std::string node_bridge(int n) { return fmt::format("dpnet-n{}", n); }
std::string uplink_dev(int n) { return fmt::format("dpup{}", n); }
std::string uplink_spine_dev(int n) { return fmt::format("dpup{}-s", n); }

// Token bucket sizing (tbf). burst: bytes the bucket holds, i.e. how much may leave at once after an
// idle moment. It should hold the largest packet -- with segmentation offload a veth can hand tbf
// packets of up to 64 KiB, not 1500-byte frames, and tbf must split any larger than its bucket -- and
// it must cover the kernel's timer slack, or tokens overflow while tbf waits for its next wake-up and
// the link runs below RATE. Measured here
// (TCP, 2 ranks): 1 ms of traffic gave 91-93% of the 500mbit line rate, 2 ms and more ~96% (all
// that is left after Ethernet/IP/TCP headers); 4 ms (rate / 250) leaves a margin. limit: bytes queued
// waiting for tokens before tbf drops; 50 ms of traffic is enough that TCP senders, not drops, set
// the pace (no drops were seen at 500mbit..10gbit).
constexpr double kBurstSeconds = 0.004;
constexpr double kMinBurstBytes = 64 * 1024;
constexpr double kQueueSeconds = 0.050;

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// Runs one ip/tc command; a failure is a NetError quoting the command and what it printed.
void must(const std::vector<std::string>& argv) {
  const CommandResult r = run_command(argv);
  if (r.code != 0) {
    throw NetError(fmt::format("network setup failed: '{}' exited with code {}: {}", command_text(argv), r.code,
                               r.output.empty() ? "(no output)" : one_line(r.output)));
  }
}

// True if `pid` is a live ddp_launch. A pid that now belongs to another program (pids are reused)
// counts as gone: its namespaces cannot be in use by it.
bool launcher_alive(long pid) {
  if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) return false;
  std::ifstream comm(fmt::format("/proc/{}/comm", pid));
  std::string name;
  return !(comm >> name) || name == "ddp_launch";
}

// The pid in "dpnet<pid>-b" / "dpnet<pid>-r<i>", or -1 if `name` is not one of ours.
long tag_pid(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return -1;
  std::size_t i = kPrefix.size(), digits = 0;
  while (i + digits < name.size() && std::isdigit(static_cast<unsigned char>(name[i + digits]))) ++digits;
  if (digits == 0 || digits > 9 || i + digits >= name.size() || name[i + digits] != '-') return -1;
  const std::string rest = name.substr(i + digits + 1);
  const bool rank_ns = rest.size() > 1 && rest[0] == 'r' &&
                       std::all_of(rest.begin() + 1, rest.end(), [](unsigned char c) { return std::isdigit(c); });
  if (rest != "b" && !rank_ns) return -1;
  return std::atol(name.substr(i, digits).c_str());
}

}  // namespace

std::vector<std::string> remove_stale_namespaces(std::vector<std::string>& failures) {
  std::vector<std::string> stale, removed;
  if (DIR* d = ::opendir(kNetnsDir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const long pid = tag_pid(e->d_name);
      // Our own pid: we have built nothing yet, so these are a dead launcher's that had our pid.
      if (pid > 0 && (pid == ::getpid() || !launcher_alive(pid))) stale.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  std::sort(stale.begin(), stale.end());
  if (!stale.empty()) check_net_prerequisites();  // nothing to remove needs no privilege
  for (const std::string& name : stale) {
    const CommandResult r = run_command({"ip", "netns", "delete", name});
    if (r.code == 0) {
      removed.push_back(fmt::format("removed network namespace {} (launcher pid {} is gone)", name, tag_pid(name)));
    } else {
      failures.push_back(fmt::format("cannot remove network namespace {}: {}", name, one_line(r.output)));
    }
  }
  return removed;
}

int net_cleanup_main() {
  std::vector<std::string> failures;
  const auto removed = remove_stale_namespaces(failures);
  for (const auto& line : removed) std::printf("%s\n", line.c_str());
  if (removed.empty() && failures.empty()) {
    std::printf("nothing to remove: no network namespace of a dead ddp_launch\n");
  }
  std::fflush(stdout);
  for (const auto& line : failures) say(line);
  return failures.empty() ? 0 : 1;
}

Network::Network(const NetSpec& spec, int nproc)
    : spec_(spec), nproc_(nproc), tag_(fmt::format("{}{}", kPrefix, ::getpid())) {
  try {
    build();
  } catch (...) {
    teardown();  // a half-built network must not outlive a failed start
    throw;
  }
}

Network::~Network() { teardown(); }

std::vector<std::pair<std::string, std::string>> Network::rank_env(int local_rank) const {
  std::vector<std::pair<std::string, std::string>> env{{"MASTER_ADDR", ipv4_text(spec_.subnet + 1)},
                                                       {"GLOO_SOCKET_IFNAME", fmt::format("{}{}", kPrefix, local_rank)},
                                                       {"DP_NET", spec_.rate_text},
                                                       {"DP_NET_BIT_S", std::to_string(spec_.rate_bit_s)}};
  if (spec_.nodes > 0) {  // without --net-nodes nothing is added: a flat run's environment is as it was
    env.insert(env.end(), {{"DP_NET_NODES", std::to_string(spec_.nodes)},
                           {"DP_NET_UPLINK", spec_.uplink_text},
                           {"DP_NET_UPLINK_BIT_S", std::to_string(spec_.uplink_bit_s)}});
  }
  return env;
}

void Network::add_namespace(const std::string& name) {
  must({"ip", "netns", "add", name});
  created_.push_back(name);
  must({"ip", "-n", name, "link", "set", "lo", "up"});  // programs may still talk to themselves
}

void Network::build() {
  check_net_prerequisites();
  std::vector<std::string> failures;
  for (const auto& line : remove_stale_namespaces(failures)) say(line);
  for (const auto& line : failures) say(line);

  // The "switch": a bridge without an address in a namespace of its own.
  const std::string bridge_ns = tag_ + "-b";
  add_namespace(bridge_ns);
  if (spec_.delay_ms > 0) check_netem();  // before any rank exists: fail fast, and exit 2
  if (spec_.nodes > 0 && spec_.uplink_bit_s > spec_.rate_bit_s) {
    say(
        fmt::format("note: --net-uplink {} is faster than --net {}: the rank links, not the uplinks, set the pace "
                    "between nodes",
                    spec_.uplink_text, spec_.rate_text));
  }
  must({"ip", "-n", bridge_ns, "link", "add", kBridge, "type", "bridge"});
  must({"ip", "-n", bridge_ns, "link", "set", kBridge, "up"});
  for (int n = 0; n < spec_.nodes; ++n) build_uplink(n);
  for (int i = 0; i < nproc_; ++i) build_rank(i);
  for (int i = 0; i < nproc_; ++i) {
    const std::string path = fmt::format("{}/{}-r{}", kNetnsDir, tag_, i);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw NetError(fmt::format("network setup failed: cannot open {}: {}", path, std::strerror(errno)));
    fds_.push_back(fd);
  }
}

// --net-nodes, node n: its bridge dpnet-n<n>, joined to the spine (dpnet-br) by the veth pair dpup<n> /
// dpup<n>-s, both in the bridge namespace. Both ends shaped to the uplink rate: dpup<n> limits what leaves
// the node, dpup<n>-s what enters it. No delay: --net-delay is the rank links'.
void Network::build_uplink(int n) {
  const std::string ns = tag_ + "-b", bridge = node_bridge(n), dev = uplink_dev(n), spine = uplink_spine_dev(n);
  must({"ip", "-n", ns, "link", "add", bridge, "type", "bridge"});
  must({"ip", "-n", ns, "link", "set", bridge, "up"});
  must({"ip", "-n", ns, "link", "add", dev, "type", "veth", "peer", "name", spine});
  if (::access("/proc/sys/net/ipv6", F_OK) == 0) {
    must({"ip", "-n", ns, "link", "set", dev, "addrgenmode", "none"});
    must({"ip", "-n", ns, "link", "set", spine, "addrgenmode", "none"});
  }
  must({"ip", "-n", ns, "link", "set", dev, "master", bridge, "up"});
  must({"ip", "-n", ns, "link", "set", spine, "master", kBridge, "up"});
  shape(ns, dev, spec_.uplink_bit_s, false);
  shape(ns, spine, spec_.uplink_bit_s, false);
}

// Rank i: namespace dpnet<pid>-r<i> with interface dpnet<i> (address subnet+i+1), whose veth peer
// dpnet<i>-br is a port of the bridge (with --net-nodes, of its node's bridge). Both ends shaped: the
// rank's end limits what it sends, the bridge's end what it receives.
void Network::build_rank(int i) {
  const std::string ns = fmt::format("{}-r{}", tag_, i), bridge_ns = tag_ + "-b";
  const std::string dev = fmt::format("{}{}", kPrefix, i), peer = dev + "-br";
  add_namespace(ns);
  // Created directly inside the two namespaces: the pair never exists in the root namespace.
  must({"ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", peer, "netns", bridge_ns});
  if (::access("/proc/sys/net/ipv6", F_OK) == 0) {
    // No IPv6 link-local addresses: no router solicitations or DAD on the shaped link, and Gloo,
    // which takes the first address of GLOO_SOCKET_IFNAME, finds only the IPv4 one.
    must({"ip", "-n", ns, "link", "set", dev, "addrgenmode", "none"});
    must({"ip", "-n", bridge_ns, "link", "set", peer, "addrgenmode", "none"});
  }
  const uint32_t host = spec_.subnet + static_cast<uint32_t>(i) + 1;
  const std::string addr = fmt::format("{}/{}", ipv4_text(host), spec_.prefix_len);
  must({"ip", "-n", ns, "addr", "add", addr, "dev", dev});  // on-link route only: no default route
  must({"ip", "-n", ns, "link", "set", dev, "up"});
  const std::string bridge = spec_.nodes > 0 ? node_bridge(spec_.node_of(i, nproc_)) : kBridge;
  must({"ip", "-n", bridge_ns, "link", "set", peer, "master", bridge, "up"});
  shape(ns, dev, spec_.rate_bit_s, spec_.delay_ms > 0);
  shape(bridge_ns, peer, spec_.rate_bit_s, false);  // the delay is one-way: added once, on the sender's side
}

void Network::shape(const std::string& ns, const std::string& dev, uint64_t rate_bit_s, bool with_delay) {
  const double bytes_per_s = static_cast<double>(rate_bit_s) / 8;
  const auto burst = static_cast<long long>(std::max(bytes_per_s * kBurstSeconds, kMinBurstBytes));
  const auto limit = burst + static_cast<long long>(bytes_per_s * kQueueSeconds);
  std::vector<std::string> tbf{
      "tbf", "rate", fmt::format("{}bit", rate_bit_s), "burst", std::to_string(burst), "limit", std::to_string(limit)};
  std::vector<std::string> cmd{"tc", "-n", ns, "qdisc", "add", "dev", dev};
  if (with_delay) {
    // netem delays every packet, then hands it to its child, the tbf. netem's limit counts packets: it
    // must hold a delay's worth of full-rate traffic (at least 1500-byte frames) and some more.
    const auto delay_us = static_cast<long long>(spec_.delay_ms * 1000 + 0.5);
    const auto packets = std::max(1000LL, static_cast<long long>(2 * bytes_per_s * spec_.delay_ms / 1000 / 1500));
    auto root = cmd;
    root.insert(root.end(), {"root", "handle", "1:", "netem", "delay", fmt::format("{}us", delay_us), "limit",
                             std::to_string(packets)});
    must(root);
    cmd.insert(cmd.end(), {"parent", "1:1", "handle", "10:"});
  } else {
    cmd.push_back("root");
  }
  cmd.insert(cmd.end(), tbf.begin(), tbf.end());
  must(cmd);
}

// netem is a kernel module (sch_netem) that some kernels lack. Try to load it, then add one to the
// bridge namespace's lo as a test; if that fails, say what both said.
void Network::check_netem() {
  std::string modprobe = find_in_path("modprobe");
  for (const char* p : {"/sbin/modprobe", "/usr/sbin/modprobe"}) {
    if (modprobe.empty() && ::access(p, X_OK) == 0) modprobe = p;
  }
  std::string note = "modprobe not found";
  if (!modprobe.empty()) {
    const CommandResult r = run_command({modprobe, "sch_netem"});
    note = r.code == 0 ? "modprobe sch_netem succeeded" : "modprobe sch_netem failed: " + one_line(r.output);
  }
  const std::string ns = created_.front();
  const CommandResult r = run_command({"tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"});
  if (r.code != 0) {
    throw UsageError(fmt::format("netem is not available in this kernel ({}; tc said: {}); run without --net-delay",
                                 note, one_line(r.output)));
  }
  must({"tc", "-n", ns, "qdisc", "del", "dev", "lo", "root"});
}

void Network::teardown() noexcept {
  try {
    for (int fd : fds_) ::close(fd);  // an open descriptor would keep its namespace alive
    fds_.clear();
    // Rank namespaces first (each takes its veth pair along), the bridge's last (and the bridges and
    // uplinks in it).
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
      const CommandResult r = run_command({"ip", "netns", "delete", *it});
      if (r.code != 0) say(fmt::format("cannot remove network namespace {}: {}", *it, one_line(r.output)));
    }
    created_.clear();
  } catch (...) {  // out of memory while formatting: nothing sensible is left to do
  }
}

}  // namespace ddp_launch
