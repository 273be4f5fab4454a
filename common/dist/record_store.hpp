// A c10d::Store in one file whose every record is written by one write(), so that a process killed at any
// moment (kill -9, as stage 09's elastic runs do) never leaves the others unable to read it.
//
// Why not c10d::FileStore: it writes a record as four write() calls (key length, key, value length, value).
// A process killed between two of them leaves a truncated record, and every later reader of the file then
// waits for the rest of it forever (shown on LibTorch 1.13 by a kill between those calls). Here a record is
// one buffer and one write(), every change is made under an exclusive flock(), and a reader stops at the
// last complete record. The kernel may still cut one write() short when its writer dies (a fatal signal
// between two pages of a large record); what is left is then the last bytes of the file, and the next
// writer, holding the lock its dead owner lost, truncates them before it appends.
#pragma once

#include "common/base/c10d_compat.hpp"

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace dp {

/// A key-value store shared by the processes of one machine through the file at `path` (created if
/// missing), with c10d::FileStore's semantics: set, get (waits for the key), add (a decimal integer),
/// compareSet, check, deleteKey, getNumKeys, wait. A record is `"DPR1"`, a kind byte (set or delete), the
/// key's and the value's lengths (uint32, little-endian) and the two, appended with one write(); the
/// store is the replay of the records in file order. Safe across processes (flock) and threads (a mutex).
class RecordFileStore : public compat::CloneableStore {
 public:
  /// Opens (or creates) `path`; waits and gets give up after `timeout` with an error naming the keys.
  explicit RecordFileStore(std::string path, std::chrono::milliseconds timeout = c10d::Store::kDefaultTimeout);
  ~RecordFileStore() override;
  RecordFileStore(const RecordFileStore&) = delete;
  RecordFileStore& operator=(const RecordFileStore&) = delete;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  compat::StorePtr clone_store() override;  // another handle on the same file (2.x's clone())

  /// Bytes of the file that hold complete records, as this handle last read it (for the tests).
  int64_t complete_bytes();

  /// One record as the file holds it: what a test writes by hand to plant a torn one.
  static std::vector<uint8_t> encode_set(const std::string& key, const std::vector<uint8_t>& value);

 private:
  enum class Lock { shared, exclusive };
  class Locked;    // holds the mutex and the flock for one operation
  void refresh();  // reads the complete records past offset_
  void append_record(char kind, const std::string& key, const std::vector<uint8_t>& value);  // Lock::exclusive

  std::string path_;
  int fd_ = -1;
  std::mutex mutex_;
  int64_t offset_ = 0;                              // end of the last complete record read
  std::map<std::string, std::vector<uint8_t>> kv_;  // the replay up to offset_
};

}  // namespace dp
