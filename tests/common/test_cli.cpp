// Options: sizes with units, durations, and every bad value ends in exit code 2 with a message.
#include "common/base/format.hpp"
#include "common/base/log.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/cli.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

using dp::parse_size;

TEST(Sizes, DecimalAndBinaryUnits) {
  EXPECT_EQ(parse_size("1MB"), 1000000u);
  EXPECT_EQ(parse_size("10MiB"), 10u * 1048576u);
  EXPECT_EQ(parse_size("1GB"), 1000000000u);
  EXPECT_EQ(parse_size("1gib"), 1073741824u);
  EXPECT_EQ(parse_size("512"), 512u);
  EXPECT_EQ(parse_size("0.5kB"), 500u);
  EXPECT_EQ(parse_size("2 KiB"), 2048u);
}

TEST(Sizes, BadSizesNameThemselves) {
  for (const char* bad : {"", "MB", "abc", "10XB", "-1MB", "0", "0MB", "nanMB"}) {
    try {
      parse_size(bad, "--sizes");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const dp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--sizes"), std::string::npos) << e.what();
    }
  }
}

TEST(Durations, Units) {
  EXPECT_DOUBLE_EQ(dp::parse_seconds("30s"), 30);
  EXPECT_DOUBLE_EQ(dp::parse_seconds("500ms"), 0.5);
  EXPECT_DOUBLE_EQ(dp::parse_seconds("2m"), 120);
  EXPECT_DOUBLE_EQ(dp::parse_seconds("45"), 45);
  EXPECT_THROW(dp::parse_seconds("soon"), dp::UsageError);
  EXPECT_THROW(dp::parse_seconds("5h"), dp::UsageError);
  EXPECT_THROW(dp::parse_seconds("-3s"), dp::UsageError);
}

TEST(FormatBytes, DecimalUnits) {
  EXPECT_EQ(dp::format_bytes(100e6), "100 MB");
  EXPECT_EQ(dp::format_bytes(1.5e9), "1.5 GB");
  EXPECT_EQ(dp::format_bytes(512), "512 B");
}

TEST(CountOf, SingularForOne) {
  EXPECT_EQ(dp::count_of(1, "rank"), "1 rank");
  EXPECT_EQ(dp::count_of(2, "rank"), "2 ranks");
  EXPECT_EQ(dp::count_of(0, "step"), "0 steps");
}

namespace {
int parse(std::vector<std::string> args, int* iters = nullptr) {
  dp::Cli cli("prog", "test program");
  int n = 1;
  std::vector<std::string> sizes;
  cli.app().add_option("--iters", n)->check(dp::PositiveInt);
  cli.app().add_option("--sizes", sizes)->delimiter(',')->check(dp::SizeText);
  std::vector<char*> argv{const_cast<char*>("prog")};
  for (auto& a : args) argv.push_back(a.data());
  int rc = cli.parse(static_cast<int>(argv.size()), argv.data());
  if (iters) *iters = n;
  return rc;
}
}  // namespace

TEST(Cli, GoodInputContinues) {
  int iters = 0;
  EXPECT_EQ(parse({"--iters", "7", "--sizes", "1MB,10MiB", "--backend", "gloo", "--timeout", "30s"}, &iters), -1);
  EXPECT_EQ(iters, 7);
}

TEST(Cli, HelpExitsZero) { EXPECT_EQ(parse({"--help"}), 0); }

TEST(Cli, BadInputExitsTwo) {
  EXPECT_EQ(parse({"--iters", "0"}), 2);
  EXPECT_EQ(parse({"--iters", "-3"}), 2);
  EXPECT_EQ(parse({"--iters", "many"}), 2);
  EXPECT_EQ(parse({"--sizes", "1MB,7QB"}), 2);
  EXPECT_EQ(parse({"--backend", "mpi"}), 2);
  EXPECT_EQ(parse({"--timeout", "soon"}), 2);
  EXPECT_EQ(parse({"--no-such-option"}), 2);
  EXPECT_EQ(parse({"--iters"}), 2);  // missing value
}

// dp::bench_only(): a benchmark's option without --bench is refused (exit 2), with it accepted; a program
// without a --bench flag takes the option as it is.
TEST(Cli, BenchOnlyOptionsNeedBench) {
  auto parse_with = [](bool has_bench, std::vector<std::string> args) {
    dp::Cli cli("prog", "test");
    bool bench = false;
    int steps = 1;
    if (has_bench) cli.app().add_flag("--bench", bench);
    cli.app().add_option("--steps", steps);
    dp::bench_only(cli.app(), {"--steps"});
    std::vector<char*> argv{const_cast<char*>("prog")};
    for (auto& a : args) argv.push_back(a.data());
    return cli.parse(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_EQ(parse_with(true, {"--steps", "3"}), 2);
  EXPECT_EQ(parse_with(true, {"--bench", "--steps", "3"}), -1);
  EXPECT_EQ(parse_with(false, {"--steps", "3"}), -1);
}

// check_writable() tries the write: it refuses what cannot be written or would be replaced, accepts a
// writable path, changes no existing file and leaves no probe file behind.
TEST(Cli, CheckWritableTriesAndLeavesNothing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("dp_check_writable.{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto message = [](const std::string& path) {
    try {
      dp::check_writable("--out", path);
    } catch (const dp::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message((dir / "new.json").string()), "accepted");
  { std::ofstream((dir / "old.json").string()) << "kept"; }
  EXPECT_EQ(message((dir / "old.json").string()), "accepted");
  std::ifstream in((dir / "old.json").string());
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "kept");  // opened to try, not truncated
  fs::create_symlink(dir / "old.json", dir / "link.json");
  EXPECT_NE(message((dir / "link.json").string()).find("symbolic link"), std::string::npos);
  EXPECT_NE(message("/dev/null").find("not a regular file"), std::string::npos);
  EXPECT_NE(message("/proc/x.json").find("creating a file in /proc failed"), std::string::npos);
  EXPECT_NE(message((dir / "missing" / "x.json").string()).find("does not exist"), std::string::npos);
  EXPECT_NE(message(dir.string()).find("names a folder"), std::string::npos);
  // Only what the test made: the probes were removed.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"link.json", "old.json"}));
  fs::remove_all(dir);
}

// Stage 09's processes keep the launcher's tag while their rank changes with each generation; print0 still
// follows the group's rank 0 (a summary must come from whoever is rank 0 now, whichever slot that is).
TEST(Log, TagOutlivesTheGroupRank) {
  dp::set_log_tag(2, 3);
  dp::set_log_rank(0, 2);  // this process is rank 0 of the new generation
  testing::internal::CaptureStdout();
  dp::print0("summary");
  dp::print_rank("mine");
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "summary\n[rank 2/3] mine\n");
  testing::internal::CaptureStderr();
  EXPECT_EQ(dp::exit_code_of([]() -> int { throw dp::UsageError("bad"); }), 2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "[rank 2/3] error: bad\n");
  dp::set_log_rank(1, 2);
  testing::internal::CaptureStdout();
  dp::print0("summary");
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  dp::set_log_tag(-1, -1);  // back to the group's rank, as every other program
  dp::set_log_rank(0, 1);
  EXPECT_EQ(dp::log_tag(), "[rank 0/1]");
}

// run_main() ends the process through leave_process(): the body's exit code, with what it printed but had not
// flushed (stdout to a pipe is fully buffered); DP_FULL_EXIT=1 returns the code to main() instead.
TEST(Log, RunMainLeavesWithTheCodeAndTheOutput) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(dp::run_main([] {
                std::setvbuf(stderr, nullptr, _IOFBF, 4096);  // buffered, as a pipe makes stdout
                std::fputs("written, not flushed\n", stderr);
                return 3;
              }),
              ::testing::ExitedWithCode(3), "written, not flushed");
  EXPECT_EXIT(dp::run_main([]() -> int { throw dp::UsageError("bad"); }), ::testing::ExitedWithCode(2), "error: bad");
  setenv("DP_FULL_EXIT", "1", 1);
  EXPECT_EQ(dp::run_main([] { return 4; }), 4);
  unsetenv("DP_FULL_EXIT");
}

// --backend nccl exits 2 on a CPU build, and on a CUDA build where there is no GPU (this machine).
TEST(Cli, NcclWithoutBuildOrGpuExitsTwo) {
#ifdef DP_WITH_NCCL
  if (torch::cuda::device_count() > 0) {
    EXPECT_EQ(parse({"--backend", "nccl"}), -1);
    return;
  }
#endif
  EXPECT_EQ(parse({"--backend", "nccl"}), 2);
}
