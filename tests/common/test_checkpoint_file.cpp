// Unit tests for common/checkpoint_file: the FNV-1a hash, the header checks (magic, version, length,
// checksum), the atomic write through PATH.tmp, and broadcast_text between ranks (threads).
#include "common/dist/runtime.hpp"
#include "common/state/checkpoint_file.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

namespace fs = std::filesystem;
using namespace dp::testing;

const dp::FileFormat kTest{"TESTFILE", 3};

TEST(Fnv1a64, KnownValuesAndChaining) {
  EXPECT_EQ(dp::fnv1a64("", 0), dp::kFnv1a64Basis);
  EXPECT_EQ(dp::fnv1a64("a", 1), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(dp::fnv1a64("foobar", 6), 0x85944171f73967e8ULL);
  // Hashing in pieces, each continuing from the last, equals hashing the whole.
  EXPECT_EQ(dp::fnv1a64("bar", 3, dp::fnv1a64("foo", 3)), dp::fnv1a64("foobar", 6));
}

TEST(CheckpointFile, RoundTripKeepsMetadataAndPayload) {
  TempDir dir("checkpoint_file");
  const std::string path = dir.file("f.bin"), payload("\0\1\2binary\xff", 10);
  dp::write_checkpoint_file(path, kTest, "{\"hello\": 1}", payload);
  EXPECT_EQ(read_file(path).substr(0, 8), "TESTFILE");
  auto f = dp::read_checkpoint_file(path, kTest);
  EXPECT_EQ(f.version, 3u);
  EXPECT_EQ(f.meta(), "{\"hello\": 1}");
  EXPECT_EQ(std::string(f.payload(), f.payload_size), payload);
  EXPECT_EQ(f.bytes.size(), 36 + f.meta_size + f.payload_size);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(CheckpointFile, HeaderLengthAndChecksumAreChecked) {
  TempDir dir("checkpoint_file");
  const std::string good = dir.file("good.bin"), bad = dir.file("bad.bin");
  dp::write_checkpoint_file(good, kTest, "meta", std::string(100, 'x'));
  const std::string bytes = read_file(good);
  auto refused = [&](const std::string& content, const std::vector<std::string>& needles) {
    write_file(bad, content);
    expect_usage_error([&] { dp::read_checkpoint_file(bad, kTest); }, needles);
  };
  refused(bytes.substr(0, 20), {"is damaged", "shorter than the 36-byte header"});
  std::string magic = bytes;
  magic[0] = 'X';  // the first magic byte
  refused(magic, {"is damaged", "magic bytes TESTFILE"});
  refused(bytes.substr(0, bytes.size() - 1), {"is damaged", "truncated"});
  refused(bytes + "!", {"is damaged", "appended to"});
  std::string flipped = bytes;
  flipped[flipped.size() - 10] ^= 0x01;  // one bit of the payload
  refused(flipped, {"is damaged", "checksum mismatch"});
  expect_usage_error(
      [&] {
        dp::read_checkpoint_file(good, {"TESTFILE", 4});
      },
      {"format version 3", "this program reads version 4"});
  expect_usage_error([&] { dp::read_checkpoint_file(dir.file("missing.bin"), kTest); }, {"cannot read checkpoint"});
  expect_usage_error([&] { dp::read_checkpoint_file(dir.path.string(), kTest); },
                     {"cannot read checkpoint", "directory"});
}

TEST(CheckpointFile, FailedWriteLeavesThePreviousFileIntact) {
  TempDir dir("checkpoint_file");
  const std::string path = dir.file("f.bin");
  dp::write_checkpoint_file(path, kTest, "old", "payload");
  const std::string before = read_file(path);
  fs::create_directories(path + ".tmp");  // the temporary file cannot be created (even as root)
  expect_usage_error([&] { dp::write_checkpoint_file(path, kTest, "new", "payload"); }, {"cannot write checkpoint"});
  EXPECT_EQ(read_file(path), before);
  expect_usage_error([&] { dp::write_file_atomically(dir.file("no/such/dir/f.bin"), {}); },
                     {"cannot write checkpoint", "No such file or directory"});
  fs::remove(path + ".tmp");
  dp::write_checkpoint_file(path, kTest, "new", "payload");
  EXPECT_EQ(dp::read_checkpoint_file(path, kTest).meta(), "new");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// A payload streamed in pieces makes the same file, byte for byte, as the payload whole: the header
// written over the placeholder last carries the right size and checksum (a placeholder left in place
// is refused as truncated or damaged).
TEST(CheckpointFile, StreamedPayloadMakesTheSameFile) {
  TempDir dir("checkpoint_file");
  const std::string whole = dir.file("whole.bin"), streamed = dir.file("streamed.bin");
  std::string payload;
  for (int i = 0; i < 5000; ++i) payload.push_back(static_cast<char>(i * 7));
  dp::write_checkpoint_file(whole, kTest, "{\"m\": 2}", payload);
  dp::write_checkpoint_stream(streamed, kTest, "{\"m\": 2}", [&](const dp::ByteSink& sink) {
    for (size_t at = 0; at < payload.size(); at += 777)
      sink(payload.data() + at, std::min<size_t>(777, payload.size() - at));
  });
  EXPECT_EQ(read_file(streamed), read_file(whole));
  EXPECT_EQ(std::string(dp::read_checkpoint_file(streamed, kTest).payload(), payload.size()), payload);
  EXPECT_FALSE(fs::exists(streamed + ".tmp"));
}

// A producer that fails half-way (a serializer's error; a process killed there leaves the same PATH.tmp)
// leaves the previous file as it was and no PATH.tmp.
TEST(CheckpointFile, StreamFailingHalfWayLeavesThePreviousFile) {
  TempDir dir("checkpoint_file");
  const std::string path = dir.file("f.bin");
  dp::write_checkpoint_file(path, kTest, "old", "payload");
  const std::string before = read_file(path);
  EXPECT_THROW(dp::write_checkpoint_stream(path, kTest, "new",
                                           [&](const dp::ByteSink& sink) {
                                             sink("half", 4);
                                             throw std::runtime_error("serializer failed");
                                           }),
               std::runtime_error);
  EXPECT_EQ(read_file(path), before);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(BroadcastText, EveryRankGetsTheRootsText) {
  run_ranks(3, [](dp::ProcessGroup& pg) {
    const std::string mine = pg.rank() == 1 ? "error on rank 1" : "";
    if (dp::broadcast_text(pg, mine, 1) != "error on rank 1") throw dp::CheckFailed("wrong text");
    if (!dp::broadcast_text(pg, mine, 0).empty()) throw dp::CheckFailed("empty text not kept");
  });
}

// Rank 1 works alone for 1.5 s, three times the group's 500 ms collective timeout (a big checkpoint on a
// slow disk, in small): the others wait in short all-reduces and time out in none. What the work throws
// reaches every rank. (A single broadcast after the work, as before run_on_root(), times out here.)
TEST(RunOnRoot, WorkLongerThanTheTimeoutFailsNoPeer) {
  run_ranks(
      3,
      [](dp::ProcessGroup& pg) {
        bool ran = false;
        const std::string ok = dp::run_on_root(pg, 1, [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          ran = true;
        });
        if (!ok.empty() || ran != (pg.rank() == 1)) throw dp::CheckFailed("the work ran elsewhere, or failed: " + ok);
        const std::string failed = dp::run_on_root(pg, 1, [] { throw std::runtime_error("disk full"); });
        if (failed != "disk full") throw dp::CheckFailed("rank " + std::to_string(pg.rank()) + " got '" + failed + "'");
      },
      std::chrono::milliseconds(500));
}

// Work that outlasts 10 x the timeout (a stuck disk) ends the run rather than hang it: the root prints why
// and exits 1 (its thread still holds the caller's data), the others throw. In a child process (a gtest
// death test), since the root's exit ends every rank-thread of it.
TEST(RunOnRoot, WorkPastTenTimeoutsEndsTheRun) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        try {
          run_ranks(
              2,
              [](dp::ProcessGroup& pg) {
                dp::run_on_root(pg, 0, [] { std::this_thread::sleep_for(std::chrono::seconds(60)); });
              },
              std::chrono::milliseconds(200));
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank 1 threw: %s\n", e.what());  // then rank 0 exits; run_ranks waits for it
        }
        std::this_thread::sleep_for(std::chrono::seconds(30));
        std::_Exit(3);  // not reached when the root exits as it should
      },
      ::testing::ExitedWithCode(1), "rank 0 worked alone .writing a checkpoint. for more than 10 x --timeout .2 s.");
}

}  // namespace
