// Stage 09's membership rounds (stages/09_elastic/membership.hpp), with processes played by threads that
// each open the same store file: who is in a generation, in which order, whose state everyone takes, and
// what happens to one who comes late or alone. The whole elastic run is tested end to end by
// tests/elastic.py (a rank killed, stopped, replaced; two failures; a failure in a round and in a heal).
#include "common/base/errors.hpp"
#include "common/dist/fault.hpp"
#include "stages/09_elastic/membership.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

using dp::Membership;
using dp::Quorum;
using namespace std::chrono_literals;

namespace {

struct StoreFile {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("test_elastic." + std::to_string(::getpid()) + "." + std::to_string(counter++)))
                         .string();
  ~StoreFile() {
    std::filesystem::remove(path);
    std::filesystem::remove_all(path + ".dead");
  }
  // What ddp_launch --elastic does when process `id` ends: a mark beside the store.
  void mark_dead(const std::string& id) const {
    std::filesystem::create_directories(path + ".dead");
    std::ofstream(path + ".dead/" + id);
  }
  static inline int counter = 0;
};

// `n` processes join round `from` at once, announcing `steps[i]`; returns each one's quorum.
std::vector<Quorum> join_together(const std::string& path, const std::vector<int64_t>& steps, int max_members,
                                  int64_t from = 1, std::chrono::milliseconds settle = 200ms) {
  std::vector<std::future<Quorum>> f;
  for (size_t i = 0; i < steps.size(); ++i)
    f.push_back(std::async(std::launch::async, [&, i] {
      Membership m(path, std::to_string(i) + ".0", max_members, settle, 2000ms);
      return m.join(m.claim(from, steps[i], from - 1));  // members of the generation before
    }));
  std::vector<Quorum> out;
  for (auto& x : f) out.push_back(x.get());
  return out;
}

}  // namespace

TEST(Membership, AFullRoundClosesAtOnceWithOneOrderEverywhere) {
  StoreFile f;
  const auto t0 = std::chrono::steady_clock::now();
  // Round 0 waits for everyone (its settle time is the timeout): 3 of 3 close it without waiting.
  const auto q = join_together(f.path, {7, 9, 9}, 3, /*from=*/0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
  std::vector<bool> rank_seen(3, false);
  for (const auto& x : q) {
    EXPECT_EQ(x.round, 0);
    ASSERT_EQ(x.size(), 3);
    ASSERT_GE(x.rank, 0);
    ASSERT_LT(x.rank, 3);
    EXPECT_FALSE(rank_seen[x.rank]) << "two processes got rank " << x.rank;
    rank_seen[x.rank] = true;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(x.members[i].id, q[0].members[i].id) << "members in another order";
    EXPECT_EQ(x.members[x.rank].id, std::to_string(&x - q.data()) + ".0") << "rank points at another member";
    EXPECT_EQ(x.members[x.source].step, 9) << "the state comes from a member with the most steps";
    EXPECT_EQ(x.source, q[0].source);
  }
}

TEST(Membership, NewcomersComeAfterTheMembersWithState) {
  StoreFile f;
  const auto q = join_together(f.path, {-1, 4, -1, 4}, 4);
  for (const auto& x : q) {
    ASSERT_EQ(x.size(), 4);
    EXPECT_FALSE(x.members[0].fresh());
    EXPECT_FALSE(x.members[1].fresh());
    EXPECT_TRUE(x.members[2].fresh());
    EXPECT_TRUE(x.members[3].fresh());
    EXPECT_EQ(x.source, 0) << "ties go to the lowest rank";
  }
}

// Equal steps mean equal states, but not equal records: one who was left out of the latest generation (it saw the
// failure late, or came alone) does not know that generation. Its member's state, the longer record, wins.
TEST(Membership, TiesGoToTheLatestGeneration) {
  StoreFile f;
  auto left_out = std::async(std::launch::async, [&] {
    Membership m(f.path, "0.0", 2, 100ms, 2000ms);
    return m.join(m.claim(2, 20, /*generation=*/0));  // arrives first: rank 0
  });
  std::this_thread::sleep_for(100ms);
  Membership alone(f.path, "2.0", 2, 100ms, 2000ms);
  const Quorum q = alone.join(alone.claim(2, 20, /*generation=*/1));  // trained generation 1 alone
  EXPECT_EQ(left_out.get().source, q.source);
  ASSERT_EQ(q.size(), 2);
  EXPECT_EQ(q.members[0].id, "0.0");
  EXPECT_EQ(q.source, 1) << "the state (and its record of generations) comes from the member of generation 1";
  EXPECT_EQ(q.members[1].generation, 1);
}

TEST(Membership, ARoundThatIsNotFullClosesAfterTheSettleTime) {
  StoreFile f;
  const auto t0 = std::chrono::steady_clock::now();
  const auto q = join_together(f.path, {3, 3}, 4, 1, 300ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 1500ms);
  EXPECT_EQ(q[0].size(), 2);
}

TEST(Membership, OneWhoComesLateWaitsInTheNextRoundWhereTheMembersFindIt) {
  StoreFile f;
  const auto q = join_together(f.path, {5, 5}, 3, 1, 100ms);
  ASSERT_EQ(q[0].round, 1);
  Membership member(f.path, "0.0", 3, 100ms, 2000ms);
  EXPECT_FALSE(member.someone_waiting(2));
  auto late = std::async(std::launch::async, [&] {
    Membership m(f.path, "2.1", 3, 100ms, 2000ms);
    return m.join(m.claim(1, -1, -1));  // round 1 is closed: it claims a slot in round 2
  });
  for (int i = 0; i < 200 && !member.someone_waiting(2); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(member.someone_waiting(2)) << "the members would never know that someone waits";
  const auto grown = join_together(f.path, {6, 6}, 3, 2, 100ms);  // the members re-form, in round 2
  const Quorum newcomer = late.get();
  EXPECT_EQ(newcomer.round, 2);
  EXPECT_EQ(newcomer.size(), 3);
  EXPECT_EQ(newcomer.rank, 2) << "the newcomer comes after the members with state";
  EXPECT_EQ(grown[0].members[2].id, "2.1");
}

// A member of an older generation that was left out (it saw the failure late) has state, but must not close a
// round alone while the latest generation trains: it waits until that generation's members come.
TEST(Membership, ALateMemberWithStateWaitsForTheLatestGeneration) {
  StoreFile f;
  const auto q = join_together(f.path, {5, 5}, 3, 1, 100ms);  // generation 1: two of generation 0's members
  ASSERT_EQ(q[0].size(), 2);
  auto late = std::async(std::launch::async, [&] {
    Membership m(f.path, "2.0", 3, 100ms, 2000ms);
    return m.join(m.claim(1, 5, /*generation=*/0));  // left out of round 1: waits in round 2
  });
  std::this_thread::sleep_for(400ms);  // four settle times: it would have closed round 2 alone by now
  Membership probe(f.path, "probe", 3, 100ms, 2000ms);
  ASSERT_TRUE(probe.someone_waiting(2)) << "the late member closed a round alone: two generations at once";
  const auto grown = join_together(f.path, {6, 6}, 3, 2, 100ms);
  EXPECT_EQ(late.get().size(), 3);
  EXPECT_EQ(grown[0].size(), 3);
  EXPECT_FALSE(probe.someone_waiting(2)) << "a closed round has nobody waiting";
}

TEST(Membership, NewcomersAloneHoldNoStateAndSaySo) {
  StoreFile f;
  // A full round of newcomers: nobody holds the model (stage 09 falls back to its checkpoint).
  for (const Quorum& q : join_together(f.path, {-1, -1}, 2)) {
    EXPECT_EQ(q.size(), 2);
    EXPECT_EQ(q.source, -1) << "a newcomer named as the source of a state it does not have";
  }
  // One newcomer alone waits for members with state, then gives up (2 x timeout + settle).
  StoreFile g;
  Membership m(g.path, "1.1", 3, 50ms, 100ms);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    m.join(m.claim(1, -1, -1));
    FAIL() << "a newcomer alone closed a round";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no member with state is left"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms);
}

// A replacement that starts as the last generation finishes would wait for members who never come (until
// its patience, 2 x timeout + settle, ran out, or the launcher stopped it: a failed run). Once the run is
// closed, one already waiting and one that comes later are both told at once.
TEST(Membership, OneWhoComesAfterTheRunIsOverIsToldAtOnce) {
  StoreFile f;
  join_together(f.path, {5, 5}, 2, 1, 100ms);  // generation 1 trains; a replacement then waits in round 2
  auto waiting = std::async(std::launch::async, [&] {
    Membership m(f.path, "2.1", 3, 100ms, 5000ms);
    m.join(m.claim(2, -1, -1));
  });
  Membership member(f.path, "0.0", 2, 100ms, 5000ms);
  for (int i = 0; i < 200 && !member.someone_waiting(2); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(member.someone_waiting(2));
  const auto t0 = std::chrono::steady_clock::now();
  member.close_run(60);  // generation 1 trained the last step
  try {
    waiting.get();
    FAIL() << "the waiting replacement got into a generation after the run was over";
  } catch (const dp::RunOver& e) {
    EXPECT_NE(std::string(e.what()).find("all 60 steps"), std::string::npos) << e.what();
  }
  Membership later(f.path, "2.2", 3, 100ms, 5000ms);
  EXPECT_THROW(later.join(later.claim(2, -1, -1)), dp::RunOver);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms) << "told only when its patience (10.1 s) ran out";
}

TEST(Faults, AMalformedEntryIsBadInput) {
  StoreFile f;
  Membership m(f.path, "0.0", 1, 10ms, 1000ms);
  ::setenv("DP_FAULT", "explode@1:step3", 1);
  EXPECT_THROW(dp::Faults(m.store(), m.id(), 0, 0), dp::UsageError);
  ::setenv("DP_FAULT", "die@1", 1);
  EXPECT_THROW(dp::Faults(m.store(), m.id(), 0, 0), dp::UsageError);
  ::setenv("DP_FAULT", "die@1:step3,stop@*:heal,pause@1:over", 1);
  dp::Faults ok(m.store(), m.id(), 0, 0);
  ok.at("step3");  // slot 1's faults: nothing happens to slot 0
  ok.at("over");
  EXPECT_LT(ok.last_fired(), 0);
  ::unsetenv("DP_FAULT");
}

// The launcher marks each process that ended. A round whose missing member is marked dead closes as soon as
// the others are in: nobody is left to wait the settle time for.
TEST(Membership, AMemberMarkedDeadIsNotWaitedFor) {
  StoreFile f;
  join_together(f.path, {5, 5, 5}, 3, 1, 100ms);  // generation 1: 0.0, 1.0, 2.0
  f.mark_dead("2.0");
  const auto t0 = std::chrono::steady_clock::now();
  const auto q = join_together(f.path, {6, 6}, 3, 2, 3000ms);  // 0.0 and 1.0, with a settle time of 3 s
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms) << "the round waited for a member marked dead";
  EXPECT_EQ(q[0].size(), 2);
  EXPECT_EQ(q[0].round, 2);
}

// A member that claimed its slot and then died is left out by whoever closes the round: a group with it could
// never form (every survivor would wait --timeout for it).
TEST(Membership, AClaimantMarkedDeadIsLeftOutOfTheGeneration) {
  StoreFile f;
  join_together(f.path, {5, 5, 5}, 3, 1, 100ms);
  Membership doomed(f.path, "2.0", 3, 100ms, 2000ms);
  doomed.claim(2, 6, 1);  // claims slot 0 of round 2, then dies
  f.mark_dead("2.0");
  const auto q = join_together(f.path, {6, 6}, 3, 2, 3000ms);
  ASSERT_EQ(q[0].size(), 2);
  for (const Quorum& x : q)
    for (const auto& m : x.members) EXPECT_NE(m.id, "2.0") << "a dead claimant in the generation";
  EXPECT_EQ(q[0].members[q[0].source].step, 6);
}

// Newcomers alone never close a round beside a generation that is alive (it would be two runs at once); once
// every member of the latest generation is marked dead, they do, after the settle time (for other replacements
// on their way), with nobody as the source: stage 09 falls back to the checkpoint.
TEST(Membership, NewcomersCloseARoundOnlyWhenEveryHolderIsDead) {
  StoreFile f;
  join_together(f.path, {5, 5}, 3, 1, 100ms);  // generation 1: 0.0, 1.0
  auto newcomer = std::async(std::launch::async, [&] {
    Membership m(f.path, "2.1", 3, 100ms, 5000ms);
    return m.join(m.claim(2, -1, -1));
  });
  std::this_thread::sleep_for(400ms);  // four settle times
  Membership probe(f.path, "probe", 3, 100ms, 5000ms);
  ASSERT_TRUE(probe.someone_waiting(2)) << "a newcomer closed a round while the generation before was alive";
  f.mark_dead("0.0");
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(probe.someone_waiting(2)) << "closed while a holder (1.0) was still alive";
  f.mark_dead("1.0");
  const Quorum q = newcomer.get();
  EXPECT_EQ(q.size(), 1);
  EXPECT_EQ(q.source, -1);
}
