// Rank-aware printing: summaries from rank 0, `[rank r/W]` on per-rank lines.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <utility>

namespace dp {

/// Rank and world size used by the printing helpers (set once the process group exists): print0() prints
/// on rank 0, and per-rank lines are tagged `[rank r/W]` with them unless set_log_tag() chose another name.
void set_log_rank(int rank, int world_size);
int log_rank();
/// Tags this process's per-rank lines `[rank r/W]` with these from now on, whatever set_log_rank() says
/// later (a negative rank: the group's again). Stage 09 keeps the launcher's slot: a process's rank
/// changes with every generation it joins.
void set_log_tag(int rank, int world_size);
/// "[rank r/W]": how print_rank() and the error lines of run_main() begin.
std::string log_tag();

/// Prints a line from rank 0 only (summaries, tables, verdicts).
template <typename... Args>
void print0(fmt::format_string<Args...> f, Args&&... args) {
  if (log_rank() == 0) fmt::print("{}\n", fmt::format(f, std::forward<Args>(args)...)), std::fflush(stdout);
}
/// Prints a line from every rank, prefixed with `[rank r/W]`.
template <typename... Args>
void print_rank(fmt::format_string<Args...> f, Args&&... args) {
  fmt::print("{} {}\n", log_tag(), fmt::format(f, std::forward<Args>(args)...));
  std::fflush(stdout);
}

}  // namespace dp
