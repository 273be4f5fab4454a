// Rank-aware printing: summaries from rank 0, `[rank r/W]` on per-rank lines.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <utility>

namespace dp {

/// Rank and world size used by the printing helpers (set once the process group exists).
void set_log_rank(int rank, int world_size);
int log_rank();
int log_world();

/// Prints a line from rank 0 only (summaries, tables, verdicts).
template <typename... Args>
void print0(fmt::format_string<Args...> f, Args&&... args) {
  if (log_rank() == 0) fmt::print("{}\n", fmt::format(f, std::forward<Args>(args)...)), std::fflush(stdout);
}
/// Prints a line from every rank, prefixed with `[rank r/W]`.
template <typename... Args>
void print_rank(fmt::format_string<Args...> f, Args&&... args) {
  fmt::print("[rank {}/{}] {}\n", log_rank(), log_world(), fmt::format(f, std::forward<Args>(args)...));
  std::fflush(stdout);
}

}  // namespace dp
