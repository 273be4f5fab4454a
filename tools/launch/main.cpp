// ddp_launch: start N ranks of a program and supervise them -- this tutorial's torchrun.
//
//   ddp_launch [--nproc N] [--nnodes M --node-rank K --master-addr HOST --master-port P] -- PROGRAM [ARGS...]
//   ddp_launch --nproc N --net RATE [--net-subnet CIDR] [--net-delay MS]
//              [--net-nodes M --net-uplink UPRATE] -- PROGRAM [ARGS...]
//   ddp_launch --net-cleanup
//   ddp_launch --free-ports N        (N ports free now, outside the ephemeral range, for scripts)
//
// Data-parallel training runs one process per rank. Each process must learn who it is and where to
// meet the others, and the whole job must live and die as one: a rank that crashes leaves its peers
// blocked forever inside a collective, so somebody has to notice and stop them. That somebody is
// this launcher. It is plain C++17 + POSIX (no LibTorch) and works for any program.
//
// The contract, identical to torchrun's, so the programs also run under torchrun unchanged:
//   RANK = node_rank * nproc + local_rank     LOCAL_RANK = local_rank (0 .. nproc-1)
//   WORLD_SIZE = nnodes * nproc               LOCAL_WORLD_SIZE = nproc      GROUP_RANK = node_rank
//   MASTER_ADDR, MASTER_PORT: where rank 0's TCP store listens (one node: a free port is picked)
//   OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS = --threads (default cores / nproc),
//     each only if the user has not exported it already;  DP_LAUNCHER=1.
//   OPENBLAS_CORETYPE where OpenBLAS fell back to its slowest kernels on this CPU (options.cpp), if not set.
//
// Supervision: every rank runs in its own process group with PR_SET_PDEATHSIG=SIGKILL. The first
// rank seen failing is reported on stderr ("ddp_launch: rank 1 exited with code 3"); the other groups
// get SIGTERM, then SIGKILL after --timeout seconds, and the launcher exits with that rank's code
// (128+N for signal N), unless a rank exits 2 meanwhile: a usage error is the cause, not a consequence.
// Ctrl-C (or SIGTERM) is forwarded the same way and exits 130 (143). The launcher returns only once
// every rank and every process they started has been reaped.
//
// Output: each line of a rank's stdout/stderr goes to the launcher's stdout/stderr, prefixed with
// "[rank r/W] " unless it already starts with "[rank " or --no-prefix is given. The ranks' stdin is
// /dev/null: they run in background process groups, where reading the terminal would stop them.
//
// --net RATE runs every rank in a network namespace of its own behind a link shaped to RATE, a
// small cluster on one machine (net.hpp); MASTER_ADDR is then rank 0's address there, and each rank
// also gets GLOO_SOCKET_IFNAME and DP_NET. --net-nodes M groups the ranks into M simulated nodes behind
// uplinks at UPRATE (LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK then describe the simulated node). The
// namespaces are removed on every way out but SIGKILL, whose leftovers the next --net run or --net-cleanup
// removes.
//
// Limits (shared with torchrun): a process that leaves its rank's group (setsid) is not tracked, and
// if the launcher itself is SIGKILLed only the ranks die (PDEATHSIG), not what they forked.
//
// Exit codes: 0 all ranks succeeded; 2 bad options (for --net also: no privilege, no iproute2, no
// netem); 1 the simulated network could not be built; 127 program not found; otherwise as above.
#include "net.hpp"
#include "options.hpp"
#include "supervisor.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <vector>

int main(int argc, char** argv) {
  ddp_launch::LaunchOptions opts;
  try {
    if (!ddp_launch::parse_options(argc, argv, opts)) return 0;  // --help
  } catch (const ddp_launch::UsageError& e) {
    fmt::print(stderr, "ddp_launch: error: {}\n", e.what());
    return 2;
  }
  try {
    if (opts.net_cleanup) return ddp_launch::net_cleanup_main();
    if (opts.free_ports > 0) {  // for scripts that start their own servers (tests/multinode.sh, tests/slurm.sh)
      std::vector<int> ports;
      while (static_cast<int>(ports.size()) < opts.free_ports) {
        const int port = ddp_launch::pick_free_port(ports, /*kernel_fallback=*/false);
        if (port == 0) {
          fmt::print(stderr, "ddp_launch: error: found no free port outside the ephemeral range after {} of {}\n",
                     ports.size(), opts.free_ports);
          return 1;
        }
        ports.push_back(port);
        fmt::print("{}\n", port);
      }
      return 0;
    }
    return ddp_launch::supervise(opts);
  } catch (const ddp_launch::UsageError& e) {  // --net: no privilege, no iproute2, no netem
    fmt::print(stderr, "ddp_launch: error: {}\n", e.what());
    return 2;
  } catch (const ddp_launch::NetError& e) {  // --net: an ip or tc command failed
    fmt::print(stderr, "ddp_launch: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ddp_launch: internal error: {}\n", e.what());
    return 1;
  }
}
