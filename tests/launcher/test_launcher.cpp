// End-to-end tests of ddp_launch: run the real binary on launch_probe and check what the ranks saw,
// what the launcher printed, how it exited, and that no process outlived it. One test calls the port rule
// itself (pick_free_port(), compiled in), where the binary cannot be brought to its last resort.
//
// Every run is bounded by a watchdog (finish() SIGKILLs a launcher still running after 30 s), so a
// hang fails the test instead of blocking the suite; ctest adds its own 60 s timeout on top.
#include "harness.hpp"
#include "tools/launch/options.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

using namespace launcher_test;

namespace {

int thread_share(int nproc) { return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN) / nproc)); }

const std::string kProbe = DP_PROBE_BIN;

}  // namespace

TEST(LauncherEnv, FourRanksSeeTheContract) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "4", "--", kProbe, "env"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 4u) << r.out;
  const std::string port = ranks.at(0).at("MASTER_PORT");
  EXPECT_GE(std::stoi(port), 1);
  EXPECT_LE(std::stoi(port), 65535);
  // Outside the ephemeral range, which outgoing connections draw from: none of them can take the port in
  // the moment before rank 0 binds it.
  int lo = 0, hi = 0;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  if (lo > 10000) EXPECT_TRUE(std::stoi(port) < lo || std::stoi(port) > hi) << port << " in " << lo << "-" << hi;
  for (const auto& [rank, env] : ranks) {
    EXPECT_EQ(env.at("RANK"), std::to_string(rank));
    EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(rank));
    EXPECT_EQ(env.at("WORLD_SIZE"), "4");
    EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "4");
    EXPECT_EQ(env.at("GROUP_RANK"), "0");
    EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(env.at("MASTER_PORT"), port) << "all ranks must meet at one port";
    EXPECT_EQ(env.at("DP_LAUNCHER"), "1");
    for (const char* key : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}) {
      EXPECT_EQ(env.at(key), std::to_string(thread_share(4))) << key;
    }
  }
}

TEST(LauncherEnv, ThreadsFlagAndUserValue) {
  Sandbox box;
  auto ranks = parse_env(run(box, {"--nproc", "2", "--threads", "3", "--", kProbe, "env"}).out);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[1]["OMP_NUM_THREADS"], "3");
  // A value the user exported is left alone; the variables they did not set still get the share.
  ranks = parse_env(run(box, {"--nproc", "2", "--", kProbe, "env"}, {{"OMP_NUM_THREADS", "7"}}).out);
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& [rank, env] : ranks) {
    EXPECT_EQ(env["OMP_NUM_THREADS"], "7");
    EXPECT_EQ(env["MKL_NUM_THREADS"], std::to_string(thread_share(2)));
  }
}

// Debian 12's OpenBLAS falls back to its Prescott (SSE3) kernels on CPUs newer than itself, matmuls about 4x
// slower: the launcher then names better ones in OPENBLAS_CORETYPE (a value the user exported wins).
TEST(LauncherEnv, OpenBlasRunsKernelsForThisCpu) {
  Sandbox box;
  auto ranks = parse_env(run(box, {"--nproc", "1", "--", kProbe, "blas"}).out);
  ASSERT_EQ(ranks.size(), 1u);
  auto env = ranks[0];
  if (env["BLAS_CORE"] == "none") GTEST_SKIP() << "no libopenblas.so.0 (apt-get install libopenblas0-pthread)";
  if (env["AVX2"] != "1") GTEST_SKIP() << "a CPU without AVX2 and FMA: Prescott's kernels may be the right ones";
  EXPECT_NE(env["BLAS_CORE"], "Prescott") << "OpenBLAS on its SSE3 kernels on a CPU with AVX2";
  if (env["OPENBLAS_CORETYPE"] != "<unset>") {  // set only where OpenBLAS fell back, to one of two cores
    const std::string core = env["OPENBLAS_CORETYPE"];
    EXPECT_TRUE(core == "SkylakeX" || core == "Haswell") << core;
    EXPECT_EQ(env["BLAS_CORE"], env["OPENBLAS_CORETYPE"]);
  }
  ranks = parse_env(run(box, {"--nproc", "1", "--", kProbe, "blas"}, {{"OPENBLAS_CORETYPE", "Haswell"}}).out);
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0]["OPENBLAS_CORETYPE"], "Haswell");
  EXPECT_EQ(ranks[0]["BLAS_CORE"], "Haswell");
}

TEST(LauncherEnv, MultiNodeRankMath) {
  Sandbox box;
  const Result r = run(box, {"--nnodes", "2", "--node-rank", "1", "--nproc", "2", "--master-addr", "10.0.0.1",
                             "--master-port", "29555", "--", kProbe, "env"});
  EXPECT_EQ(r.code, 0) << r.err;
  auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.out;
  for (int local = 0; local < 2; ++local) {
    auto& env = ranks[2 + local];
    EXPECT_EQ(env["RANK"], std::to_string(2 + local));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], "1");
    EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "29555");
  }
  EXPECT_NE(r.out.find("[rank 3/4] "), std::string::npos);
  // Several nodes without --master-port: all of them fall back to the same fixed port.
  ranks = parse_env(run(box, {"--nnodes", "2", "--node-rank", "0", "--", kProbe, "env"}).out);
  EXPECT_EQ(ranks[0]["MASTER_PORT"], "29500");
}

TEST(LauncherEnv, ProgramWithoutDoubleDash) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "2", kProbe, "env"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(parse_env(r.out).size(), 2u);
}

TEST(LauncherOutput, PrefixRules) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "2", "--", kProbe, "lines"});
  EXPECT_EQ(r.code, 0);
  for (const char* line : {"[rank 0/2] hello from stdout\n", "[rank 1/2] hello from stdout\n", "[rank 0] own tag\n",
                           "[rank 1] own tag\n"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " missing from\n" << r.out;
  }
  EXPECT_EQ(r.out.find("/2] [rank"), std::string::npos) << "a self-tagged line was tagged again";
  EXPECT_NE(r.err.find("[rank 1/2] hello from stderr\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("hello from stderr"), std::string::npos) << "stderr must stay on stderr";
}

TEST(LauncherOutput, NoPrefixAndPartialLine) {
  Sandbox box;
  Result r = run(box, {"--nproc", "1", "--no-prefix", "--", kProbe, "lines"});
  EXPECT_EQ(r.out, "hello from stdout\n[rank 0] own tag\n");
  r = run(box, {"--nproc", "1", "--", kProbe, "partial"});
  EXPECT_EQ(r.out, "[rank 0/1] no newline here\n");
}

TEST(LauncherSupervision, SuccessPrintsNothingOfItsOwn) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "3", "--", kProbe, "sleep", "0.1"});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
}

TEST(LauncherSupervision, FailingRankCodeIsPropagated) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "2", "--", kProbe, "exit", "1", "3"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 3);
  const auto verdict = r.err.find("ddp_launch: rank 1 exited with code 3\n");
  EXPECT_NE(verdict, std::string::npos) << r.err;
  // The rank's own last words come before the launcher's verdict on it.
  EXPECT_LT(r.err.find("[rank 1/2] probe: rank 1 fails on purpose\n"), verdict) << r.err;
  EXPECT_LT(r.seconds, 8.0);
  expect_all_gone(box, 4);  // 2 ranks + 2 grandchildren
}

// A rank that refuses its input (exit 2) is the cause even when a peer's failure (it lost its connection
// to the refusing rank) reached the launcher first: the launcher reports and exits with 2.
TEST(LauncherSupervision, UsageErrorOutranksTheFailureItCaused) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "3", "--timeout", "5", "--", kProbe, "refuse", "1", "1", "0.3"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 2) << r.err;
  const auto first = r.err.find("ddp_launch: rank 1 exited with code 1\n");
  const auto cause = r.err.find("exited with code 2 (a usage error; the failure above followed from it)");
  EXPECT_NE(first, std::string::npos) << r.err;
  EXPECT_NE(cause, std::string::npos) << r.err;
  EXPECT_LT(first, cause) << r.err;
  EXPECT_NE(r.err.find("refuses its input"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 4.0) << "the refusing ranks exit by themselves, before the grace period ends";
  // Only a usage error outranks the first failure: ranks that die of the SIGTERM stay "not news"
  // (KilledRankIsReportedAs137, FailingRankCodeIsPropagated).
}

TEST(LauncherSupervision, KilledRankIsReportedAs137) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "3", "--", kProbe, "kill", "1"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 137);
  EXPECT_NE(r.err.find("ddp_launch: rank 1 was killed by signal 9 (SIGKILL)"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 8.0);
  expect_all_gone(box, 6);
}

TEST(LauncherSupervision, RanksIgnoringSigtermGetSigkillAfterTimeout) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "2", "--timeout", "1", "--", kProbe, "stubborn", "0", "5"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 5);
  EXPECT_NE(r.err.find("rank 0 exited with code 5"), std::string::npos) << r.err;
  EXPECT_GE(r.seconds, 0.9) << "SIGKILL came before the grace period ended";
  EXPECT_LT(r.seconds, 6.0);
  expect_all_gone(box, 4);
}

TEST(LauncherSupervision, LeftoverGrandchildrenAreReapedOnSuccess) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "2", "--", kProbe, "straggler"});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.err, "");
  EXPECT_LT(r.seconds, 8.0);
  expect_all_gone(box, 4);
}

namespace {
// Sends `sig` to a launcher whose ranks (and their grandchildren) are all up.
Result interrupt(const Sandbox& box, int sig) {
  const Running run = start(box, {"--nproc", "2", "--", kProbe, "spawn"});
  for (int i = 0; i < 1000 && box.recorded_pids().size() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(run.pid, sig);
  return finish(run);
}
}  // namespace

TEST(LauncherSignals, SigintStopsEveryRank) {
  Sandbox box;
  const Result r = interrupt(box, SIGINT);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 130);
  EXPECT_NE(r.err.find("ddp_launch: interrupted, stopping 2 ranks"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 8.0);
  expect_all_gone(box, 4);
}

TEST(LauncherSignals, SigtermStopsEveryRank) {
  Sandbox box;
  const Result r = interrupt(box, SIGTERM);
  EXPECT_EQ(r.code, 143);
  expect_all_gone(box, 4);
}

namespace {
// Bad input: ddp_launch refuses it with exit 2 and exactly one line that names the offending value.
void expect_refused(const std::vector<std::string>& args, const std::string& needle) {
  Sandbox box;
  const Result r = run(box, args);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("ddp_launch: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "'" << needle << "' not in: " << r.err;
}
}  // namespace

// --cpus-per-rank K: each rank on K cores of its own, as each owns a GPU on a cluster. Rank i gets the i-th K of
// the cores the launcher may use, K threads, and DP_CPUS_PER_RANK; without the flag every rank may use every core.
TEST(LauncherCpus, EachRankOnCoresOfItsOwn) {
  const std::vector<int> usable = ddp_launch::usable_cpus();
  if (usable.size() < 2) GTEST_SKIP() << "one usable core: nothing to divide between two ranks";
  Sandbox box;
  const Result r = run(box, {"--nproc", "2", "--cpus-per-rank", "1", "--", kProbe, "cpus"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.out;
  for (const auto& [rank, env] : ranks) {
    EXPECT_EQ(env.at("CPUS"), std::to_string(usable[static_cast<std::size_t>(rank)])) << "rank " << rank;
    EXPECT_EQ(env.at("DP_CPUS_PER_RANK"), "1");
    EXPECT_EQ(env.at("OMP_NUM_THREADS"), "1");
  }
  std::string all;
  for (int c : usable) all += (all.empty() ? "" : ",") + std::to_string(c);
  const auto shared = parse_env(run(box, {"--nproc", "2", "--", kProbe, "cpus"}).out);
  ASSERT_EQ(shared.size(), 2u);
  for (const auto& [rank, env] : shared) {
    EXPECT_EQ(env.at("CPUS"), all) << "unpinned rank " << rank;
    EXPECT_EQ(env.at("DP_CPUS_PER_RANK"), "<unset>");
  }
}

TEST(LauncherCpus, RefusesMoreCoresThanItMayUse) {
  const int usable = static_cast<int>(ddp_launch::usable_cpus().size());
  expect_refused({"--nproc", "2", "--cpus-per-rank", std::to_string(usable), "--", kProbe, "cpus"},
                 "needs " + std::to_string(2 * usable) + " cores");
  expect_refused({"--nproc", "1", "--cpus-per-rank", "0", "--", kProbe, "cpus"}, "'0'");
  expect_refused({"--nproc", "1", "--cpus-per-rank", "1", "--threads", "2", "--", kProbe, "cpus"}, "--threads 2");
}

TEST(LauncherUsage, BadValuesExit2) {
  expect_refused({"--nproc", "0", "--", kProbe, "env"}, "'0'");
  expect_refused({"--nproc", "-3", "--", kProbe, "env"}, "'-3'");
  expect_refused({"--nproc", "abc", "--", kProbe, "env"}, "'abc'");
  expect_refused({"--nnodes", "2", "--node-rank", "2", "--", kProbe, "env"}, "--node-rank 2");
  expect_refused({"--master-port", "70000", "--", kProbe, "env"}, "'70000'");
  expect_refused({"--timeout", "soon", "--", kProbe, "env"}, "'soon'");
  expect_refused({"--nproc", "2"}, "no program");
  expect_refused({"--nproc", "2", "--"}, "no program");
  expect_refused({"--frobnicate", "--", kProbe}, "--frobnicate");
  expect_refused({"--nproc"}, "--nproc");  // value missing: CLI11's own error, still exit 2
}

// --free-ports N: the launcher's own port rule, for the scripts that start servers of their own
// (tests/multinode.sh, tests/slurm.sh): N distinct ports, each outside the ephemeral range and free now.
TEST(LauncherUsage, FreePortsFollowTheLaunchersRule) {
  Sandbox box;
  const Result r = run(box, {"--free-ports", "5"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<int> ports;
  std::istringstream lines(r.out);
  for (int port; lines >> port;) ports.push_back(port);
  ASSERT_EQ(ports.size(), 5u) << r.out;
  int lo = 0, hi = 0;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  for (int port : ports) {
    EXPECT_GE(port, 1024) << r.out;
    EXPECT_LE(port, 65535) << r.out;
    EXPECT_NE(port, 29500) << "torchrun's default multi-node port, which a real job may hold";
    if (lo > 10000) EXPECT_TRUE(port < lo || port > hi) << port << " in " << lo << "-" << hi;
    EXPECT_EQ(std::count(ports.begin(), ports.end(), port), 1) << "ports must be distinct: " << r.out;
  }
  expect_refused({"--free-ports", "0"}, "'0'");
  expect_refused({"--free-ports", "2", "--", kProbe, "env"}, "runs no program");
  expect_refused({"--free-ports", "2", "--net-cleanup"}, "give one of them");  // two actions: neither is run
}

// The rule's last resort, the kernel's choice, lies in the ephemeral range: the launcher's own store port
// may take it, --free-ports (kernel_fallback false) must not. Every port outside the range is `taken` here.
TEST(LauncherUsage, FreePortsNeverFallBackToTheKernelsChoice) {
  int lo = 0, hi = 0;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  ASSERT_GT(lo, 0) << "cannot read ip_local_port_range";
  std::vector<int> taken;
  for (int port = 1024; port <= 65535; ++port)
    if (port < lo || port > hi) taken.push_back(port);
  EXPECT_EQ(ddp_launch::pick_free_port(taken, /*kernel_fallback=*/false), 0);
  const int fallback = ddp_launch::pick_free_port(taken, /*kernel_fallback=*/true);
  EXPECT_GE(fallback, lo);
  EXPECT_LE(fallback, hi);
}

TEST(LauncherUsage, MissingProgramExits127) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "2", "--", "/nonexistent/program"});
  EXPECT_EQ(r.code, 127);
  EXPECT_NE(r.err.find("cannot run '/nonexistent/program'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 127"), std::string::npos) << r.err;
}

TEST(LauncherUsage, HelpExplainsTheContract) {
  Sandbox box;
  const Result r = run(box, {"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* text : {"LOCAL_WORLD_SIZE", "MASTER_PORT", "OMP_NUM_THREADS", "DP_LAUNCHER",
                           "--nproc 2 -- ./build/bin/stage01_allreduce", "--nnodes 2 --node-rank 1",
                           "--master-addr 10.0.0.1 --master-port 29500"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text;
  }
}

// ---- --elastic (stage 09): a failed rank does not stop the others ------------------------------------------

// The store's directory, from a rank's "STORE=<dir>/store" line.
static std::string store_dir(const std::string& out) {
  const auto at = out.find("STORE=/");
  if (at == std::string::npos) return {};
  const auto end = out.find("/store ", at);
  return end == std::string::npos ? std::string() : out.substr(at + 6, end - at - 6);
}

TEST(LauncherElastic, DeadRankIsSurvivedAndReplacedInItsSlot) {
  Sandbox box;
  const Result r = run(box, {"--elastic", "--nproc", "3", "--max-restarts", "1", "--min-nproc", "2", "--", kProbe,
                             "elastic", "1", "1.0"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("ddp_launch: rank 1 was killed by signal 9 (SIGKILL); elastic: 2 ranks go on, and a "
                       "replacement starts in its slot (restart 1 of 1)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("[rank 1/3] STORE=/tmp/ddp_launch_elastic."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MIN=2 RESTART=1\n"), std::string::npos) << "the replacement knows it is one: " << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 4) << "3 first processes + 1 replacement: " << r.out;
  const std::string dir = store_dir(r.out);
  ASSERT_FALSE(dir.empty()) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir)) << "the launcher removes the store's directory: " << dir;
  expect_all_gone(box, 4);
}

TEST(LauncherElastic, ReplacementStartsAfterTheRestartDelay) {
  Sandbox box;
  const Result r = run(box, {"--elastic", "--nproc", "2", "--max-restarts", "1", "--restart-delay", "0.6", "--", kProbe,
                             "elastic", "1", "1.2"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("a replacement starts in its slot in 0.6 s (restart 1 of 1)"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("RESTART=1\n"), std::string::npos) << r.out;
  EXPECT_GT(r.seconds, 1.7) << "the replacement (1.2 s of work) started 0.6 s after the failure";
  expect_all_gone(box, 3);
}

TEST(LauncherElastic, WithoutRestartsTheOthersFinishAlone) {
  Sandbox box;
  const Result r = run(box, {"--elastic", "--nproc", "3", "--", kProbe, "elastic", "2", "0.5"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("rank 2 was killed by signal 9 (SIGKILL); elastic: 2 ranks go on\n"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("RESTART=1"), std::string::npos) << r.out;
  expect_all_gone(box, 3);
}

// Nobody finished: the run's outcome is its last failure (stage 09 exits 1 below --min-ranks).
TEST(LauncherElastic, RunThatNeverFinishesExitsWithItsLastFailure) {
  Sandbox box;
  const Result r = run(box, {"--elastic", "--nproc", "2", "--", kProbe, "elastic", "0", "0.3", "4"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_NE(r.err.find("rank 1 exited with code 4; elastic: 0 ranks go on"), std::string::npos) << r.err;
}

// A rank stopped with SIGSTOP can never finish; once the others have, it is killed, not waited for.
TEST(LauncherElastic, StoppedRankIsKilledOnceTheRunIsOver) {
  Sandbox box;
  const Result r = run(box, {"--elastic", "--nproc", "3", "--", kProbe, "stopself", "1", "0.3"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("rank 1 is stopped (SIGSTOP) and the run is over without it: killing it"), std::string::npos)
      << r.err;
  EXPECT_LT(r.seconds, 5.0);
  expect_all_gone(box, 3);
}

// Without --elastic the first failure still stops everyone, and no elastic variable is set.
TEST(LauncherElastic, OffByDefault) {
  Sandbox box;
  const Result r = run(box, {"--nproc", "2", "--", kProbe, "elastic", "1", "20"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.code, 137) << r.err;
  EXPECT_LT(r.seconds, 8.0);
  EXPECT_NE(r.out.find("STORE=<unset> MIN=<unset> RESTART=<unset>"), std::string::npos) << r.out;
}

TEST(LauncherElastic, BadValuesExit2) {
  expect_refused({"--min-nproc", "2", "--", kProbe, "env"}, "--min-nproc only applies to elastic mode; add --elastic");
  expect_refused({"--max-restarts", "1", "--", kProbe, "env"}, "--max-restarts only applies to elastic mode");
  expect_refused({"--elastic", "--nproc", "3", "--min-nproc", "4", "--", kProbe, "env"},
                 "--min-nproc must be 1..3, got '4'; it counts ranks, so use 1 .. --nproc (3)");
  expect_refused({"--elastic", "--max-restarts", "-1", "--", kProbe, "env"},
                 "--max-restarts must be 0..1000, got '-1'");
  expect_refused({"--elastic", "--nnodes", "2", "--", kProbe, "env"}, "--elastic works on one node");
  expect_refused({"--restart-delay", "1", "--", kProbe, "env"}, "--restart-delay only applies to elastic mode");
  expect_refused({"--elastic", "--restart-delay", "later", "--", kProbe, "env"}, "--restart-delay expects seconds");
}
