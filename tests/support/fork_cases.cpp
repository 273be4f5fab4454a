// Bad-input cases as forks of one started program (see fork_cases.hpp), built as a library the tests preload
// (LD_PRELOAD) into the program they check. The case file, one line a field:
//   case NAME | codes 2 (or 1|137) | timeout SECONDS | regex RE | env K=V ... | arg A ... | end
#include "tests/support/fork_cases.hpp"

#include <fmt/format.h>

#include <dirent.h>
#include <regex.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dp {

namespace {

struct Case {
  std::string name, codes = "0", regex;
  double timeout_s = 90;               // expect_exit.sh's bound
  std::vector<std::string> env, args;  // args without the program: argv[0] stays this program's
};

// What common/dist/runtime.cpp's flush_and_exit does, here without linking the program's libraries.
[[noreturn]] void flush_and_exit(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  _exit(code);
}

[[noreturn]] void refuse(const std::string& what) {
  fmt::print(stderr, "DP_FORK_CASES: {}\n", what);
  std::exit(2);
}

std::vector<Case> read_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) refuse(fmt::format("cannot read {}: build the tests first (cmake --build --preset default)", path));
  std::vector<Case> cases;
  Case c;
  bool open = false;
  for (std::string line; std::getline(in, line);) {
    const auto sp = line.find(' ');
    const std::string key = line.substr(0, sp), value = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (key == "case")
      c = Case(), c.name = value, open = true;
    else if (!open)
      refuse(fmt::format("{}: '{}' outside a case", path, line));
    else if (key == "codes")
      c.codes = value;
    else if (key == "timeout")
      c.timeout_s = std::stod(value);
    else if (key == "regex")
      c.regex = value;
    else if (key == "env")
      c.env.push_back(value);
    else if (key == "arg")
      c.args.push_back(value);
    else if (key == "end")
      cases.push_back(c), open = false;
    else
      refuse(fmt::format("{}: unknown line '{}'", path, line));
  }
  if (open) refuse(fmt::format("{}: the last case has no 'end'", path));
  return cases;
}

bool matches(const std::string& re, const std::string& text) {
  regex_t r;
  if (regcomp(&r, re.c_str(), REG_EXTENDED | REG_NOSUB) != 0)
    refuse(fmt::format("/{}/ is not a POSIX extended regular expression", re));
  bool hit = false;
  std::istringstream lines(text);
  for (std::string line; !hit && std::getline(lines, line);) hit = regexec(&r, line.c_str(), 0, nullptr, 0) == 0;
  regfree(&r);
  return hit;
}

bool code_is_one_of(int rc, const std::string& codes) {
  std::istringstream alts(codes);
  for (std::string a; std::getline(alts, a, '|');)
    if (a == std::to_string(rc)) return true;
  return false;
}

// The processes of session `sid` (field 6 of /proc/PID/stat, after the parenthesised command name).
std::vector<pid_t> session_members(pid_t sid) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream f(fmt::format("/proc/{}/stat", pid));
    std::string stat;  // one line
    std::getline(f, stat);
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    long ppid = 0, pgrp = 0, session = 0;
    if (rest >> state >> ppid >> pgrp >> session && session == sid && state != "Z") out.push_back(pid);
  }
  closedir(d);
  return out;
}

int threads_of_this_process() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

std::string shell_line(const Case& c, const char* program) {
  std::string s;
  for (const auto& e : c.env) s += e + " ";
  s += program;
  for (const auto& a : c.args) s += " '" + a + "'";
  return s;
}

// In the child: the case's session, output, environment and arguments.
void become_case(const Case& c, int out_fd, int& argc, char**& argv, bool exec) {
  setsid();
  // At exit, after what main() registered: flush and leave, skipping the destructors of what was built before
  // the fork (LibTorch's operator registry deregisters each of its thousands of kernels: ~0.1 s of CPU a case,
  // copying the parent's pages as it writes). Nothing a case prints is lost; its exit code is main()'s. Also
  // under DP_FULL_EXIT=1: what those destructors would free is the parent's, not the case's.
  on_exit([](int status, void*) { flush_and_exit(status); }, nullptr);
  dup2(out_fd, STDOUT_FILENO), dup2(out_fd, STDERR_FILENO), close(out_fd);
  unsetenv("DP_FORK_CASES");
  for (const auto& e : c.env) {
    const auto eq = e.find('=');
    setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
  }
  static std::vector<std::string> storage;  // lives as long as the child: argv points into it
  static std::vector<char*> ptrs;
  storage.assign(1, argv[0]);
  storage.insert(storage.end(), c.args.begin(), c.args.end());
  for (auto& s : storage) ptrs.push_back(s.data());
  ptrs.push_back(nullptr);
  argc = static_cast<int>(storage.size()), argv = ptrs.data();
  if (exec) {
    execve("/proc/self/exe", argv, environ);
    std::perror("execve /proc/self/exe");
    _exit(127);
  }
}

}  // namespace

void serve_fork_cases(int& argc, char**& argv) {
  const char* file = std::getenv("DP_FORK_CASES");
  if (!file) return;
  const std::vector<Case> cases = read_cases(file);
  const char* filter = std::getenv("DP_FORK_CASES_FILTER");
  const int threads = threads_of_this_process();
  const bool exec = threads > 1;  // a fork copies only the calling thread
  if (exec)
    fmt::print(
        "{} runs {} threads before main() (OpenBLAS starts its pool at load time unless "
        "OPENBLAS_NUM_THREADS=1): each case executes it again, one start-up each\n",
        argv[0], threads);
  int ran = 0, failed = 0;
  for (const Case& c : cases) {
    if (filter && !matches(filter, c.name)) continue;
    ++ran;
    char path[] = "/tmp/dp_case_XXXXXX";
    const int out_fd = mkstemp(path);
    if (out_fd < 0) refuse(fmt::format("cannot make a file in /tmp: {}", std::strerror(errno)));
    unlink(path);
    std::fflush(nullptr);  // nothing buffered here is written twice
    const auto t0 = std::chrono::steady_clock::now();
    const auto seconds_since_fork = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const pid_t pid = fork();
    if (pid < 0) refuse(fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) return become_case(c, out_fd, argc, argv, exec);  // main() goes on as the case

    // The parent: wait within the timeout; exit codes as the shell gives them (128 + signal).
    int status = 0, rc = -1;
    bool timed_out = false;
    while (true) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (seconds_since_fork() > c.timeout_s) {
        kill(-pid, SIGKILL), waitpid(pid, &status, 0);
        timed_out = true, rc = 124;  // timeout(1)'s code
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const double took = seconds_since_fork();
    std::string out;
    char buf[65536];
    for (off_t at = 0;;) {
      const ssize_t n = pread(out_fd, buf, sizeof buf, at);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n)), at += n;
    }
    close(out_fd);
    std::vector<pid_t> left = session_members(pid);
    for (int i = 0; i < 10 && !left.empty(); ++i) {  // 3 s, as expect_exit.sh waits
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      left = session_members(pid);
    }
    for (pid_t p : left) kill(p, SIGKILL);

    std::string why;
    if (timed_out)
      why = fmt::format("timed out after {:.0f} s", c.timeout_s);
    else if (!code_is_one_of(rc, c.codes))
      why = fmt::format("expected exit code {}, got {}", c.codes, rc);
    else if (!matches(c.regex, out))
      why = fmt::format("output does not match /{}/", c.regex);
    else if (!left.empty())
      why = fmt::format("{} process(es) left running after it returned", left.size());
    if (why.empty()) {
      fmt::print("ok   {} ({:.2f} s): exit {}, output matches, nothing left running\n", c.name, took, rc);
      continue;
    }
    ++failed;
    std::string tail = out.size() > 3000 ? "..." + out.substr(out.size() - 3000) : out;
    fmt::print("FAIL {}: {}\n  run it alone: {}\n  its output:\n{}\n", c.name, why, shell_line(c, argv[0]), tail);
  }
  if (ran == 0)
    refuse(filter ? fmt::format("no case of {} matches DP_FORK_CASES_FILTER={}", file, filter)
                  : fmt::format("{} holds no case", file));
  fmt::print("{}: {} of {} bad-input cases passed{}\n", file, ran - failed, ran, failed ? "" : " (PASS)");
  std::fflush(nullptr);
  std::exit(failed ? 1 : 0);
}

}  // namespace dp

// The seam common/measure/cli.cpp looks up with dlsym() before it parses a program's options: a program started
// plainly finds no such symbol and parses as usual; one started with this library preloaded serves the cases.
extern "C" void dp_start_hook(int* argc, char*** argv) { dp::serve_fork_cases(*argc, *argv); }
