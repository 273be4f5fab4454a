// Starting one rank: fork + exec in a process group of its own, its output going into two pipes.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddp_launch {

struct Child {
  pid_t pid = -1;   // also the id of its process group; -1 if it could not be started
  int out_fd = -1;  // read ends (non-blocking, close-on-exec) of the child's stdout and stderr
  int err_fd = -1;
};

// Runs `command` (looked up in PATH like a shell does) with exactly the environment `env` and
// `stdin_fd` as its stdin. The child is the leader of a new process group and dies with SIGKILL if
// the launcher dies. If exec fails, the child says why on its stderr and exits 127. On a failure in
// the launcher itself (no pipes, no fork) a message naming `rank` is printed and pid is -1.
// With `netns_fd` >= 0 (--net) the child enters that network namespace before exec; if it cannot,
// it says so and exits 126. With `cpus` not empty (--cpus-per-rank) the child runs on those cores only
// (sched_setaffinity before exec); if it cannot, it says so and exits 126.
Child spawn_rank(const std::vector<std::string>& command, std::vector<std::string> env, int stdin_fd, int rank,
                 int netns_fd = -1, const std::vector<int>& cpus = {});

}  // namespace ddp_launch
