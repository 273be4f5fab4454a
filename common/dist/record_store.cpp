#include "common/dist/record_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace dp {
namespace {

constexpr char kMagic[4] = {'D', 'P', 'R', '1'};
constexpr char kSet = 's';
constexpr char kDelete = 'd';
constexpr size_t kHeader = 4 + 1 + 4 + 4;  // magic, kind, key length, value length
// How often a waiting reader looks at the file again: short next to a round's settle time (hundreds of ms),
// long enough that a waiting process costs nothing worth measuring.
constexpr auto kPoll = std::chrono::milliseconds(2);

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw std::runtime_error(fmt::format("RecordFileStore {}: {}: {}", path, what, std::strerror(errno)));
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint32_t get_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

std::vector<uint8_t> encode(char kind, const std::string& key, const std::vector<uint8_t>& value) {
  std::vector<uint8_t> out(kMagic, kMagic + 4);
  out.reserve(kHeader + key.size() + value.size());
  out.push_back(static_cast<uint8_t>(kind));
  put_u32(out, static_cast<uint32_t>(key.size()));
  put_u32(out, static_cast<uint32_t>(value.size()));
  out.insert(out.end(), key.begin(), key.end());
  out.insert(out.end(), value.begin(), value.end());
  return out;
}

std::string joined(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

}  // namespace

// One operation's hold on the store: the mutex (threads of this process share one open file, and flock()
// locks an open file, not a thread) and the flock (other processes).
class RecordFileStore::Locked {
 public:
  Locked(RecordFileStore& s, Lock how) : s_(s), guard_(s.mutex_) {
    while (flock(s_.fd_, how == Lock::exclusive ? LOCK_EX : LOCK_SH) != 0)
      if (errno != EINTR) fail("flock", s_.path_);
    try {
      s_.refresh();
    } catch (...) {  // no destructor runs for a constructor that throws: the other processes would wait for good
      flock(s_.fd_, LOCK_UN);
      throw;
    }
  }
  ~Locked() { flock(s_.fd_, LOCK_UN); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  RecordFileStore& s_;
  std::lock_guard<std::mutex> guard_;
};

RecordFileStore::RecordFileStore(std::string path, std::chrono::milliseconds timeout)
    : compat::CloneableStore(timeout), path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("open", path_);
}

RecordFileStore::~RecordFileStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<uint8_t> RecordFileStore::encode_set(const std::string& key, const std::vector<uint8_t>& value) {
  return encode(kSet, key, value);
}

void RecordFileStore::refresh() {
  struct stat st {};
  if (fstat(fd_, &st) != 0) fail("fstat", path_);
  if (st.st_size < offset_) {  // truncated by a writer since (a torn record cut off): read it all again
    offset_ = 0;
    kv_.clear();
  }
  std::vector<uint8_t> buf(static_cast<size_t>(st.st_size - offset_));
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n = pread(fd_, buf.data() + got, buf.size() - got, offset_ + static_cast<int64_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("pread", path_);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  size_t at = 0;
  while (got - at >= kHeader) {
    const uint8_t* p = buf.data() + at;
    if (std::memcmp(p, kMagic, 4) != 0 || (p[4] != kSet && p[4] != kDelete))
      throw std::runtime_error(
          fmt::format("RecordFileStore {}: no record at byte {}: not a store file, or "
                      "written by something else; remove it and start the run again",
                      path_, offset_ + static_cast<int64_t>(at)));
    const size_t klen = get_u32(p + 5);
    const size_t vlen = get_u32(p + 9);
    if (got - at < kHeader + klen + vlen) break;  // a torn record at the end: its writer died in write()
    std::string key(reinterpret_cast<const char*>(p + kHeader), klen);
    if (p[4] == kSet)
      kv_[key].assign(p + kHeader + klen, p + kHeader + klen + vlen);
    else
      kv_.erase(key);
    at += kHeader + klen + vlen;
  }
  offset_ += static_cast<int64_t>(at);
}

void RecordFileStore::append_record(char kind, const std::string& key, const std::vector<uint8_t>& value) {
  // Under the exclusive lock nobody else writes, so bytes past the last complete record are a torn record
  // left by a writer that died holding this lock: cut them off, or the new record would follow garbage.
  struct stat st {};
  if (fstat(fd_, &st) != 0) fail("fstat", path_);
  if (st.st_size > offset_ && ftruncate(fd_, offset_) != 0) fail("ftruncate", path_);
  const std::vector<uint8_t> rec = encode(kind, key, value);
  // One write() (O_APPEND): a process killed during it leaves a prefix of this record at most, never
  // a record cut between its fields with more records after it.
  ssize_t n;
  do {
    n = ::write(fd_, rec.data(), rec.size());
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(rec.size())) {
    if (n >= 0 && ftruncate(fd_, offset_) != 0) fail("ftruncate", path_);
    fail(fmt::format("write of {} bytes (wrote {})", rec.size(), n), path_);
  }
  offset_ += n;
  if (kind == kSet)
    kv_[key] = value;
  else
    kv_.erase(key);
}

void RecordFileStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  Locked l(*this, Lock::exclusive);
  append_record(kSet, key, value);
}

std::vector<uint8_t> RecordFileStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                                 const std::vector<uint8_t>& desired) {
  Locked l(*this, Lock::exclusive);
  const auto it = kv_.find(key);
  // c10d::FileStore's rule: an absent key is set only when `expected` is empty, else `expected` comes back;
  // a present one is set when it equals `expected`, else its value comes back.
  if (it == kv_.end() && !expected.empty()) return expected;
  if (it != kv_.end() && it->second != expected) return it->second;
  append_record(kSet, key, desired);
  return desired;
}

std::vector<uint8_t> RecordFileStore::get(const std::string& key) {
  wait({key});
  Locked l(*this, Lock::shared);
  const auto it = kv_.find(key);
  if (it == kv_.end())
    throw std::runtime_error(fmt::format("RecordFileStore {}: key {} was deleted while it was read", path_, key));
  return it->second;
}

int64_t RecordFileStore::add(const std::string& key, int64_t value) {
  Locked l(*this, Lock::exclusive);
  const auto it = kv_.find(key);
  const int64_t now = (it == kv_.end() ? 0 : std::stoll(std::string(it->second.begin(), it->second.end()))) + value;
  const std::string text = std::to_string(now);
  append_record(kSet, key, std::vector<uint8_t>(text.begin(), text.end()));
  return now;
}

bool RecordFileStore::deleteKey(const std::string& key) {
  Locked l(*this, Lock::exclusive);
  if (!kv_.count(key)) return false;
  append_record(kDelete, key, {});
  return true;
}

bool RecordFileStore::check(const std::vector<std::string>& keys) {
  Locked l(*this, Lock::shared);
  for (const auto& k : keys)
    if (!kv_.count(k)) return false;
  return true;
}

int64_t RecordFileStore::getNumKeys() {
  Locked l(*this, Lock::shared);
  return static_cast<int64_t>(kv_.size());
}

void RecordFileStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void RecordFileStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto start = std::chrono::steady_clock::now();
  while (!check(keys)) {
    if (timeout != c10d::Store::kNoTimeout && std::chrono::steady_clock::now() - start >= timeout)
      throw std::runtime_error(
          fmt::format("RecordFileStore {}: waited {} ms for {}: timeout", path_, timeout.count(), joined(keys)));
    std::this_thread::sleep_for(kPoll);
  }
}

compat::StorePtr RecordFileStore::clone_store() { return c10::make_intrusive<RecordFileStore>(path_, timeout_); }

int64_t RecordFileStore::complete_bytes() {
  Locked l(*this, Lock::shared);
  return offset_;
}

}  // namespace dp
