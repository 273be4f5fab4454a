// ddp_launch --net: each rank in a network namespace of its own behind a shaped link. Checks what
// the ranks see, that they reach each other, and that every way the launcher can end -- success, a
// failing or killed rank, SIGTERM, SIGKILL followed by a cleanup -- leaves no namespace behind.
//
// Tests that build namespaces need root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2; without them
// they are SKIPPED with the reason. They share the resource lock "dpnet" (CMakeLists.txt), because a
// --net run removes dead launchers' leftovers, which the SIGKILL tests inspect. Bandwidth is checked
// by the ctest tests launcher_net_busbw_* (net_bandwidth.sh) with the real stage01 program.
#include "net_harness.hpp"

#include <sched.h>

#include <algorithm>

using namespace launcher_test;

namespace {

const std::string kProbe = DP_PROBE_BIN;

// Waits (at most 10 s) until `n` ranks have written their pid file: their network is up.
void wait_for_ranks(const Sandbox& box, std::size_t n) {
  for (int i = 0; i < 1000 && box.recorded_pids().size() < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(box.recorded_pids().size(), n) << "the ranks never came up";
}

// `probe net` on `nproc` ranks: each sees only lo and its own interface, with the (r+1)-th address of
// `net_prefix` ("198.18.0." for the default 198.18.0.0/15); rank 0 is reached by all the others from
// their distinct addresses.
void expect_cluster(const Result& r, int nproc, const std::string& rate, const std::string& net_prefix,
                    const std::string& len) {
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(without_leftover_notes(r.err), "") << "the launcher said more than that it removed leftovers";
  auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), static_cast<std::size_t>(nproc)) << r.out;
  std::vector<std::string> sorted_peers;  // PEERS is sorted as strings ("10" before "2")
  for (int i = 2; i <= nproc; ++i) sorted_peers.push_back(net_prefix + std::to_string(i));
  std::sort(sorted_peers.begin(), sorted_peers.end());
  std::string peers;
  for (const auto& p : sorted_peers) peers += (peers.empty() ? "" : ",") + p;
  for (auto& [rank, env] : ranks) {
    const std::string dev = "dpnet" + std::to_string(rank);
    EXPECT_EQ(env["GLOO_SOCKET_IFNAME"], dev);
    EXPECT_EQ(env["MASTER_ADDR"], net_prefix + "1");
    EXPECT_EQ(env["DP_NET"], rate);
    EXPECT_EQ(env["IFACES"], dev + ",lo") << "rank " << rank << " must see only its own link";
    EXPECT_EQ(env["ADDR"], net_prefix + std::to_string(rank + 1) + "/" + len);
    if (rank == 0) {
      EXPECT_EQ(env["PEERS"], peers) << "rank 0 must be reached by every other rank, from its own address";
    } else {
      EXPECT_FALSE(env["CONNECT_MS"].empty()) << "rank " << rank << " did not reach rank 0";
    }
  }
}

// Starts a --net launcher whose ranks hold for a minute, then SIGKILLs it once they are up: what it
// built stays behind (the premise of the cleanup tests). Returns the dead launcher's pid.
pid_t leave_leftovers(const Sandbox& box) {
  const Running run = start(box, {"--nproc", "2", "--net", "1gbit", "--", kProbe, "net", "60"});
  wait_for_ranks(box, 2);
  ::kill(run.pid, SIGKILL);
  const Result r = finish(run);
  EXPECT_EQ(r.code, 137);
  expect_all_gone(box, 2);  // PDEATHSIG took the ranks
  EXPECT_EQ(namespaces_of(run.pid).size(), 3u) << "after SIGKILL, the namespaces should still be there";
  return run.pid;
}

}  // namespace

TEST(LauncherNet, FourRanksGetOwnLinksAndReachRankZero) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run = start(box, {"--nproc", "4", "--net", "1gbit", "--", kProbe, "net"});
  expect_cluster(finish(run), 4, "1gbit", "198.18.0.", "15");
  expect_no_leftovers(run.pid);
}

TEST(LauncherNet, EightRanksCompose) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run = start(box, {"--nproc", "8", "--net", "10GBIT", "--", kProbe, "net"});
  expect_cluster(finish(run), 8, "10gbit", "198.18.0.", "15");
  expect_no_leftovers(run.pid);
}

TEST(LauncherNet, SubnetOption) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run =
      start(box, {"--nproc", "3", "--net", "500mbit", "--net-subnet", "198.19.7.0/29", "--", kProbe, "net"});
  expect_cluster(finish(run), 3, "500mbit", "198.19.7.", "29");
  expect_no_leftovers(run.pid);
}

// While the ranks run: both ends of each veth carry a tbf at RATE, there is no default route, and
// nothing is in the root namespace. Then SIGTERM to the launcher removes it all.
TEST(LauncherNet, LinksAreShapedWhileRunningAndSigtermTearsDown) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run = start(box, {"--nproc", "2", "--net", "500mbit", "--", kProbe, "net", "60"});
  wait_for_ranks(box, 2);
  const std::string tag = "dpnet" + std::to_string(run.pid);
  EXPECT_EQ(namespaces_of(run.pid), (std::set<std::string>{tag + "-b", tag + "-r0", tag + "-r1"}));
  const std::vector<std::pair<std::string, std::string>> links{
      {tag + "-r0", "dpnet0"}, {tag + "-r1", "dpnet1"}, {tag + "-b", "dpnet0-br"}, {tag + "-b", "dpnet1-br"}};
  for (const auto& [ns, dev] : links) {
    const std::string qdisc = capture("tc -n " + ns + " qdisc show dev " + dev);
    EXPECT_NE(qdisc.find("tbf"), std::string::npos) << ns << " " << dev << ": " << qdisc;
    EXPECT_NE(qdisc.find("rate 500Mbit"), std::string::npos) << ns << " " << dev << ": " << qdisc;
  }
  EXPECT_EQ(capture("ip -n " + tag + "-r0 route show default"), "") << "no route may lead off the machine";
  EXPECT_EQ(capture("ip -o link show").find("dpnet"), std::string::npos) << "nothing of ours in the root namespace";
  ::kill(run.pid, SIGTERM);
  const Result r = finish(run);
  EXPECT_EQ(r.code, 143) << r.err;
  expect_all_gone(box, 2);
  expect_no_leftovers(run.pid);
}

TEST(LauncherNet, FailingRankTearsDown) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run = start(box, {"--nproc", "2", "--net", "1gbit", "--", kProbe, "exit", "1", "3"});
  const Result r = finish(run);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("ddp_launch: rank 1 exited with code 3"), std::string::npos) << r.err;
  expect_all_gone(box, 4);
  expect_no_leftovers(run.pid);
}

TEST(LauncherNet, KilledRankTearsDown) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run = start(box, {"--nproc", "3", "--net", "1gbit", "--", kProbe, "kill", "1"});
  const Result r = finish(run);
  EXPECT_EQ(r.code, 137) << r.err;
  expect_all_gone(box, 6);
  expect_no_leftovers(run.pid);
}

// A command failing half-way through the setup (here a fake `tc`): exit 1 quoting the command and
// what it said, no rank started, and the namespaces made so far removed again.
TEST(LauncherNet, SetupFailureHalfWayTearsDown) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const std::string bin = box.dir() + "/bin";
  ::mkdir(bin.c_str(), 0700);
  std::string ip = capture("command -v ip");
  ip.erase(ip.find_last_not_of('\n') + 1);
  ASSERT_EQ(::symlink(ip.c_str(), (bin + "/ip").c_str()), 0);
  std::ofstream(bin + "/tc") << "#!/bin/sh\necho 'Error: this tc refuses' >&2\nexit 1\n";
  ::chmod((bin + "/tc").c_str(), 0700);
  const Running run = start(box, {"--nproc", "2", "--net", "1gbit", "--", kProbe, "net"}, {{"PATH", bin}});
  const Result r = finish(run);
  EXPECT_EQ(r.code, 1) << r.err;
  const std::string tag = "dpnet" + std::to_string(run.pid);
  EXPECT_NE(r.err.find("ddp_launch: error: network setup failed: 'tc -n " + tag +
                       "-r0 qdisc add dev dpnet0 root tbf "
                       "rate 1000000000bit"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("exited with code 1: Error: this tc refuses"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "") << "no rank may have started";
  expect_no_leftovers(run.pid);
}

TEST(LauncherNet, SigkillLeftoversGoWithNetCleanup) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const pid_t dead = leave_leftovers(box);
  const Result r = run(box, {"--net-cleanup"});
  EXPECT_EQ(r.code, 0) << r.err;
  const std::string tag = "dpnet" + std::to_string(dead);
  for (const std::string ns : {tag + "-b", tag + "-r0", tag + "-r1"}) {
    EXPECT_NE(r.out.find("removed network namespace " + ns + " (launcher pid " + std::to_string(dead) + " is gone)"),
              std::string::npos)
        << r.out;
  }
  expect_no_leftovers(dead);
  EXPECT_NE(run(box, {"--net-cleanup"}).out.find("nothing to remove"), std::string::npos);
}

TEST(LauncherNet, SigkillLeftoversGoWithTheNextRun) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const pid_t dead = leave_leftovers(box);
  const Running next = start(box, {"--nproc", "1", "--net", "1gbit", "--", kProbe, "sleep", "0"});
  const Result r = finish(next);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("ddp_launch: removed network namespace dpnet" + std::to_string(dead) + "-r1"), std::string::npos)
      << r.err;
  expect_no_leftovers(dead);
  expect_no_leftovers(next.pid);
}

// A cleanup must never touch the namespaces of a launcher that is still running.
TEST(LauncherNet, CleanupSparesLiveLaunchers) {
  SKIP_WITHOUT_NET();
  Sandbox box, other;
  const Running live = start(box, {"--nproc", "2", "--net", "1gbit", "--", kProbe, "net", "60"});
  wait_for_ranks(box, 2);
  const Result r = run(other, {"--net-cleanup"});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.find("dpnet" + std::to_string(live.pid)), std::string::npos) << r.out;
  EXPECT_EQ(namespaces_of(live.pid).size(), 3u);
  ::kill(live.pid, SIGTERM);
  EXPECT_EQ(finish(live).code, 143);
  expect_no_leftovers(live.pid);
}

// --net-nodes: torchrun's contract as the simulated nodes see it. 6 ranks in 2 nodes of 3 (not 4 in 2 of 2, where
// i mod nodes and i mod ranks-per-node agree): rank i is local rank i mod 3 of node i / 3, while RANK, WORLD_SIZE
// and the interface (dpnet<i>) keep the launcher's machine-wide index.
TEST(LauncherNetNodes, RanksSeeTheirSimulatedNode) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run =
      start(box, {"--nproc", "6", "--net", "10gbit", "--net-nodes", "2", "--net-uplink", "1GBIT", "--", kProbe, "env"});
  const Result r = finish(run);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(without_leftover_notes(r.err), "");
  auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 6u) << r.out;
  for (auto& [i, env] : ranks) {
    EXPECT_EQ(env["RANK"], std::to_string(i));
    EXPECT_EQ(env["WORLD_SIZE"], "6");
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(i % 3)) << "rank " << i;
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3") << "rank " << i;
    EXPECT_EQ(env["GROUP_RANK"], std::to_string(i / 3)) << "rank " << i;
    EXPECT_EQ(env["DP_NET_NODES"], "2");
    EXPECT_EQ(env["DP_NET_UPLINK"], "1gbit");
    EXPECT_EQ(env["DP_NET_UPLINK_BIT_S"], "1000000000");
    EXPECT_EQ(env["DP_NET"], "10gbit");
    EXPECT_EQ(env["GLOO_SOCKET_IFNAME"], "dpnet" + std::to_string(i)) << "the interface is the machine's rank index";
  }
  expect_no_leftovers(run.pid);
}

// Without --net-nodes a --net run's environment is as it always was: one node, none of the new variables.
TEST(LauncherNetNodes, FlatNetAddsNothing) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run = start(box, {"--nproc", "2", "--net", "1gbit", "--", kProbe, "env"});
  const Result r = finish(run);
  EXPECT_EQ(r.code, 0) << r.err;
  auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.out;
  for (auto& [i, env] : ranks) {
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(i));
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    for (const char* key : {"DP_NET_NODES", "DP_NET_UPLINK", "DP_NET_UPLINK_BIT_S"}) EXPECT_EQ(env[key], "<unset>");
  }
  expect_no_leftovers(run.pid);
}

// --cpus-per-rank divides the machine's cores by the launcher's rank index, not by the simulated LOCAL_RANK:
// with 2 nodes of 1 rank both ranks are LOCAL_RANK 0, yet each must get a core of its own.
TEST(LauncherNetNodes, CoresArePinnedByMachineIndex) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  cpu_set_t usable;
  if (::sched_getaffinity(0, sizeof(usable), &usable) != 0 || CPU_COUNT(&usable) < 2)
    GTEST_SKIP() << "one usable core: nothing to divide between two ranks";
  const Running run = start(box, {"--nproc", "2", "--cpus-per-rank", "1", "--net", "10gbit", "--net-nodes", "2",
                                  "--net-uplink", "1gbit", "--", kProbe, "cpus"});
  const Result r = finish(run);
  EXPECT_EQ(r.code, 0) << r.err;
  auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.out;
  EXPECT_NE(ranks[0]["CPUS"], ranks[1]["CPUS"]) << "two ranks pinned to the same core";
  expect_no_leftovers(run.pid);
}

// What --net-nodes builds, while the ranks run: the same namespaces as a flat run; in the bridge namespace one
// bridge per node holding its ranks' ports and its uplink, the spine dpnet-br holding the uplinks' other ends;
// the rank links shaped at RATE, both ends of each uplink at the uplink rate; every rank reaches rank 0 (across
// the spine for node 1). Then SIGTERM removes it all.
TEST(LauncherNetNodes, TwoTiersAreBuiltShapedAndTornDown) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run = start(box, {"--nproc", "4", "--net", "10gbit", "--net-nodes", "2", "--net-uplink", "500mbit",
                                  "--", kProbe, "net", "60"});
  wait_for_ranks(box, 4);
  const std::string tag = "dpnet" + std::to_string(run.pid), bns = tag + "-b";
  EXPECT_EQ(namespaces_of(run.pid), (std::set<std::string>{bns, tag + "-r0", tag + "-r1", tag + "-r2", tag + "-r3"}));
  const std::string links = capture("ip -n " + bns + " -o link show");
  const std::vector<std::pair<std::string, std::string>> ports{
      {"dpnet0-br", "dpnet-n0"}, {"dpnet1-br", "dpnet-n0"}, {"dpnet2-br", "dpnet-n1"}, {"dpnet3-br", "dpnet-n1"},
      {"dpup0", "dpnet-n0"},     {"dpup1", "dpnet-n1"},     {"dpup0-s", "dpnet-br"},   {"dpup1-s", "dpnet-br"}};
  for (const auto& [dev, bridge] : ports) {
    const std::string line = capture("ip -n " + bns + " -o link show dev " + dev);
    EXPECT_NE(line.find(" master " + bridge + " "), std::string::npos)
        << dev << " must be a port of " << bridge << ":\n"
        << line << "\nall:\n"
        << links;
  }
  const auto expect_tbf = [&](const std::string& ns, const std::string& dev, const std::string& rate) {
    const std::string qdisc = capture("tc -n " + ns + " qdisc show dev " + dev);
    EXPECT_NE(qdisc.find("tbf"), std::string::npos) << ns << " " << dev << ": " << qdisc;
    EXPECT_NE(qdisc.find("rate " + rate), std::string::npos) << ns << " " << dev << ": " << qdisc;
  };
  for (const std::string dev : {"dpup0", "dpup0-s", "dpup1", "dpup1-s"}) expect_tbf(bns, dev, "500Mbit");
  for (int i = 0; i < 4; ++i) {
    expect_tbf(tag + "-r" + std::to_string(i), "dpnet" + std::to_string(i), "10Gbit");
    expect_tbf(bns, "dpnet" + std::to_string(i) + "-br", "10Gbit");
  }
  EXPECT_EQ(capture("ip -o link show").find("dpnet"), std::string::npos) << "nothing of ours in the root namespace";
  EXPECT_EQ(capture("ip -o link show").find("dpup"), std::string::npos) << "nothing of ours in the root namespace";
  ::kill(run.pid, SIGTERM);
  const Result r = finish(run);
  EXPECT_EQ(r.code, 143) << r.err;
  auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 4u) << r.out;
  EXPECT_EQ(ranks[0]["PEERS"], "198.18.0.2,198.18.0.3,198.18.0.4") << "every rank must reach rank 0";
  expect_all_gone(box, 4);
  expect_no_leftovers(run.pid);
}

TEST(LauncherNetNodes, FailingRankTearsDown) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run = start(box, {"--nproc", "4", "--net", "10gbit", "--net-nodes", "2", "--net-uplink", "1gbit", "--",
                                  kProbe, "exit", "3", "3"});
  const Result r = finish(run);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("ddp_launch: rank 3 exited with code 3"), std::string::npos) << r.err;
  expect_all_gone(box, 8);
  expect_no_leftovers(run.pid);
}

// An uplink's tc failing (a fake `tc` that refuses everything): exit 1 quoting it, nothing left behind.
TEST(LauncherNetNodes, SetupFailureTearsDown) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const std::string bin = box.dir() + "/bin";
  ::mkdir(bin.c_str(), 0700);
  std::string ip = capture("command -v ip");
  ip.erase(ip.find_last_not_of('\n') + 1);
  ASSERT_EQ(::symlink(ip.c_str(), (bin + "/ip").c_str()), 0);
  std::ofstream(bin + "/tc") << "#!/bin/sh\necho 'Error: this tc refuses' >&2\nexit 1\n";
  ::chmod((bin + "/tc").c_str(), 0700);
  const Running run =
      start(box, {"--nproc", "2", "--net", "10gbit", "--net-nodes", "2", "--net-uplink", "1gbit", "--", kProbe, "net"},
            {{"PATH", bin}});
  const Result r = finish(run);
  EXPECT_EQ(r.code, 1) << r.err;
  const std::string tag = "dpnet" + std::to_string(run.pid);
  EXPECT_NE(r.err.find("network setup failed: 'tc -n " + tag + "-b qdisc add dev dpup0 root tbf rate 1000000000bit"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "") << "no rank may have started";
  expect_no_leftovers(run.pid);
}

// An uplink faster than the rank links is allowed (the rank links then set the pace), with one note.
TEST(LauncherNetNodes, FasterUplinkIsANote) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run = start(box, {"--nproc", "2", "--net", "1gbit", "--net-nodes", "2", "--net-uplink", "10gbit", "--",
                                  kProbe, "sleep", "0"});
  const Result r = finish(run);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(without_leftover_notes(r.err),
            "ddp_launch: note: --net-uplink 10gbit is faster than --net 1gbit: the rank links, not the uplinks, set "
            "the pace between nodes\n");
  expect_no_leftovers(run.pid);
}

namespace {
// Bad input: exit 2, one line naming the value, no rank started, no namespace created.
void expect_net_usage_error(const std::vector<std::string>& args, const std::string& needle, const Env& env = {},
                            const std::vector<std::string>& wrapper = {}) {
  Sandbox box;
  const Running run = start(box, args, env, wrapper);
  const Result r = finish(run);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("ddp_launch: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "'" << needle << "' not in: " << r.err;
  EXPECT_EQ(r.out, "") << "no rank may have started";
  expect_no_leftovers(run.pid);
}
}  // namespace

TEST(LauncherNetUsage, BadValuesExit2) {  // rejected while parsing: needs no privilege
  for (const char* rate : {"fast", "0mbit", "-1gbit", "10", "1gbitt", "1.2.3mbit", "500kbit", "2tbit"}) {
    expect_net_usage_error({"--net", rate, "--", kProbe, "net"}, std::string("'") + rate + "'");
  }
  expect_net_usage_error({"--net", "fast", "--", kProbe, "net"}, "e.g. --net 1gbit");
  for (const char* subnet : {"198.18.0.0", "300.1.0.0/16", "10.0.0.0/33", "10.0.0.0/x", "fe80::/64"}) {
    expect_net_usage_error({"--net", "1gbit", "--net-subnet", subnet, "--", kProbe, "net"},
                           std::string("'") + subnet + "'");
  }
  expect_net_usage_error({"--net", "1gbit", "--net-subnet", "10.0.0.1/24", "--", kProbe, "net"}, "10.0.0.0/24");
  expect_net_usage_error({"--nproc", "4", "--net", "1gbit", "--net-subnet", "10.0.0.0/30", "--", kProbe, "net"},
                         "room for 2 hosts");
  expect_net_usage_error({"--nnodes", "2", "--net", "1gbit", "--", kProbe, "net"},
                         "two real machines need no simulation; --net simulates a cluster on one machine");
  expect_net_usage_error({"--net", "1gbit", "--master-addr", "10.0.0.1", "--", kProbe, "net"}, "--master-addr");
  expect_net_usage_error({"--net-subnet", "10.0.0.0/24", "--", kProbe, "net"}, "add --net RATE");
  expect_net_usage_error({"--net", "1gbit", "--net-delay", "soon", "--", kProbe, "net"}, "'soon'");
  expect_net_usage_error({"--net-cleanup", "--", kProbe}, "runs no program");
}

// --net-nodes / --net-uplink: rejected while parsing, before anything is built (needs no privilege).
TEST(LauncherNetUsage, NodesBadValuesExit2) {
  const auto nodes = [](const std::string& nproc, const std::vector<std::string>& more) {
    std::vector<std::string> args{"--nproc", nproc};
    args.insert(args.end(), more.begin(), more.end());
    args.insert(args.end(), {"--", kProbe, "env"});
    return args;
  };
  expect_net_usage_error(nodes("4", {"--net", "10gbit", "--net-nodes", "3", "--net-uplink", "1gbit"}),
                         "--net-nodes 3 does not divide --nproc 4");
  expect_net_usage_error(nodes("6", {"--net", "10gbit", "--net-nodes", "4", "--net-uplink", "1gbit"}),
                         "use a divisor of 6 (e.g. --net-nodes 2)");
  for (const char* m : {"0", "5", "-1", "two"}) {
    expect_net_usage_error(nodes("4", {"--net", "10gbit", "--net-nodes", m, "--net-uplink", "1gbit"}),
                           std::string("got '") + m + "'");
  }
  expect_net_usage_error(nodes("4", {"--net", "10gbit", "--net-nodes", "5", "--net-uplink", "1gbit"}),
                         "--net-nodes must be 1..4");
  expect_net_usage_error(nodes("4", {"--net-nodes", "2", "--net-uplink", "1gbit"}),
                         "--net-nodes 2 only applies to a simulated network; add --net RATE");
  expect_net_usage_error(nodes("4", {"--net-uplink", "1gbit"}),
                         "--net-uplink 1gbit only applies to a simulated network; add --net RATE");
  expect_net_usage_error(
      nodes("4", {"--net", "10gbit", "--net-uplink", "1gbit"}),
      "--net-uplink 1gbit is the rate between simulated nodes and there are none; add --net-nodes M");
  expect_net_usage_error(nodes("4", {"--net", "10gbit", "--net-nodes", "2"}), "--net-nodes 2 needs --net-uplink RATE");
  for (const char* rate : {"fast", "0mbit", "10", "1gbitt", "500kbit", "2tbit"}) {
    expect_net_usage_error(nodes("4", {"--net", "10gbit", "--net-nodes", "2", "--net-uplink", rate}),
                           std::string("--net-uplink "));
    expect_net_usage_error(nodes("4", {"--net", "10gbit", "--net-nodes", "2", "--net-uplink", rate}),
                           std::string("got '") + rate + "'; e.g. --net-uplink 1gbit");
  }
  expect_net_usage_error(nodes("2", {"--nnodes", "2", "--net", "1gbit", "--net-nodes", "2", "--net-uplink", "1gbit"}),
                         "two real machines need no simulation");
}

// netem: where the kernel lacks it, --net-delay must say so with exit 2 before any rank starts and
// remove the bridge namespace it had already made; where it exists, the delay must show up as a
// TCP handshake of at least two one-way delays.
TEST(LauncherNetUsage, DelayNeedsNetem) {
  SKIP_WITHOUT_NET();
  Sandbox box;
  const Running run = start(box, {"--nproc", "2", "--net", "1gbit", "--net-delay", "20", "--", kProbe, "net"});
  const Result r = finish(run);
  if (r.code == 2) {
    std::cout << "netem is missing here: checking the refusal\n";
    EXPECT_NE(r.err.find("ddp_launch: error: netem is not available in this kernel ("), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("tc said: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("); run without --net-delay"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << "no rank may have started";
  } else {
    std::cout << "netem exists here: checking the delay\n";
    EXPECT_EQ(r.code, 0) << r.err;
    const auto ranks = parse_env(r.out);
    ASSERT_EQ(ranks.size(), 2u) << r.out;
    EXPECT_GE(std::stod(ranks.at(1).at("CONNECT_MS")), 2 * 20 * 0.9) << "SYN and SYN-ACK are each delayed 20 ms";
  }
  expect_no_leftovers(run.pid);
}

TEST(LauncherNetUsage, WithoutPrivilegeExit2) {
  const bool root_like = net_skip_reason().empty();
  if (root_like && !on_path("setpriv")) GTEST_SKIP() << "setpriv (util-linux) is needed to drop capabilities";
  // As root, setpriv drops both capabilities from the bounding set, so the exec'd launcher lacks them.
  const std::vector<std::string> wrapper =
      root_like ? std::vector<std::string>{"setpriv", "--bounding-set", "-net_admin,-sys_admin", "--"}
                : std::vector<std::string>{};
  expect_net_usage_error({"--nproc", "2", "--net", "1gbit", "--", kProbe, "net"}, "CAP_NET_ADMIN", {}, wrapper);
  expect_net_usage_error({"--nproc", "2", "--net", "1gbit", "--", kProbe, "net"}, "run as root", {}, wrapper);
}

TEST(LauncherNetUsage, WithoutIproute2Exit2) {
  SKIP_WITHOUT_NET();
  Sandbox box;  // an empty directory as the whole PATH: neither ip nor tc can be found
  expect_net_usage_error({"--nproc", "2", "--net", "1gbit", "--", kProbe, "net"}, "'ip' (iproute2)",
                         {{"PATH", box.dir() + "/pids"}});
  expect_net_usage_error({"--nproc", "2", "--net", "1gbit", "--", kProbe, "net"}, "apt-get install iproute2",
                         {{"PATH", box.dir() + "/pids"}});
}

TEST(LauncherNetUsage, HelpExplainsNet) {
  Sandbox box;
  const Result r = run(box, {"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* text :
       {"--net RATE", "--net-subnet", "--net-delay", "--net-cleanup", "GLOO_SOCKET_IFNAME", "DP_NET", "198.18.0.0/15",
        "two real machines", "need no simulation", "--net-nodes M", "--net-uplink", "DP_NET_NODES",
        "DP_NET_UPLINK_BIT_S", "dpnet-n<n>", "dpup<n>-s", "LOCAL_RANK = i mod (nproc/M)", "has no default"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text;
  }
}
