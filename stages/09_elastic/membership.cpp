#include "stages/09_elastic/membership.hpp"

#include "common/base/store_values.hpp"
#include "common/base/timeline.hpp"
#include "common/dist/record_store.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>

namespace dp {
namespace {

// A round's close as its closer wrote it, "<count> [<slot>...]": the first `count` slots are in, but for
// those the closer knew dead (a member that claimed, then died: a group with it could never form).
struct Close {
  int count = -1;
  std::vector<int> dead;
  bool in(int slot) const { return slot < count && std::find(dead.begin(), dead.end(), slot) == dead.end(); }
};

Close parse_close(const std::string& text) {
  std::istringstream in(text);
  Close c;
  in >> c.count;
  for (int slot; in >> slot;) c.dead.push_back(slot);
  return c;
}

}  // namespace

Membership::Membership(const std::string& path, std::string id, int max_members, std::chrono::milliseconds settle,
                       std::chrono::milliseconds timeout)
    : id_(std::move(id)), dead_(path + ".dead"), max_members_(max_members), settle_(settle), timeout_(timeout) {
  // Not c10d::FileStore: a process killed inside one of its records leaves every later reader waiting for the
  // rest (common/dist/record_store.hpp). The launcher owns the file and removes it at the end.
  // The timeout: how long a generation's process group waits for a member that never comes.
  store_ = c10::make_intrusive<RecordFileStore>(path, timeout);
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

void Membership::set_count(const std::string& name, int64_t value) {
  store_->set("count/" + name, store_bytes(std::to_string(value)));
}
int64_t Membership::count(const std::string& name) {
  return store_->check({"count/" + name}) ? std::stoll(store_text(store_->get("count/" + name))) : -1;
}

Member Membership::member(int64_t round, int slot) {
  std::istringstream in(store_text(store_->get(key(round, fmt::format("m{}", slot)))));
  Member m;
  in >> m.step >> m.generation >> m.id;
  return m;
}

bool Membership::dead(const std::string& id) const { return std::filesystem::exists(dead_ + "/" + id); }

std::vector<std::string> Membership::generation_ids(int64_t round) {
  std::vector<std::string> ids;
  if (round < 0 || !store_->check({key(round, "closed")})) return ids;
  const Close c = parse_close(store_text(store_->get(key(round, "closed"))));
  for (int i = 0; i < c.count; ++i)
    if (c.in(i)) ids.push_back(member(round, i).id);
  return ids;
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
    const std::vector<std::string> latest = generation_ids(r - 1);  // empty: no generation before (round 0)
    std::vector<Member> in;                                         // the claimants seen so far, slot order
    Close closed;
    while (closed.count < 0) {
      throw_if_over();
      if (store_->check({key(r, "closed")})) {
        closed = parse_close(store_text(store_->get(key(r, "closed"))));
        break;
      }
      while (store_->check({key(r, fmt::format("m{}", in.size()))}))
        in.push_back(member(r, static_cast<int>(in.size())));
      const int seen = static_cast<int>(in.size());
      // Every member of the latest generation is here or dead (the launcher marks each process that ended):
      // nobody else is coming, so the round need not wait out the settle time. Without a member with state
      // it starts the settle clock instead, for the other replacements on their way.
      bool all_in = !latest.empty();
      bool with_state = false;
      for (const auto& m : in) with_state = with_state || (!m.fresh() && !dead(m.id));
      for (const auto& id : latest) {
        const bool here = std::any_of(in.begin(), in.end(), [&](const Member& m) { return m.id == id; });
        all_in = all_in && (here || dead(id));
      }
      if (all_in && !with_state)
        store_->compareSet(key(r, "t0"), {}, store_bytes(fmt::format("{:.3f}", wall_seconds())));
      const bool settled =
          store_->check({key(r, "t0")}) && wall_seconds() - std::stod(store_text(store_->get(key(r, "t0")))) >= settle;
      if (seen >= max_members_ || settled || (all_in && with_state)) {  // close with the count seen; the first wins
        std::string close = std::to_string(seen);
        for (int i = 0; i < seen; ++i)
          if (dead(in[i].id)) close += " " + std::to_string(i);
        closed = parse_close(store_text(store_->compareSet(key(r, "closed"), {}, store_bytes(close))));
        break;
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(
            fmt::format("round {}: no round closed within {:.1f} s: no member with state is "
                        "left to train with",
                        r, std::chrono::duration<double>(patience).count()));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!closed.in(idx)) continue;  // closed before this slot: wait in the next round

    std::vector<std::pair<int, Member>> with_state, fresh;
    for (int i = 0; i < closed.count; ++i) {
      if (!closed.in(i)) continue;
      const Member m = member(r, i);
      (m.fresh() ? fresh : with_state).emplace_back(i, m);
    }
    Quorum q;
    q.round = r;
    q.source = -1;  // stays -1 with newcomers only: nobody holds the state
    for (const auto* list : {&with_state, &fresh})
      for (const auto& [i, m] : *list) {
        if (i == idx) q.rank = q.size();
        const Member* s = q.source < 0 ? nullptr : &q.members[q.source];  // ties: the longer record of generations
        if (!m.fresh() && (!s || std::tie(m.step, m.generation) > std::tie(s->step, s->generation)))
          q.source = q.size();
        q.members.push_back(m);
      }
    return q;
  }
}
// [join]

}  // namespace dp
