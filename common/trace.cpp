// Trace events in memory, gathered to rank 0 and written in Chrome's trace-event format
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU: "X" complete events,
// "i" instants, "M" metadata; timestamps in microseconds).
#include "common/trace.hpp"

#include "common/dist.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace dp::trace {
namespace {

using Clock = std::chrono::steady_clock;

struct Event {
  std::string name;
  char ph = 'X';          // 'X' span, 'i' instant
  bool comm = false;      // communication lane (else compute)
  int64_t ts_us = 0;      // since the origin
  int64_t dur_us = -1;    // -1: a collective that has not completed yet
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

// Collectives may overlap (several in flight during backward); a trace viewer wants the spans of one
// thread lane properly nested, so each collective goes to the first communication lane that is free.
nlohmann::json to_chrome(const std::vector<nlohmann::json>& per_rank) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const int pid = static_cast<int>(r);
    out.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    out.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    std::vector<nlohmann::json> comm;
    for (const auto& e : per_rank[r]) {
      nlohmann::json ev = {{"name", e["name"]}, {"ph", e["ph"]}, {"ts", e["ts"]}, {"pid", pid}, {"tid", 0}};
      if (!e["args"].is_null()) ev["args"] = e["args"];
      if (e["ph"] == "i") ev["s"] = "t";  // an instant on its thread
      if (e["ph"] == "X") ev["dur"] = e["dur"];
      if (e["comm"].get<bool>()) comm.push_back(ev);
      else out.push_back(ev);
    }
    std::sort(comm.begin(), comm.end(), [](const auto& a, const auto& b) { return a["ts"] < b["ts"]; });
    std::vector<int64_t> lane_free_at;  // per lane: end of its last span
    for (auto& ev : comm) {
      const int64_t ts = ev["ts"], end = ts + ev["dur"].get<int64_t>();
      size_t lane = 0;
      while (lane < lane_free_at.size() && lane_free_at[lane] > ts) ++lane;
      if (lane == lane_free_at.size()) {
        lane_free_at.push_back(0);
        out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", lane + 1},
                       {"args", {{"name", "communication " + std::to_string(lane + 1)}}}});
      }
      lane_free_at[lane] = end;
      ev["tid"] = lane + 1;
      out.push_back(ev);
    }
  }
  return out;
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
  Event e{label.empty() ? what : what + " " + label, 'X', true, us_since_origin(Clock::now()), -1,
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

void write(ProcessGroup& pg, const std::string& path) {
  set_recording(false);
  std::string mine;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    nlohmann::json evs = nlohmann::json::array();
    const int64_t now = us_since_origin(Clock::now());
    for (const auto& e : g_events) {
      // A collective still in flight now (none should be, after a finished step) ends at "now".
      const int64_t dur = e.dur_us < 0 ? now - e.ts_us : e.dur_us;
      evs.push_back({{"name", e.name}, {"ph", std::string(1, e.ph)}, {"comm", e.comm}, {"ts", e.ts_us},
                     {"dur", dur}, {"args", e.args}});
    }
    mine = evs.dump();
    g_events.clear();
  }
  g_enabled = false;
  // Gather the serialized events: lengths first, then equal-length (padded) byte tensors.
  const auto lengths = pg.all_gather(static_cast<double>(mine.size()));
  const int64_t longest = static_cast<int64_t>(*std::max_element(lengths.begin(), lengths.end()));
  auto buf = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(buf.data_ptr<uint8_t>(), mine.data(), mine.size());
  auto all = pg.all_gather(buf.to(pg.device()));
  if (pg.rank() != 0) return;
  std::vector<nlohmann::json> per_rank;
  for (size_t r = 0; r < all.size(); ++r) {
    auto cpu = all[r].cpu();
    per_rank.push_back(nlohmann::json::parse(std::string(reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>()),
                                                         static_cast<size_t>(lengths[r]))));
  }
  nlohmann::json doc = {{"traceEvents", to_chrome(per_rank)}, {"displayTimeUnit", "ms"}};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw std::runtime_error("cannot write the trace to " + tmp);
    f << doc.dump() << "\n";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

}  // namespace dp::trace
