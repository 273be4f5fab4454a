// Real text for the capstone: a corpus read as bytes (vocabulary 256), split into training and
// held-out text, and a sampler that deals every step's global batch out to the ranks.
//
// The sampler is PyTorch's DistributedSampler made world-size-free: every epoch a seeded shuffle of
// all training windows, step s takes the next G windows of that shuffle (G = the global batch), and
// rank r of W takes G/W of them. The windows of a step depend on (seed, s) only, never on W, so 1, 2 or
// 4 ranks train on exactly the same data, and a run resumed at step s sees what it would have seen.
#pragma once

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dp {

/// Bytes of text as tokens, split into training and validation.
struct TextCorpus {
  std::string source;                       ///< what was read: the file, or the directory and its file count
  torch::Tensor train;                      ///< [n_train] int64 bytes in [0, 256)
  torch::Tensor val;                        ///< [n_val] int64
  static constexpr int64_t kVocab = 256;    ///< byte-level tokens
  static constexpr int64_t kBlock = 4096;   ///< the split works on blocks of this many bytes (n / 20 under 80 KiB)...
  static constexpr int64_t kValEvery = 20;  ///< ...and every 20th block (5%) is held out
};

/// Where the capstone finds text by default: Debian's `fortunes` package (about 2.4 MB of quotations
/// in 40 files).
inline const char* kDefaultCorpus = "/usr/share/games/fortunes";

/// Reads `path`: a file, or every regular file directly in a directory (sorted by name; symbolic links
/// and `*.dat` index files skipped), concatenated. Throws dp::UsageError naming the path and the remedy
/// when it does not exist, is neither a regular file nor a folder, is a folder with no such file, or when
/// its training text holds fewer than (batch + 1) x (context + 1) bytes or its held-out text fewer than
/// context + 1 (one validation window).
TextCorpus load_corpus(const std::string& path, int64_t batch, int64_t context);

/// Windows of `context + 1` tokens (inputs and their next tokens) cut from `tokens` at multiples of
/// `context`: window j is tokens[j*T, j*T + T + 1).
int64_t window_count(const torch::Tensor& tokens, int64_t context);
/// Stacks windows `ids` of `tokens` (host memory) into (inputs [n, T], targets [n, T]) on `device`, where the
/// model computes: every batch of the capstone (training, validation, the check) is cut here.
std::pair<torch::Tensor, torch::Tensor> windows(const torch::Tensor& tokens, const std::vector<int64_t>& ids,
                                                int64_t context, torch::Device device = torch::kCPU);

/// Which training windows each step uses, and which of them are this rank's.
class DistributedSampler {
 public:
  /// Throws dp::UsageError when `global_batch` is not a multiple of `world_size` or exceeds the windows.
  DistributedSampler(int64_t num_windows, int64_t global_batch, uint64_t seed, int rank, int world_size);
  /// Steps in one pass over the data (the last incomplete batch of an epoch is dropped).
  int64_t steps_per_epoch() const { return num_windows_ / global_; }
  /// The G windows of step `step` (all ranks'), in rank order: rank r's are [r*G/W, (r+1)*G/W).
  std::vector<int64_t> global_ids(int64_t step);
  /// This rank's G/W windows of step `step`.
  std::vector<int64_t> local_ids(int64_t step);

 private:
  int64_t num_windows_, global_;
  uint64_t seed_;
  int rank_, world_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;  // the shuffle of epoch_
};

}  // namespace dp
