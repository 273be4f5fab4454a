// RecordFileStore (common/dist/record_store.hpp): c10d::FileStore's semantics, and a file that stays
// readable whatever moment a writer was killed at.
#include "common/dist/dist.hpp"
#include "common/dist/record_store.hpp"
#include "tests/support/files.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

using dp::RecordFileStore;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

TEST(RecordFileStore, HasFileStoresSemantics) {
  dp::testing::TempDir dir("record_store_semantics");
  RecordFileStore a(dir.file("store"), std::chrono::milliseconds(200));
  RecordFileStore b(dir.file("store"), std::chrono::milliseconds(200));  // another process, as far as the file goes
  a.set("k", bytes("one"));
  EXPECT_EQ(text(b.get("k")), "one");
  EXPECT_TRUE(b.check({"k"}));
  EXPECT_FALSE(b.check({"k", "absent"}));
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", -2), 3);
  EXPECT_EQ(text(a.get("n")), "3");  // a decimal, as c10d's stores keep it
  // compareSet: an absent key is set only when `expected` is empty; a present one when it equals `expected`.
  EXPECT_EQ(text(a.compareSet("c", bytes("x"), bytes("y"))), "x");
  EXPECT_FALSE(a.check({"c"}));
  EXPECT_EQ(text(a.compareSet("c", {}, bytes("first"))), "first");
  EXPECT_EQ(text(b.compareSet("c", {}, bytes("second"))), "first");  // taken: the winner's value comes back
  EXPECT_EQ(text(b.compareSet("c", bytes("first"), bytes("third"))), "third");
  EXPECT_EQ(text(a.get("c")), "third");
  EXPECT_EQ(a.getNumKeys(), 3);
  EXPECT_TRUE(b.deleteKey("k"));
  EXPECT_FALSE(b.deleteKey("k"));
  EXPECT_FALSE(a.check({"k"}));
  EXPECT_EQ(a.getNumKeys(), 2);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(a.get("never"), std::runtime_error);  // after the 200 ms timeout, not never
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

// What a writer killed inside write() can leave: a prefix of its record at the end of the file. Readers stop
// before it and see every complete record (the mutant that reads it as a record, or waits for its end, fails
// here or hangs past the timeout), and the next writer cuts it off before it appends.
TEST(RecordFileStore, ATornRecordAtTheEndIsIgnoredThenCutOff) {
  dp::testing::TempDir dir("record_store_torn");
  const std::string path = dir.file("store");
  {
    RecordFileStore w(path);
    w.set("before", bytes("kept"));
  }
  const auto rec = RecordFileStore::encode_set("torn", bytes("a value whose writer died"));
  for (size_t cut : {size_t(3), size_t(11), rec.size() - 1}) {  // inside the header, at its end, in the value
    const std::string whole = dp::testing::read_file(path);
    const int64_t good = static_cast<int64_t>(whole.size());
    dp::testing::write_file(path, whole + std::string(rec.begin(), rec.begin() + static_cast<long>(cut)));
    RecordFileStore r(path, std::chrono::milliseconds(100));
    EXPECT_EQ(text(r.get("before")), "kept") << "cut at " << cut;
    EXPECT_FALSE(r.check({"torn"})) << "cut at " << cut;
    EXPECT_EQ(r.complete_bytes(), good);
    EXPECT_THROW(r.wait({"torn"}), std::runtime_error);  // a timeout, as for any missing key: no hang
    r.set("after", bytes("written"));                    // cuts the torn bytes off first
    RecordFileStore fresh(path, std::chrono::milliseconds(100));
    EXPECT_EQ(text(fresh.get("after")), "written") << "cut at " << cut;
    EXPECT_EQ(text(fresh.get("before")), "kept");
    EXPECT_FALSE(fresh.check({"torn"}));
    EXPECT_EQ(dp::testing::read_file(path).size(),
              whole.size() + RecordFileStore::encode_set("after", bytes("written")).size());
    fresh.deleteKey("after");
  }
}

// A file that is not a store (another program's, or damaged) is an error naming the file and the remedy, for a
// writer as for a reader, and the writer's failed attempt leaves no lock behind: the next handle (another open
// file, as another process would have) answers at once instead of waiting for good.
TEST(RecordFileStore, AFileThatIsNotAStoreIsAnErrorNotAHang) {
  dp::testing::TempDir dir("record_store_foreign");
  const std::string path = dir.file("store");
  dp::testing::write_file(path, "this is not a store file, and it is longer than a header");
  RecordFileStore a(path, std::chrono::milliseconds(100));
  RecordFileStore b(path, std::chrono::milliseconds(100));
  try {
    a.set("k", bytes("v"));
    ADD_FAILURE() << "a write into a foreign file went through";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("remove it"), std::string::npos) << e.what();
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(b.check({"k"}), std::runtime_error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << "b waited for a's lock";
}

// Processes, not threads: four of them add 1 to a counter 200 times each and race for one compareSet key.
// Every add counts once (800) and exactly one process wins the key: the flock makes each read-modify-append
// one step.
TEST(RecordFileStore, ProcessesAddAndCompareSetAtomically) {
  dp::testing::TempDir dir("record_store_procs");
  const std::string path = dir.file("store");
  constexpr int kProcs = 4;
  constexpr int kAdds = 200;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      RecordFileStore s(path);
      const std::string me = std::to_string(p);
      s.compareSet("winner", {}, bytes(me));
      for (int i = 0; i < kAdds; ++i) s.add("count", 1);
      _exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  RecordFileStore s(path);
  EXPECT_EQ(text(s.get("count")), std::to_string(kProcs * kAdds));
  const std::string w = text(s.get("winner"));
  EXPECT_TRUE(w.size() == 1 && w[0] >= '0' && w[0] < '0' + kProcs) << w;
}

// Writers killed by SIGKILL at random moments, many times, while another process keeps writing: the file stays
// a replay of complete records that every reader reads to the end (each key a whole value), never a hang.
TEST(RecordFileStore, WritersKilledAtAnyMomentLeaveItReadable) {
  dp::testing::TempDir dir("record_store_kills");
  const std::string path = dir.file("store");
  const std::string value(3000, 'v');  // records across page boundaries: a write() a signal could cut
  for (int round = 0; round < 20; ++round) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      RecordFileStore s(path);
      for (int i = 0;; ++i) s.set("k" + std::to_string(i % 50), bytes(value));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + 3 * round));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    RecordFileStore r(path, std::chrono::milliseconds(100));
    r.set("round", bytes(std::to_string(round)));
    EXPECT_EQ(text(r.get("round")), std::to_string(round));
    for (int i = 0; i < 50; ++i)
      if (r.check({"k" + std::to_string(i)})) EXPECT_EQ(r.get("k" + std::to_string(i)).size(), value.size());
  }
}

// A Gloo process group forms over it (through a PrefixStore, as stage 09's generations do) and all-reduces.
TEST(RecordFileStore, CarriesAGlooGroupsRendezvous) {
  dp::testing::TempDir dir("record_store_gloo");
  const std::string path = dir.file("store");
  std::vector<std::thread> ranks;
  std::vector<double> sums(2, 0.0);
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      auto store = c10::make_intrusive<c10d::PrefixStore>("gen0", c10::make_intrusive<RecordFileStore>(path));
      auto pg = dp::ProcessGroup::init_with_store(store, r, 2, {"gloo", std::chrono::milliseconds(20000), ""});
      auto t = torch::full({4}, double(r + 1), torch::kFloat64);
      pg.all_reduce(t);
      sums[r] = t[0].item<double>();
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(sums[0], 3.0);
  EXPECT_EQ(sums[1], 3.0);
}

}  // namespace
