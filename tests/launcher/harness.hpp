// Test harness for the launcher tests: runs ddp_launch as a child process with a watchdog, captures
// its output, and checks afterwards which processes are still around.
#pragma once

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace launcher_test {

using Clock = std::chrono::steady_clock;
using Env = std::vector<std::pair<std::string, std::string>>;

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A private directory per test: the launcher's captured output and the probe's pid files.
class Sandbox {
 public:
  Sandbox() {
    char tmpl[] = "/tmp/ddp_launch_test.XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    pids_ = dir_ + "/pids";
    ::mkdir(pids_.c_str(), 0700);
  }
  ~Sandbox() {
    if (::testing::Test::HasFailure()) {  // a failed test must not leave sleepers behind either
      for (pid_t pid : recorded_pids()) ::kill(pid, SIGKILL);
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  const std::string& dir() const { return dir_; }
  const std::string& pid_dir() const { return pids_; }

  std::vector<pid_t> recorded_pids() const {
    std::vector<pid_t> out;
    if (DIR* d = ::opendir(pids_.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() > 4 && name.substr(name.size() - 4) == ".pid") {
          out.push_back(std::stoi(slurp(pids_ + "/" + name)));
        }
      }
      ::closedir(d);
    }
    return out;
  }

 private:
  std::string dir_, pids_;
};

struct Result {
  int code = -1;  // exit code, or 128+N when the launcher died of signal N
  bool timed_out = false;
  double seconds = 0;
  std::string out, err;
};

struct Running {
  pid_t pid = -1;
  Clock::time_point start;
  std::string out_path, err_path;
};

// Starts the launcher with `args`, stdout/stderr captured in files of the sandbox. The environment is
// the test's own minus the thread variables (so defaults are tested unless `env` sets them). A
// non-empty `wrapper` (e.g. {"setpriv", "--bounding-set", "-net_admin", "--"}) runs the launcher
// through that command, found in PATH.
inline Running start(const Sandbox& box, const std::vector<std::string>& args, const Env& env = {},
                     const std::vector<std::string>& wrapper = {}) {
  Running r{-1, Clock::now(), box.dir() + "/out.txt", box.dir() + "/err.txt"};
  r.pid = ::fork();
  if (r.pid == 0) {
    for (const char* key : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}) ::unsetenv(key);
    ::setenv("PROBE_PID_DIR", box.pid_dir().c_str(), 1);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ::dup2(::open(r.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600), STDOUT_FILENO);
    ::dup2(::open(r.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600), STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& w : wrapper) argv.push_back(const_cast<char*>(w.c_str()));
    argv.push_back(const_cast<char*>(DP_LAUNCH_BIN));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    ::_exit(99);
  }
  return r;
}

// Waits for the launcher (watchdog: SIGKILL after `limit_s`) and collects what it printed.
inline Result finish(const Running& r, double limit_s = 30) {
  Result res;
  int status = 0;
  while (::waitpid(r.pid, &status, WNOHANG) == 0) {
    if (Clock::now() - r.start > std::chrono::duration<double>(limit_s)) {
      res.timed_out = true;
      ::kill(r.pid, SIGKILL);
      ::waitpid(r.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - r.start).count();
  res.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  res.out = slurp(r.out_path);
  res.err = slurp(r.err_path);
  return res;
}

inline Result run(const Sandbox& box, const std::vector<std::string>& args, const Env& env = {}) {
  return finish(start(box, args, env));
}

// "[rank r/W] KEY=VALUE" lines of `probe env`, grouped by the r of the tag.
inline std::map<int, std::map<std::string, std::string>> parse_env(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> ranks;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    int r = -1, w = -1, consumed = 0;
    if (std::sscanf(line.c_str(), "[rank %d/%d] %n", &r, &w, &consumed) < 2 || consumed == 0) continue;
    const std::string kv = line.substr(consumed);
    const auto eq = kv.find('=');
    if (eq != std::string::npos) ranks[r][kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return ranks;
}

// Every pid the probe recorded must be gone (not even a zombie): the launcher reaps before returning.
inline void expect_all_gone(const Sandbox& box, std::size_t expected) {
  const auto pids = box.recorded_pids();
  EXPECT_EQ(pids.size(), expected) << "pid files written by the probe";
  for (pid_t pid : pids) {
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) {  // 2 s of slack
      gone = ::kill(pid, 0) == -1 && errno == ESRCH;
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(gone) << "process " << pid << " outlived the launcher";
  }
}

}  // namespace launcher_test
