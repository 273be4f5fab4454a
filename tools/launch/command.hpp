// Running a helper program (ip, tc, modprobe) to completion and collecting what it printed.
#pragma once

#include <string>
#include <vector>

namespace ddp_launch {

struct CommandResult {
  int code = 127;      // exit status; 128+N if signal N killed it; 127 if it could not be started
  std::string output;  // its stdout and stderr together, trailing newlines removed
};

// Runs argv[0] (looked up in PATH) with argv as its arguments -- an argument vector, never a shell,
// so names and addresses need no quoting -- and waits for it. Its stdin is /dev/null. SIGINT, SIGTERM
// and SIGHUP stay blocked in it: a Ctrl-C during network setup or teardown must not kill `ip` half-way
// (the launcher notices the signal itself and stops in order).
CommandResult run_command(const std::vector<std::string>& argv);

// "ip -n dpnet12-r0 link set lo up": argv joined by spaces, for messages.
std::string command_text(const std::vector<std::string>& argv);

// The full path of `name` in PATH, or "" if no executable of that name is there.
std::string find_in_path(const std::string& name);

}  // namespace ddp_launch
