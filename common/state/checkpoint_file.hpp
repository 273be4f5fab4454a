// The checkpoint file container: header (magic, version, lengths), FNV-1a checksum, atomic write.
// A damaged, truncated or foreign file is refused by name instead of loaded, and a crash while saving
// never destroys the previous checkpoint. What goes inside (which tensors, which metadata) is the
// caller's business (a sharded optimizer's state, a whole training run's).
//
// File layout (integers little-endian):
//   offset  0  8 bytes  magic (FileFormat::magic, e.g. "DPZ1CKPT")
//           8  u32      format version (FileFormat::version)
//          12  u64      M: bytes of the metadata
//          20  u64      T: bytes of the payload
//          28  u64      FNV-1a 64-bit hash of the M + T bytes that follow
//          36  M bytes  metadata, text (JSON by convention: readable with `head -c 2000 FILE`)
//          36+M T bytes payload, binary
#pragma once

#include "common/base/hash.hpp"
#include "common/dist/dist.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dp {

/// Which kind of file: the magic bytes it starts with and the one format version this program reads.
struct FileFormat {
  std::string magic;     ///< exactly 8 bytes
  uint32_t version = 1;  ///< written into the header; a file with another version is refused
};

/// A file that passed every byte-level check (magic, version, length, hash).
struct CheckpointFile {
  std::string bytes;        ///< the whole file
  uint32_t version = 0;     ///< the version in its header
  size_t meta_size = 0;     ///< M
  size_t payload_size = 0;  ///< T
  /// The metadata text (a view into `bytes`).
  std::string_view meta() const;
  /// The first byte of the payload (inside `bytes`).
  const char* payload() const;
};

/// Writes header, `meta` and `payload` to `path` through write_file_atomically(). Throws
/// dp::UsageError ("cannot write checkpoint PATH: ...") when it cannot.
void write_checkpoint_file(const std::string& path, const FileFormat& format, const std::string& meta,
                           const std::string& payload);

/// Where a payload's bytes go, in order, as they are produced.
using ByteSink = std::function<void(const char* data, size_t n)>;

/// As write_checkpoint_file(), with a payload that `produce` hands to the sink piece by piece (a
/// serializer's output): it goes to PATH.tmp as it comes, so the file's bytes are never all in memory.
/// The same file, the same atomic replacement, the same errors.
void write_checkpoint_stream(const std::string& path, const FileFormat& format, const std::string& meta,
                             const std::function<void(const ByteSink&)>& produce);

/// Reads `path` and checks magic, version, length and hash, in that order. Throws dp::UsageError
/// naming the first problem: "cannot read checkpoint PATH", "checkpoint PATH is damaged: ..." (too
/// short for the header, wrong magic, length or checksum) or "... has format version V".
CheckpointFile read_checkpoint_file(const std::string& path, const FileFormat& format);

/// Writes `parts` one after the other to PATH.tmp, flushes it to disk (fsync), renames it over `path`
/// and syncs the directory: `path` is always either the old file or the whole new one. On failure
/// PATH.tmp is removed and dp::UsageError ("cannot write checkpoint PATH: ...") thrown.
void write_file_atomically(const std::string& path, const std::vector<const std::string*>& parts);

/// Sets what write_file_atomically() calls with PATH.tmp partly written (its first part, the header, only): stage 09's
/// fault point for a process killed in the middle of a checkpoint (the checkpoint before must stay valid).
/// Empty (the default): nothing.
void set_checkpoint_write_hook(std::function<void()> hook);

/// Sends `text` from rank `root` to every rank (its length, then its bytes) and returns it on every
/// rank. A collective. Used to let every rank throw the error that only the writing rank saw.
std::string broadcast_text(ProcessGroup& pg, const std::string& text, int root);

/// Runs `work` on rank `root` alone (on a thread of its own) and returns, on every rank, what it threw
/// (the exception's what()), or "" when it returned. A collective. Meanwhile every rank, root included,
/// joins a one-float all-reduce every 50 ms until `work` is done: the others wait in collectives that end
/// within a poll, never in one that must outlast `work`, so work longer than the collective timeout (a
/// checkpoint of many GB written to a slow disk) fails no peer, while a root that dies still ends the others
/// after the timeout. Work still running after 10 x the timeout (a stuck disk) ends the run: the others throw
/// std::runtime_error saying so, and the root, whose thread still uses the caller's data, prints it and exits 1.
/// `work` must not use `pg`.
std::string run_on_root(ProcessGroup& pg, int root, const std::function<void()>& work);

}  // namespace dp
