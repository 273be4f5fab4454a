// DP_FAULT=die@R, hang@R and misorder@R: what the hardening tests and docs/debugging.md provoke.
#include "common/fault.hpp"

#include "common/dist.hpp"
#include "common/runtime.hpp"

#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

namespace dp {

bool fault_requested(const std::string& action, int rank) {
  const char* f = std::getenv("DP_FAULT");
  if (!f || !*f) return false;
  const std::string spec = f;
  const auto at = spec.find('@');
  return at != std::string::npos && spec.substr(0, at) == action && std::atoi(spec.c_str() + at + 1) == rank;
}

void maybe_inject_fault(int rank) {
  for (const char* action : {"die", "hang"}) {
    if (!fault_requested(action, rank)) continue;
    fmt::print(stderr, "[rank {}/{}] DP_FAULT: {} now\n", log_rank(), log_world(), action);
    std::fflush(stderr);
    if (std::string(action) == "die") std::raise(SIGKILL);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

void maybe_inject_collective_fault(ProcessGroup& pg) {
  const char* f = std::getenv("DP_FAULT");
  if (f && std::string(f).rfind("missize@", 0) == 0) {  // every rank takes part; rank R with twice the elements
    const bool odd = fault_requested("missize", pg.rank());
    if (odd)
      fmt::print(stderr, "[rank {}/{}] DP_FAULT: missize: an all-reduce of 8 int64 where every other rank's has 4\n",
                 pg.rank(), pg.world_size());
    std::fflush(stderr);
    auto t = torch::zeros({odd ? 8 : 4}, torch::kInt64);
    pg.all_reduce(t, "DP_FAULT missize");
  }
  if (!fault_requested("misorder", pg.rank())) return;
  fmt::print(stderr, "[rank {}/{}] DP_FAULT: misorder: one extra broadcast that no other rank issues\n", pg.rank(),
             pg.world_size());
  std::fflush(stderr);
  auto t = torch::zeros({4}, torch::kInt64);
  pg.broadcast(t, 0, "DP_FAULT misorder");
}

}  // namespace dp
