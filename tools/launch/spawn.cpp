#include "spawn.hpp"

#include "output.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

namespace ddp_launch {

Child spawn_rank(const std::vector<std::string>& command, std::vector<std::string> env, int stdin_fd, int rank,
                 int netns_fd, const std::vector<int>& cpus) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    say(fmt::format("cannot create pipes for rank {}: {}", rank, std::strerror(errno)));
    return {};
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    say(fmt::format("cannot create pipes for rank {}: {}", rank, std::strerror(errno)));
    ::close(out[0]);
    ::close(out[1]);
    return {};
  }
  // Everything the child needs is built before fork(), so that the child only makes system calls.
  std::vector<char*> envp, argv;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (const auto& s : command) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  const pid_t launcher = ::getpid();
  cpu_set_t cpu_set;
  CPU_ZERO(&cpu_set);
  for (int c : cpus) CPU_SET(c, &cpu_set);

  // Signals stay blocked across fork(), so the launcher's handlers never run in the child before it
  // has put the default ones back (handled signals reset on exec anyway; ignored ones would not).
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &old);
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(sig, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    ::setpgid(0, 0);                          // own group: a terminal's Ctrl-C reaches only the launcher
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);       // launcher SIGKILLed -> the kernel kills the rank
    if (::getppid() != launcher) ::_exit(1);  // the launcher died before prctl took effect
    ::dup2(stdin_fd, STDIN_FILENO);           // a background group reading the tty would be stopped
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    // --net: the rank's own network namespace. Only the network is switched (not the mount namespace,
    // as `ip netns exec` also does), so /sys/class/net still lists the root namespace's interfaces;
    // getifaddrs() and sockets -- all Gloo and the TCP store use -- see the rank's namespace.
    if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) {
      const int e = errno;
      ::dprintf(STDERR_FILENO, "ddp_launch: cannot enter the rank's network namespace: %s\n", std::strerror(e));
      ::_exit(126);
    }
    if (!cpus.empty() && ::sched_setaffinity(0, sizeof(cpu_set), &cpu_set) != 0) {
      const int e = errno;
      ::dprintf(STDERR_FILENO, "ddp_launch: cannot pin the rank to its cores: %s\n", std::strerror(e));
      ::_exit(126);
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    const int e = errno;
    ::dprintf(STDERR_FILENO, "ddp_launch: cannot run '%s': %s\n", argv[0], std::strerror(e));
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    say(fmt::format("cannot start rank {}: {}", rank, std::strerror(fork_errno)));
    return {};
  }
  ::setpgid(pid, pid);  // from this side too: the group must exist before we might signal it
  for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return {pid, out[0], err[0]};
}

}  // namespace ddp_launch
