// Starting the ranks and watching over them.
#pragma once

#include "options.hpp"

namespace ddp_launch {

// Starts opts.nproc copies of opts.command, forwards their output, and returns once every rank and
// everything the ranks started is gone. The result is the launcher's exit code:
//   0        every rank exited with 0
//   c        the first rank seen failing exited with c (128+N when signal N killed it)
//   128+N    the launcher itself got signal N (SIGINT: 130, SIGTERM: 143) before any rank failed
int supervise(const LaunchOptions& opts);

}  // namespace ddp_launch
