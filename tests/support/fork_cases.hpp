// The suite's bad-input cases of one program, run as forks of one process: a LibTorch program spends about
// 0.5-0.7 s of CPU starting (loading and initialising libtorch) before main() runs, and the 241 cases of
// tests/stages/bad_inputs.cmake each paid it once. Forked after start-up, a case costs a few milliseconds
// and runs the same main() with its own arguments and environment. The programs carry none of this: the tests
// preload it (LD_PRELOAD=libdp_fork_cases.so, tests/stages/bad_inputs.cmake), and common/measure/cli.cpp calls
// its `dp_start_hook` when one is loaded.
#pragma once

namespace dp {

/// With DP_FORK_CASES=FILE (a case file that tests/stages/bad_inputs.cmake writes), runs every case of FILE
/// and never returns: the process exits 0 when every case passed, 1 when one failed, 2 when FILE is unreadable.
/// Each case runs in a child forked here, in a session of its own, its output to a file: the child returns
/// from this function with `argc`/`argv` replaced by the case's and its variables set, so main() goes on as
/// if started that way. A case passes when it exits with one of its codes within its timeout, a line of its
/// output matches its regex (POSIX extended, as `grep -E`) and no process of its session is left running
/// (tests/expect_exit.sh's three checks). When this process already runs threads, where a fork would copy
/// none of them, each child executes this program again instead (same checks, one start-up per case).
/// DP_FORK_CASES_FILTER=REGEX runs only the cases whose names match. Without DP_FORK_CASES: returns at once.
void serve_fork_cases(int& argc, char**& argv);

}  // namespace dp
