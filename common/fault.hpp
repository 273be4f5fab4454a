// Faults injected on purpose, for the hardening tests and docs/debugging.md: a rank that dies, hangs, or
// issues its collectives in a different order from the others. DP_FAULT=ACTION@R picks the action and the
// rank; without it every call here does nothing.
#pragma once

#include <string>

namespace dp {

class ProcessGroup;

/// With DP_FAULT=hang@R rank R blocks forever here, with DP_FAULT=die@R it is killed by SIGKILL here.
/// Does nothing when DP_FAULT is unset or names another action or rank.
void maybe_inject_fault(int rank);

/// Fault injection for docs/debugging.md: with DP_FAULT=misorder@R, rank R issues one extra collective
/// here (a broadcast of 4 int64 from rank 0) that no other rank issues, so every later collective of
/// rank R pairs with a different one on the others: collectives in different orders on different ranks.
/// Every other rank, and every run without it, does nothing. With TORCH_DISTRIBUTED_DEBUG=DETAIL the
/// process group checks each collective against the other ranks' first and names the mismatch.
/// DP_FAULT=missize@R: every rank all-reduces 4 int64 here, rank R 8 (one collective, two sizes): Gloo
/// aborts the rank that receives more than it expects, and the launcher names the mistake.
void maybe_inject_collective_fault(ProcessGroup& pg);

/// True when DP_FAULT is ACTION@R with `action` and R == `rank`.
bool fault_requested(const std::string& action, int rank);

}  // namespace dp
