// Faults injected on purpose, for the hardening tests and docs/debugging.md: a rank that dies, hangs, or
// issues its collectives in a different order from the others. DP_FAULT=ACTION@R picks the action and the
// rank; without it every call here does nothing. Elastic runs (stage 09) name points instead: Faults.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

namespace dp {

class ProcessGroup;

/// With DP_FAULT=hang@R rank R blocks forever here, with DP_FAULT=die@R it is killed by SIGKILL here; with
/// DP_FAULT=orphan@R it starts `sleep 30` and goes on, leaving that process running after it exits (what the
/// checks for leftover processes must catch). Does nothing when DP_FAULT is unset or names another action or rank.
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

/// How long DP_FAULT's pause sleeps, in seconds.
inline constexpr double kFaultPauseS = 5.0;

/// Faults at named points of a run whose processes die and are replaced (stage 09), from DP_FAULT: a
/// comma-separated list of `ACTION@SLOT:POINT`, ACTION one of die (SIGKILL), stop (SIGSTOP), hang (blocks
/// forever), pause (sleeps kFaultPauseS, then goes on: a slow process); SLOT the launcher's rank (the first
/// process of that slot only; `*`: whichever process reaches POINT first); POINT a name the program passes
/// to at() (stage 09: stepK, quorumN, leaving: a survivor in its next round, before it closes its group;
/// heal; over: the run's last step done). Each entry fires once in the whole run, claimed through
/// `store`, which every process of the run shares; the time a failure (not a pause) fired is stored there
/// too, so that the survivors can say how long recovery took. Without DP_FAULT nothing happens. An entry
/// that is not `ACTION@SLOT:POINT` throws dp::UsageError naming it.
class Faults {
 public:
  /// `id`: this process's name in the run's timeline; `restart`: 0 for the launcher's first process of
  /// `slot`, more for its replacements (which SLOT entries never fire in).
  Faults(c10::intrusive_ptr<c10d::Store> store, std::string id, int slot, int restart);
  /// Fires the first matching entry for `point` that has not fired yet.
  void at(const std::string& point);
  /// Seconds since the epoch at which the last fault fired, or -1 when none has.
  double last_fired() const;

 private:
  struct Entry {
    std::string action, slot, point;
  };
  c10::intrusive_ptr<c10d::Store> store_;
  std::string id_;
  int slot_, restart_;
  std::vector<Entry> entries_;
};

}  // namespace dp
