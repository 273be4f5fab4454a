// The checkpoint container: header, FNV-1a checksum, atomic write through a temporary file, checks on read.
#include "common/state/checkpoint_file.hpp"

#include "common/dist/runtime.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace dp {

namespace {

constexpr size_t kHeaderBytes = 36;  // magic 8 + version 4 + meta size 8 + payload size 8 + hash 8

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const char* data, size_t n, const std::string& file) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw UsageError(fmt::format("cannot write checkpoint {}: {}", file, errno_text()));
    data += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

std::string_view CheckpointFile::meta() const { return std::string_view(bytes).substr(kHeaderBytes, meta_size); }
const char* CheckpointFile::payload() const { return bytes.data() + kHeaderBytes + meta_size; }

std::function<void()>& write_hook() {
  static std::function<void()> hook;
  return hook;
}

void set_checkpoint_write_hook(std::function<void()> hook) { write_hook() = std::move(hook); }

// [atomic_write]
// PATH is replaced in one step (rename is atomic within a file system): a crash or a full disk leaves
// either the old checkpoint or the new one, never half of one. The bytes go to PATH.tmp first; commit()
// flushes it to disk and renames it over PATH; a TmpFile destroyed without commit() removes PATH.tmp.
class TmpFile {
 public:
  explicit TmpFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw UsageError(fmt::format("cannot write checkpoint {}: cannot create {}: {}", path_, tmp_, errno_text()));
  }
  TmpFile(const TmpFile&) = delete;
  TmpFile& operator=(const TmpFile&) = delete;
  ~TmpFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  void append(const char* data, size_t n) { write_all(fd_, data, n, tmp_); }
  /// Overwrites bytes already appended (a header whose sizes and checksum are known only at the end).
  void write_at(uint64_t offset, const std::string& bytes) {
    if (::pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset)) != static_cast<ssize_t>(bytes.size()))
      throw UsageError(fmt::format("cannot write checkpoint {}: {}", tmp_, errno_text()));
  }
  void commit() {
    if (::fsync(fd_) != 0) throw UsageError(fmt::format("cannot write checkpoint {}: fsync: {}", tmp_, errno_text()));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw UsageError(fmt::format("cannot write checkpoint {}: close: {}", tmp_, errno_text()));
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw UsageError(fmt::format("cannot write checkpoint {}: rename from {}: {}", path_, tmp_, errno_text()));
    committed_ = true;
    // The rename lives in the directory: sync it too, so the new name survives a power cut.
    const auto slash = path_.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

void write_file_atomically(const std::string& path, const std::vector<const std::string*>& parts) {
  TmpFile file(path);
  for (const auto* part : parts) {
    file.append(part->data(), part->size());
    if (part == parts.front() && write_hook()) write_hook()();
  }
  file.commit();
}
// [atomic_write]

namespace {

std::string header_of(const FileFormat& format, uint64_t meta_size, uint64_t payload_size, uint64_t hash) {
  if (format.magic.size() != 8) throw UsageError("write_checkpoint_file: the magic must be 8 bytes");
  std::string header = format.magic;
  put_le(header, format.version, 4);
  put_le(header, meta_size, 8);
  put_le(header, payload_size, 8);
  put_le(header, hash, 8);
  return header;
}

}  // namespace

void write_checkpoint_file(const std::string& path, const FileFormat& format, const std::string& meta,
                           const std::string& payload) {
  const uint64_t hash = fnv1a64(payload.data(), payload.size(), fnv1a64(meta.data(), meta.size()));
  const std::string header = header_of(format, meta.size(), payload.size(), hash);
  write_file_atomically(path, {&header, &meta, &payload});
}

// [stream]
// The payload goes to the file as it is produced, never whole in memory: the header's payload size and
// checksum are known only at its end, so a header of zeros goes first and the real one over it last
// (the file is renamed into place only after that: PATH never shows the zeros).
void write_checkpoint_stream(const std::string& path, const FileFormat& format, const std::string& meta,
                             const std::function<void(const ByteSink&)>& produce) {
  const std::string placeholder = header_of(format, 0, 0, 0);
  TmpFile file(path);
  file.append(placeholder.data(), placeholder.size());
  if (write_hook()) write_hook()();
  file.append(meta.data(), meta.size());
  uint64_t hash = fnv1a64(meta.data(), meta.size());
  uint64_t payload_size = 0;
  produce([&](const char* data, size_t n) {
    file.append(data, n);
    hash = fnv1a64(data, n, hash);
    payload_size += n;
  });
  file.write_at(0, header_of(format, meta.size(), payload_size, hash));
  file.commit();
}
// [stream]

CheckpointFile read_checkpoint_file(const std::string& path, const FileFormat& format) {
  // Read once, into its place: through a string stream the file was held twice (a model's whole state,
  // 12 bytes a parameter with AdamW, in two copies on every rank that resumes).
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);  // fails on a folder or a missing file
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) throw UsageError(fmt::format("cannot read checkpoint {}: {}", path, ec ? ec.message() : errno_text()));
  CheckpointFile c;
  c.bytes.resize(static_cast<size_t>(size));
  if (!in.read(c.bytes.data(), static_cast<std::streamsize>(size)))
    throw UsageError(fmt::format("cannot read checkpoint {}: {}", path, errno_text()));
  const std::string& b = c.bytes;
  const std::string damaged = fmt::format("checkpoint {} is damaged", path);
  if (b.size() < kHeaderBytes)
    throw UsageError(
        fmt::format("{}: {} bytes, shorter than the {}-byte header (truncated?)", damaged, b.size(), kHeaderBytes));
  if (b.compare(0, format.magic.size(), format.magic) != 0)
    throw UsageError(fmt::format("{}: it does not start with the magic bytes {} (not a checkpoint of this project?)",
                                 damaged, format.magic));
  c.version = static_cast<uint32_t>(get_le(b.data() + 8, 4));
  if (c.version != format.version)
    throw UsageError(fmt::format("checkpoint {} has format version {}; this program reads version {}", path, c.version,
                                 format.version));
  const uint64_t meta_size = get_le(b.data() + 12, 8), payload_size = get_le(b.data() + 20, 8);
  const uint64_t stored_hash = get_le(b.data() + 28, 8);
  const uint64_t body = b.size() - kHeaderBytes;
  if (meta_size > body || payload_size != body - meta_size)
    throw UsageError(fmt::format("{}: the header announces {} bytes but the file has {} (truncated or appended to)",
                                 damaged, kHeaderBytes + meta_size + payload_size, b.size()));
  const uint64_t hash = fnv1a64(b.data() + kHeaderBytes, body);
  if (hash != stored_hash)
    throw UsageError(
        fmt::format("{}: checksum mismatch (stored {:016x}, computed {:016x})", damaged, stored_hash, hash));
  c.meta_size = meta_size;
  c.payload_size = payload_size;
  return c;
}

std::string broadcast_text(ProcessGroup& pg, const std::string& text, int root) {
  auto length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kInt64).to(pg.device());
  pg.broadcast(length, root);
  const int64_t n = length.item<int64_t>();
  if (n == 0) return {};
  auto bytes = torch::empty({n}, torch::kUInt8);
  if (pg.rank() == root) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), static_cast<size_t>(n));
  bytes = bytes.to(pg.device());
  pg.broadcast(bytes, root);
  bytes = bytes.cpu();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

std::string run_on_root(ProcessGroup& pg, int root, const std::function<void()>& work) {
  // What the worker thread reports. It may outlive this call only by ending the process (below).
  struct Outcome {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::string error;
  };
  auto out = std::make_shared<Outcome>();
  std::thread worker;
  if (pg.rank() == root)
    worker = std::thread([out, &work] {
      std::string error;
      try {
        work();
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "unknown error";
      }
      std::lock_guard<std::mutex> lock(out->mu);
      out->error = std::move(error);
      out->done = true;
      out->cv.notify_all();
    });
  // The root's state, summed: 0 working, 1 done, 2 past the deadline. Every rank leaves after the same all-reduce.
  const auto limit = 10 * pg.timeout();
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto flag = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(pg.device()));
  float state = 0;
  try {
    while (state == 0) {
      if (pg.rank() == root) {
        std::unique_lock<std::mutex> lock(out->mu);
        if (out->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return out->done; }))
          state = 1;
        else if (std::chrono::steady_clock::now() > deadline)
          state = 2;
      }
      flag.fill_(state);
      pg.all_reduce(flag, "waiting for rank " + std::to_string(root));
      state = flag.item<float>();
    }
  } catch (...) {  // a peer failed: the work holds the caller's data, so let it end before unwinding
    if (worker.joinable()) worker.join();
    throw;
  }
  if (state == 2) {
    const std::string what = fmt::format(
        "rank {} worked alone (writing a checkpoint) for more than 10 x --timeout ({:.0f} s) and did not finish: "
        "is its disk stuck?",
        root, std::chrono::duration<double>(limit).count());
    if (pg.rank() != root) throw std::runtime_error(what);
    // The worker still runs on the caller's data: this process cannot return, so it ends here (exit 1).
    std::fprintf(stderr, "[rank %d/%d] error: %s\n", pg.rank(), pg.world_size(), what.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  if (worker.joinable()) worker.join();         // done: it has returned
  return broadcast_text(pg, out->error, root);  // out->error was written before done
}

}  // namespace dp
