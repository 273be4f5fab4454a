// Trace events in memory, gathered to rank 0 and written in Chrome's trace-event format
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU: "X" complete events,
// "i" instants, "M" metadata; timestamps in microseconds).
#include "common/base/trace.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace dp::trace {
namespace {

using Clock = std::chrono::steady_clock;

struct Event {
  std::string name;
  char ph = 'X';        // 'X' span, 'i' instant
  bool comm = false;    // communication lane (else compute)
  int64_t ts_us = 0;    // since the origin
  int64_t dur_us = -1;  // -1: a collective that has not completed yet
  nlohmann::json args;
};

std::atomic<bool> g_enabled{false}, g_recording{false};
std::mutex g_mu;
Clock::time_point g_origin;
std::vector<Event> g_events;

int64_t us_since_origin(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - g_origin).count();
}

void push(Event e) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_events.push_back(std::move(e));
}

}  // namespace

void enable() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_events.clear();
  g_origin = Clock::now();
  g_enabled = true;
}
bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_recording(bool on) { g_recording = on && enabled(); }
bool recording() { return g_recording.load(std::memory_order_relaxed); }

Span::Span(std::string name, nlohmann::json args) : on_(recording()) {
  if (!on_) return;
  name_ = std::move(name);
  args_ = std::move(args);
  t0_ = Clock::now();
}

Span::~Span() {
  if (!on_) return;
  const auto t1 = Clock::now();
  push({std::move(name_), 'X', false, us_since_origin(t0_),
        std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0_).count(), std::move(args_)});
}

void instant(std::string name, nlohmann::json args) {
  if (!recording()) return;
  push({std::move(name), 'i', false, us_since_origin(Clock::now()), 0, std::move(args)});
}

int64_t collective_launched(const std::string& what, const std::string& label, int64_t bytes) {
  if (!recording()) return -1;
  Event e{label.empty() ? what : what + " " + label,           'X', true, us_since_origin(Clock::now()), -1,
          {{"op", what}, {"carries", label}, {"bytes", bytes}}};
  std::lock_guard<std::mutex> lock(g_mu);
  g_events.push_back(std::move(e));
  return static_cast<int64_t>(g_events.size()) - 1;
}

void collective_done(int64_t id) {
  if (id < 0) return;
  const int64_t now = us_since_origin(Clock::now());
  std::lock_guard<std::mutex> lock(g_mu);
  // The first report wins: the backend's completion callback, or a wait() if the backend has no futures.
  if (id < static_cast<int64_t>(g_events.size()) && g_events[id].dur_us < 0)
    g_events[id].dur_us = std::max<int64_t>(0, now - g_events[id].ts_us);
}

nlohmann::json take_events() {
  set_recording(false);
  nlohmann::json evs = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    const int64_t now = us_since_origin(Clock::now());
    for (const auto& e : g_events) {
      // A collective still in flight now (none should be, after a finished step) ends at "now".
      const int64_t dur = e.dur_us < 0 ? now - e.ts_us : e.dur_us;
      evs.push_back({{"name", e.name},
                     {"ph", std::string(1, e.ph)},
                     {"comm", e.comm},
                     {"ts", e.ts_us},
                     {"dur", dur},
                     {"args", e.args}});
    }
    g_events.clear();
  }
  g_enabled = false;
  return evs;
}

}  // namespace dp::trace
