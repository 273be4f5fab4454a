// --net's option values, and whether this process may build the network at all.
#include "command.hpp"
#include "net.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

namespace ddp_launch {
namespace {

// "e.g. --net 1gbit, ..." with the flag that was given (--net or --net-uplink).
std::string rate_examples(const std::string& flag) {
  return fmt::format(
      "e.g. {0} 1gbit, {0} 500mbit or {0} 10gbit (tc's units: bit, kbit, mbit, gbit, tbit; "
      "bps, kbps, mbps, gbps, tbps are bytes/s)",
      flag);
}

// Below 1 Mbit/s the token bucket's smallest sensible burst (64 KiB, see net.cpp) is half a second
// of traffic, so the link would no longer look like RATE; above 1 Tbit/s tbf cannot keep up anyway.
constexpr double kMinRate = 1e6, kMaxRate = 1e12;  // bits/s

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The Linux capabilities this process holds in its effective set (/proc/self/status, "CapEff").
bool has_capability(int bit) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    const unsigned long long caps = std::strtoull(line.c_str() + 7, nullptr, 16);
    return (caps >> bit) & 1ULL;
  }
  return ::geteuid() == 0;  // no /proc: assume root has everything
}

}  // namespace

uint64_t parse_rate(const std::string& text, const std::string& flag) {
  const std::string s = lower(text);
  // A plain decimal number (digits, at most one '.'), then a unit: no sign, no exponent, no blanks.
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  const std::string number = s.substr(0, i), unit = s.substr(i);
  struct Unit {
    const char* name;
    double bits;
  };
  static const Unit kUnits[] = {{"bit", 1},
                                {"kbit", 1e3},
                                {"mbit", 1e6},
                                {"gbit", 1e9},
                                {"tbit", 1e12},
                                {"kibit", 1024.0},
                                {"mibit", 1048576.0},
                                {"gibit", 1073741824.0},
                                {"tibit", 1099511627776.0},
                                {"bps", 8},
                                {"kbps", 8e3},
                                {"mbps", 8e6},
                                {"gbps", 8e9},
                                {"tbps", 8e12},
                                {"kibps", 8 * 1024.0},
                                {"mibps", 8 * 1048576.0},
                                {"gibps", 8 * 1073741824.0},
                                {"tibps", 8 * 1099511627776.0}};
  const Unit* found = nullptr;
  for (const Unit& u : kUnits) {
    if (unit == u.name) found = &u;
  }
  const bool number_ok = !number.empty() && std::count(number.begin(), number.end(), '.') <= 1 &&
                         std::isdigit(static_cast<unsigned char>(number[0]));
  if (!number_ok || !found) {
    throw UsageError(
        fmt::format("{} expects a positive rate with a unit, got '{}'; {}", flag, text, rate_examples(flag)));
  }
  const double bits = std::strtod(number.c_str(), nullptr) * found->bits;
  if (bits == 0)
    throw UsageError(fmt::format("{} rate must be positive, got '{}'; {}", flag, text, rate_examples(flag)));
  if (bits < kMinRate || bits > kMaxRate) {
    throw UsageError(
        fmt::format("{} rate must be between 1mbit and 1tbit, got '{}'; {}", flag, text, rate_examples(flag)));
  }
  return static_cast<uint64_t>(std::llround(bits));
}

void parse_subnet(const std::string& text, int hosts, NetSpec& spec) {
  const std::string example = "e.g. --net-subnet 198.18.0.0/15 or --net-subnet 198.19.0.0/24";
  const auto slash = text.find('/');
  in_addr addr{};
  const std::string len_text = slash == std::string::npos ? "" : text.substr(slash + 1);
  const bool len_ok = !len_text.empty() && len_text.size() <= 2 &&
                      std::all_of(len_text.begin(), len_text.end(), [](unsigned char c) { return std::isdigit(c); });
  const int len = len_ok ? std::atoi(len_text.c_str()) : -1;
  if (slash == std::string::npos || ::inet_pton(AF_INET, text.substr(0, slash).c_str(), &addr) != 1 || len < 0 ||
      len > 32) {
    throw UsageError(fmt::format("--net-subnet expects an IPv4 network ADDRESS/LENGTH, got '{}'; {}", text, example));
  }
  const uint32_t net = ntohl(addr.s_addr);
  const uint32_t mask = len == 0 ? 0 : ~0U << (32 - len);
  if ((net & ~mask) != 0) {
    throw UsageError(fmt::format("--net-subnet '{}' has host bits set; use its network address, {}/{}", text,
                                 ipv4_text(net & mask), len));
  }
  // Every rank needs an address; the network and broadcast addresses are nobody's.
  const uint64_t room = len >= 31 ? 0 : (uint64_t{1} << (32 - len)) - 2;
  if (room < static_cast<uint64_t>(hosts)) {
    throw UsageError(
        fmt::format("--net-subnet '{}' has room for {} hosts, but --nproc {} needs {}; use a shorter "
                    "prefix (a larger network), {}",
                    text, room, hosts, hosts, example));
  }
  spec.subnet = net;
  spec.prefix_len = len;
}

double parse_delay_ms(const std::string& text) {
  char* end = nullptr;
  const double ms = text.empty() ? NAN : std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(ms) || ms <= 0 || ms > 10000) {
    throw UsageError(fmt::format(
        "--net-delay expects milliseconds of added one-way delay, > 0 and at most 10000, got '{}'; e.g. --net-delay 1",
        text));
  }
  return ms;
}

std::string ipv4_text(uint32_t addr) {
  return fmt::format("{}.{}.{}.{}", addr >> 24, (addr >> 16) & 255, (addr >> 8) & 255, addr & 255);
}

void check_net_prerequisites() {
  // CAP_NET_ADMIN (12) for links, addresses and qdiscs; CAP_SYS_ADMIN (21) because `ip netns add`
  // mounts the namespace under /run/netns and setns() into a network namespace requires it.
  std::string missing;
  if (!has_capability(12)) missing = "CAP_NET_ADMIN";
  if (!has_capability(21)) missing += std::string(missing.empty() ? "" : " and ") + "CAP_SYS_ADMIN";
  if (!missing.empty()) {
    throw UsageError(fmt::format(
        "--net needs CAP_NET_ADMIN and CAP_SYS_ADMIN to create network namespaces, links and qdiscs, and this "
        "process lacks {}; run as root (e.g. sudo), or in a container started with --cap-add NET_ADMIN "
        "--cap-add SYS_ADMIN",
        missing));
  }
  for (const char* tool : {"ip", "tc"}) {
    if (find_in_path(tool).empty()) {
      throw UsageError(
          fmt::format("--net needs '{}' (iproute2), which is not on PATH; apt-get install iproute2, "
                      "or add /usr/sbin or /sbin to PATH",
                      tool));
    }
  }
}

}  // namespace ddp_launch
