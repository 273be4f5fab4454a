#include "stages/09_elastic/membership.hpp"

#include "common/base/store_values.hpp"
#include "common/base/timeline.hpp"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>

namespace dp {

Membership::Membership(const std::string& path, std::string id, int max_members, std::chrono::milliseconds settle,
                       std::chrono::milliseconds timeout)
    : id_(std::move(id)), max_members_(max_members), settle_(settle), timeout_(timeout) {
  // LibTorch 1.13's FileStore waits for the file to exist before reading it: create it (empty) first.
  std::ofstream(path, std::ios::app);
  // numWorkers -1: no process removes the file on exit (they come and go); the launcher owns it.
  store_ = c10::make_intrusive<c10d::FileStore>(path, -1);
  store_->setTimeout(timeout);  // a generation's process group waits this long for a member that never comes
}

std::string Membership::key(int64_t round, const std::string& what) const { return fmt::format("r{}/{}", round, what); }

void Membership::close_run(int64_t steps) { store_->set("over", store_bytes(std::to_string(steps))); }
void Membership::throw_if_over() {
  if (!store_->check({"over"})) return;
  throw RunOver(
      fmt::format("the run is over: its last generation trained all {} steps", store_text(store_->get("over"))));
}

int64_t Membership::first_open_round(int64_t from) {
  while (store_->check({key(from, "closed")})) ++from;
  return from;
}

bool Membership::someone_waiting(int64_t round) {
  return store_->check({key(round, "m0")}) && !store_->check({key(round, "closed")});
}

c10::intrusive_ptr<c10d::Store> Membership::generation_store(int64_t round) {
  return c10::make_intrusive<c10d::PrefixStore>(fmt::format("gen{}", round), store_);
}

// [join]
Membership::Claim Membership::claim(int64_t from, int64_t step, int64_t generation,
                                    const std::function<void()>& on_claim) {
  throw_if_over();  // a replacement that came too late: nobody will take it in
  Claim c{first_open_round(from), step, generation};
  // Claim the lowest free slot: compare-and-set succeeds for exactly one claimant, so slots are taken
  // without gaps and each holds its claimant's step and id.
  const std::string me = fmt::format("{} {} {}", step, generation, id_);
  while (store_text(store_->compareSet(key(c.round, fmt::format("m{}", c.slot)), {}, store_bytes(me))) != me) ++c.slot;
  if (on_claim) on_claim();
  if (step >= 0 && generation == c.round - 1)
    store_->compareSet(key(c.round, "t0"), {}, store_bytes(fmt::format("{:.3f}", wall_seconds())));
  return c;
}

Quorum Membership::join(Claim c, const std::function<void()>& on_claim) {
  const auto patience = 2 * timeout_ + settle_;
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (;; c = claim(c.round + 1, c.step, c.generation, on_claim)) {
    const int64_t r = c.round;
    const int idx = c.slot;
    const double settle = std::chrono::duration<double>(r == 0 ? timeout_ : settle_).count();
    int seen = idx + 1, closed = -1;
    while (closed < 0) {
      throw_if_over();
      if (store_->check({key(r, "closed")})) {
        closed = std::stoi(store_text(store_->get(key(r, "closed"))));
        break;
      }
      while (store_->check({key(r, fmt::format("m{}", seen))})) ++seen;
      const bool settled =
          store_->check({key(r, "t0")}) && wall_seconds() - std::stod(store_text(store_->get(key(r, "t0")))) >= settle;
      if (seen >= max_members_ || settled) {  // close with the count seen; the first close wins
        closed = std::stoi(store_text(store_->compareSet(key(r, "closed"), {}, store_bytes(std::to_string(seen)))));
        break;
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(
            fmt::format("round {}: no round closed within {:.1f} s: no member with state is "
                        "left to train with",
                        r, std::chrono::duration<double>(patience).count()));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (idx >= closed) continue;  // closed before this slot: wait in the next round

    std::vector<std::pair<int, Member>> with_state, fresh;
    for (int i = 0; i < closed; ++i) {
      std::istringstream in(store_text(store_->get(key(r, fmt::format("m{}", i)))));
      Member m;
      in >> m.step >> m.generation >> m.id;
      (m.fresh() ? fresh : with_state).emplace_back(i, m);
    }
    if (with_state.empty())
      throw std::runtime_error(fmt::format("round {} closed with newcomers only: nobody holds the model", r));
    Quorum q;
    q.round = r;
    for (const auto* list : {&with_state, &fresh})
      for (const auto& [i, m] : *list) {
        if (i == idx) q.rank = q.size();
        const Member* s = q.members.empty() ? nullptr : &q.members[q.source];  // ties: the longer record of generations
        if (!m.fresh() && (!s || std::tie(m.step, m.generation) > std::tie(s->step, s->generation)))
          q.source = q.size();
        q.members.push_back(m);
      }
    return q;
  }
}
// [join]

}  // namespace dp
