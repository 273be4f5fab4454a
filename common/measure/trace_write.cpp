// Gathers every rank's trace events to rank 0 and writes one Chrome trace-event file.
#include "common/measure/trace_write.hpp"

#include "common/base/trace.hpp"
#include "common/dist/dist.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace dp::trace {
namespace {

// Collectives may overlap (several in flight during backward); a trace viewer wants the spans of one
// thread lane properly nested, so each collective goes to the first communication lane that is free.
nlohmann::json to_chrome(const std::vector<nlohmann::json>& per_rank) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const int pid = static_cast<int>(r);
    out.push_back(
        {{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    out.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    std::vector<nlohmann::json> comm;
    for (const auto& e : per_rank[r]) {
      nlohmann::json ev = {{"name", e["name"]}, {"ph", e["ph"]}, {"ts", e["ts"]}, {"pid", pid}, {"tid", 0}};
      if (!e["args"].is_null()) ev["args"] = e["args"];
      if (e["ph"] == "i") ev["s"] = "t";  // an instant on its thread
      if (e["ph"] == "X") ev["dur"] = e["dur"];
      if (e["comm"].get<bool>())
        comm.push_back(ev);
      else
        out.push_back(ev);
    }
    std::sort(comm.begin(), comm.end(), [](const auto& a, const auto& b) { return a["ts"] < b["ts"]; });
    std::vector<int64_t> lane_free_at;  // per lane: end of its last span
    for (auto& ev : comm) {
      const int64_t ts = ev["ts"], end = ts + ev["dur"].get<int64_t>();
      size_t lane = 0;
      while (lane < lane_free_at.size() && lane_free_at[lane] > ts) ++lane;
      if (lane == lane_free_at.size()) {
        lane_free_at.push_back(0);
        out.push_back({{"ph", "M"},
                       {"name", "thread_name"},
                       {"pid", pid},
                       {"tid", lane + 1},
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

void write(ProcessGroup& pg, const std::string& path) {
  const std::string mine = take_events().dump();
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
    per_rank.push_back(nlohmann::json::parse(
        std::string(reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>()), static_cast<size_t>(lengths[r]))));
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
