// Helpers for the --net tests: whether this machine can run them, and what a launcher left behind.
#pragma once

#include "harness.hpp"

#include <cstdio>
#include <set>

namespace launcher_test {

// stdout of a shell command line (test-side inspection only: `ip netns list`, `tc ... qdisc show`).
inline std::string capture(const std::string& command) {
  std::string out;
  if (FILE* p = ::popen((command + " 2>&1").c_str(), "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

inline bool on_path(const std::string& tool) { return capture("command -v " + tool).find('/') != std::string::npos; }

// Effective capabilities of this process (the launcher inherits them): CAP_NET_ADMIN is bit 12,
// CAP_SYS_ADMIN bit 21.
inline bool has_capability(int bit) {
  std::istringstream in(slurp("/proc/self/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("CapEff:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> bit) & 1ULL;
  }
  return ::geteuid() == 0;
}

// Why --net cannot work here ("" if it can). Tests that build namespaces GTEST_SKIP with this.
inline std::string net_skip_reason() {
  if (!has_capability(12) || !has_capability(21)) {
    return "--net needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), which this test process lacks";
  }
  for (const char* tool : {"ip", "tc"}) {
    if (!on_path(tool)) return std::string("--net needs '") + tool + "' (iproute2), not on PATH";
  }
  return "";
}

#define SKIP_WITHOUT_NET()                                                                             \
  do {                                                                                                 \
    if (const std::string why = ::launcher_test::net_skip_reason(); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

// `err` without the lines in which a --net launcher says it removed an earlier launcher's leftovers
// ("ddp_launch: removed network namespace dpnet12-r0 (launcher pid 12 is gone)"). /run/netns can hold
// namespaces of a launcher that died before this test began -- a killed run, or a machine whose disk
// kept /run/netns while its namespaces were lost -- and the first --net launch removes them and says
// so: right, but not what a test of this launcher's own output asserts. Every other line stays.
inline std::string without_leftover_notes(const std::string& err) {
  std::istringstream in(err);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const bool note = line.rfind("ddp_launch: removed network namespace dpnet", 0) == 0 && line.size() > 9 &&
                      line.compare(line.size() - 9, 9, " is gone)") == 0;
    if (!note) kept += line + "\n";
  }
  return kept;
}

// The named network namespaces of launcher `pid` ("dpnet<pid>-b", "dpnet<pid>-r0", ...), as
// `ip netns list` shows them (or /run/netns, where `ip` is missing).
inline std::set<std::string> namespaces_of(pid_t pid) {
  const std::string tag = "dpnet" + std::to_string(pid) + "-";
  std::set<std::string> out;
  if (on_path("ip")) {
    std::istringstream in(capture("ip netns list"));
    for (std::string line; std::getline(in, line);) {
      const std::string name = line.substr(0, line.find(' '));  // "dpnet12-r0 (id: 3)"
      if (name.rfind(tag, 0) == 0) out.insert(name);
    }
  } else if (DIR* d = ::opendir("/run/netns")) {
    while (const dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind(tag, 0) == 0) out.insert(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

// Nothing of launcher `pid` may remain: no namespace with its tag, and (never expected, as links are
// created inside the namespaces) no dpnet* interface in the root namespace. The qdiscs live on
// interfaces inside those namespaces, so with the namespaces gone they are gone too.
inline void expect_no_leftovers(pid_t pid) {
  const auto left = namespaces_of(pid);
  EXPECT_TRUE(left.empty()) << "namespace left behind: " << *left.begin();
  if (on_path("ip")) {
    const std::string links = capture("ip -o link show");
    EXPECT_EQ(links.find("dpnet"), std::string::npos) << "a dpnet link in the root namespace:\n" << links;
  }
}

}  // namespace launcher_test
