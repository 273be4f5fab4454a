// Reading the corpus, the train/validation split, and the world-size-free distributed sampler.
#include "stages/08_train_lm/corpus.hpp"

#include "common/dist/runtime.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dp {

namespace fs = std::filesystem;

static std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UsageError(fmt::format("cannot read corpus file {}", p.string()));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TextCorpus load_corpus(const std::string& path, int64_t batch, int64_t context) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw UsageError(
        fmt::format("--corpus {}: no such file or directory; install Debian's text with `apt-get "
                    "install fortunes` (scripts/setup/install_deps.sh does), or pass --corpus FILE|DIR",
                    path));
  TextCorpus c;
  std::string text;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file() && !e.is_symlink() && e.path().extension() != ".dat") files.push_back(e.path());
    if (files.empty())  // a folder of folders (they are not read): "too little text" would not say why
      throw UsageError(
          fmt::format("--corpus {}: no regular file directly in this folder (its subfolders, symbolic "
                      "links and *.dat files are not read); pass a file, or a folder of text files",
                      path));
    std::sort(files.begin(), files.end());  // a fixed order: the same tokens on every machine
    for (const auto& f : files) text += read_bytes(f);
    c.source = fmt::format("{} ({} files)", path, files.size());
  } else {
    if (!fs::is_regular_file(path, ec))  // /dev/zero would be read until memory runs out; /dev/stdin by every rank
      throw UsageError(
          fmt::format("--corpus {} is neither a regular file nor a folder; pass a file, or a folder of "
                      "text files",
                      path));
    text = read_bytes(path);
    c.source = path;
  }
  // Blocks of 4 KiB, every 20th held out: validation text comes from all over the corpus (a tail split
  // would hold out the last files only, which are about other things). A text under 20 blocks (80 KiB,
  // such as the single file fortunes/fortunes, 24 kB) is cut into 20 blocks instead, so it holds out 5% too.
  const auto n = static_cast<int64_t>(text.size());
  const int64_t block = std::clamp<int64_t>(n / TextCorpus::kValEvery, 1, TextCorpus::kBlock);
  auto all = torch::from_blob(text.data(), {n}, torch::kUInt8).to(torch::kLong);  // copies: text may go
  std::vector<torch::Tensor> train, val;
  for (int64_t b = 0, i = 0; b < n; b += block, ++i)
    (i % TextCorpus::kValEvery == TextCorpus::kValEvery - 1 ? val : train)
        .push_back(all.narrow(0, b, std::min(block, n - b)));
  c.train = train.empty() ? torch::empty({0}, torch::kLong) : torch::cat(train);
  c.val = val.empty() ? torch::empty({0}, torch::kLong) : torch::cat(val);
  // Training needs a batch of windows of context + 1 bytes (and one window more); validation at least one window.
  const int64_t need_train = (batch + 1) * (context + 1), need_val = context + 1;
  if (c.train.numel() < need_train || c.val.numel() < need_val)
    throw UsageError(
        fmt::format("--corpus {}: {} bytes of training text and {} held out, too little for --batch {} "
                    "and --context {} (needs {} and {}); pass a larger --corpus, or a smaller --batch or "
                    "--context",
                    c.source, c.train.numel(), c.val.numel(), batch, context, need_train, need_val));
  return c;
}

int64_t window_count(const torch::Tensor& tokens, int64_t context) {
  return std::max<int64_t>(0, (tokens.numel() - 1) / context);
}

std::pair<torch::Tensor, torch::Tensor> windows(const torch::Tensor& tokens, const std::vector<int64_t>& ids,
                                                int64_t context, torch::Device device) {
  std::vector<torch::Tensor> rows;
  rows.reserve(ids.size());
  for (int64_t j : ids) rows.push_back(tokens.narrow(0, j * context, context + 1));
  // Stacked on the host, then one copy of n (T+1) int64 to the device (none on the CPU: to() returns w).
  auto w = torch::stack(rows).to(device);                                               // [n, T+1]
  return {w.narrow(1, 0, context).contiguous(), w.narrow(1, 1, context).contiguous()};  // [n, T] each
}

DistributedSampler::DistributedSampler(int64_t num_windows, int64_t global_batch, uint64_t seed, int rank,
                                       int world_size)
    : num_windows_(num_windows), global_(global_batch), seed_(seed), rank_(rank), world_(world_size) {
  if (global_batch <= 0 || global_batch % world_size != 0)
    throw UsageError(
        fmt::format("--batch {} is not a positive multiple of the world size {}: every rank must get "
                    "as many sequences as the others; use a multiple of {}",
                    global_batch, world_size, world_size));
  if (global_batch > num_windows)
    throw UsageError(
        fmt::format("--batch {} is larger than the {} training sequences of the corpus; use a smaller "
                    "--batch or --context",
                    global_batch, num_windows));
}

// [sampler]
std::vector<int64_t> DistributedSampler::global_ids(int64_t step) {
  const int64_t epoch = step / steps_per_epoch(), k = step % steps_per_epoch();
  if (epoch != epoch_) {
    // A generator of its own, seeded by (seed, epoch): the shuffle does not depend on what else drew
    // random numbers, nor on the world size.
    auto gen = at::detail::createCPUGenerator(seed_ * 1000003ull + static_cast<uint64_t>(epoch) + 1);
    auto p = torch::randperm(num_windows_, gen, torch::kLong);
    perm_.assign(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + num_windows_);
    epoch_ = epoch;
  }
  return {perm_.begin() + k * global_, perm_.begin() + (k + 1) * global_};
}

std::vector<int64_t> DistributedSampler::local_ids(int64_t step) {
  auto ids = global_ids(step);
  const int64_t per_rank = global_ / world_;
  return {ids.begin() + rank_ * per_rank, ids.begin() + (rank_ + 1) * per_rank};
}
// [sampler]

}  // namespace dp
