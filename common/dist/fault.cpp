// DP_FAULT=die@R, hang@R, orphan@R and misorder@R: what the hardening tests and docs/debugging.md provoke; and
// ACTION@SLOT:POINT, the faults of an elastic run (stage 09), each fired once in the run through its store.
#include "common/dist/fault.hpp"

#include "common/base/errors.hpp"
#include "common/base/log.hpp"
#include "common/base/store_values.hpp"
#include "common/base/timeline.hpp"
#include "common/dist/dist.hpp"
#include "common/dist/runtime.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <sstream>
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
  if (fault_requested("orphan", rank)) {  // a process left behind: `sleep 30` in this session, not waited for
    fmt::print(stderr, "{} DP_FAULT: orphan: leaving `sleep 30` running\n", log_tag());
    std::fflush(stderr);
    if (fork() == 0) {
      execlp("sleep", "sleep", "30", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  for (const char* action : {"die", "hang"}) {
    if (!fault_requested(action, rank)) continue;
    fmt::print(stderr, "{} DP_FAULT: {} now\n", log_tag(), action);
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

Faults::Faults(c10::intrusive_ptr<c10d::Store> store, std::string id, int slot, int restart)
    : store_(std::move(store)), id_(std::move(id)), slot_(slot), restart_(restart) {
  const char* spec = std::getenv("DP_FAULT");
  std::stringstream list(spec ? spec : "");
  for (std::string item; std::getline(list, item, ',');) {
    const auto at = item.find('@'), colon = item.find(':');
    Entry e;
    if (at != std::string::npos && colon != std::string::npos && colon > at)
      e = {item.substr(0, at), item.substr(at + 1, colon - at - 1), item.substr(colon + 1)};
    if (e.action != "die" && e.action != "stop" && e.action != "hang" && e.action != "pause")
      throw UsageError(
          fmt::format("DP_FAULT entry '{}' is not ACTION@SLOT:POINT with ACTION die, stop, hang or "
                      "pause (e.g. die@1:step10, stop@2:step8, die@*:heal)",
                      item));
    entries_.push_back(e);
  }
}

void Faults::at(const std::string& point) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.point != point) continue;
    if (e.slot != "*" && (restart_ != 0 || e.slot != std::to_string(slot_))) continue;
    if (store_text(store_->compareSet(fmt::format("fault/{}", i), {}, store_bytes(id_))) != id_)
      continue;  // fired already
    const double now = wall_seconds();
    if (e.action != "pause") store_->set("fault/time", store_bytes(fmt::format("{:.6f}", now)));  // a failure
    timeline::instant(fmt::format("DP_FAULT: {} at {}", e.action, point), now);
    fmt::print("{} DP_FAULT: {} at {}\n", log_tag(), e.action, point);  // stage 09: the launcher's tag, its slot
    std::fflush(stdout);
    if (e.action == "die") std::raise(SIGKILL);
    if (e.action == "stop") std::raise(SIGSTOP);
    if (e.action == "hang")
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    if (e.action == "pause") std::this_thread::sleep_for(std::chrono::duration<double>(kFaultPauseS));
  }
}

double Faults::last_fired() const {
  if (!store_->check({"fault/time"})) return -1;
  return std::stod(store_text(store_->get("fault/time")));
}

}  // namespace dp
