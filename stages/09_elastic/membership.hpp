// Stage 09's membership: who trains in the next generation, agreed through a store that no training
// rank hosts, so that no rank's death can take it down.
//
// A generation is a process group of fixed members. When one fails (a collective throws: a peer died,
// or hung past --timeout) or a newcomer waits, the members leave it and meet in the next *round*: each
// claims a numbered slot in the store (compare-and-set: no two claim the same one; a survivor claims as
// it sees the failure), and the first to see every slot taken, or the settle time run out since the first
// member of the latest generation came, closes the round with the count it saw (compare-and-set again:
// one count wins). Those inside the count are the next generation; one that comes after the close waits
// in the next round, where the members find it at their next step boundary. A round also closes at once
// when every member of the latest generation is in it or marked dead by the launcher (no settle wait for
// one who will never come). Each generation meets in a prefix of its own ("gen<round>/"), so no
// collective ever mixes generations.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dp {

/// One participant of a round, as it announced itself.
struct Member {
  std::string id;           ///< "<slot>.<restart>": the launcher's rank slot and how many processes it had before
  int64_t step = -1;        ///< optimizer steps its state has taken; -1: a newcomer, no state yet
  int64_t generation = -1;  ///< the last generation it was a member of (-1: none)
  bool fresh() const { return step < 0; }
};

/// A closed round: the members of generation `round`, this process's rank among them, and whose state
/// everyone takes (the most steps; ties: the latest generation, then the lowest rank).
struct Quorum {
  int64_t round = -1;
  std::vector<Member> members;  ///< rank order: members with state in arrival order, then newcomers
  int rank = -1;
  int source = -1;  ///< -1: newcomers only, nobody holds the state (stage 09 falls back to its checkpoint)
  int size() const { return static_cast<int>(members.size()); }
};

/// claim() or join() found the run over (a replacement that came too late): stage 09 says so and exits 0.
struct RunOver : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The store every generation meets in and the rounds that form them.
class Membership {
 public:
  /// Opens the RecordFileStore at `path` (ddp_launch --elastic creates it: DP_ELASTIC_STORE; the launcher
  /// marks each process that ended with a file `path`.dead/<id>). `max_members`
  /// closes a round at once when that many have arrived; `settle` is how long a round waits for more
  /// after the first member with state arrived (round 0: `timeout`, every rank is expected); no round
  /// waits longer than `timeout` for its close.
  Membership(const std::string& path, std::string id, int max_members, std::chrono::milliseconds settle,
             std::chrono::milliseconds timeout);

  /// A slot held in a round (claim()), with what its holder announced there.
  struct Claim {
    int64_t round = 0, step = -1, generation = -1;
    int slot = 0;
  };
  /// Claims the lowest free slot of the first open round at or after `from`, announcing `step` (-1: no
  /// state) and `generation`, the last round this process was a member of (-1: none). Only a member of the
  /// latest generation (or anyone, in round 0) starts the round's settle clock: a newcomer, or a process
  /// left out of that generation, could otherwise close a round alone beside a generation still training
  /// (a split brain). A survivor claims as it sees a failure, before it copies its state and closes its
  /// group, however long those take. `on_claim` runs once the slot is held (tests inject failures there).
  Claim claim(int64_t from, int64_t step, int64_t generation, const std::function<void()>& on_claim = {});
  /// Waits until a round closes with this process inside it: `c`'s, or the next open one (claimed alike);
  /// a round of newcomers only closes too (Quorum::source -1), once every member of the latest generation is dead.
  /// Throws std::runtime_error after 2 x `timeout` + `settle` without a close (nobody with state is left
  /// to close one; members still waiting out a hung peer's timeout come within it).
  Quorum join(Claim c, const std::function<void()>& on_claim = {});
  /// The run is over (`steps` trained): claim() and join() throw RunOver from now on, in whoever waits or
  /// comes later.
  void close_run(int64_t steps);
  /// True when someone waits in round `round` and it is still open: the members of the generation before
  /// it re-form at their next step boundary (only one rank asks, and tells the others).
  bool someone_waiting(int64_t round);
  /// The store generation `round` forms its process group in ("gen<round>/").
  c10::intrusive_ptr<c10d::Store> generation_store(int64_t round);
  c10::intrusive_ptr<c10d::Store> store() { return store_; }
  /// A number the whole run shares, kept in the store (stage 09: "done", the steps trained so far; "saved",
  /// the step of this run's last checkpoint). count() is -1 until set_count() was called.
  void set_count(const std::string& name, int64_t value);
  int64_t count(const std::string& name);
  const std::string& id() const { return id_; }

 private:
  std::string key(int64_t round, const std::string& what) const;
  void throw_if_over();  // RunOver once close_run() was called
  int64_t first_open_round(int64_t from);
  Member member(int64_t round, int slot);                  // what slot `slot` of `round` announced
  bool dead(const std::string& id) const;                  // the launcher marked process `id` as ended
  std::vector<std::string> generation_ids(int64_t round);  // the members of closed round `round` (none: not closed)

  c10::intrusive_ptr<c10d::Store> store_;
  std::string id_;
  std::string dead_;  // the launcher's marks of processes that ended
  int max_members_;
  std::chrono::milliseconds settle_, timeout_;
};

}  // namespace dp
