#include "common/base/timeline.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

namespace dp {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace dp

namespace dp::timeline {

namespace {
std::ofstream out;  // this process's part; closed: nothing is recorded
std::string me;

void write(nlohmann::json e) {
  if (!out.is_open()) return;
  e["id"] = me;
  out << e.dump() << "\n";
  out.flush();  // a process may be killed at any moment: what it wrote must be on disk
}
}  // namespace

void open(const std::string& path, const std::string& id) {
  std::filesystem::create_directories(path + ".parts");
  me = id;
  out.open(path + ".parts/" + id + ".jsonl", std::ios::app);
}

void span(const std::string& name, double t0, double t1, nlohmann::json args) {
  write({{"name", name}, {"ph", "X"}, {"t", t0}, {"dur", t1 - t0}, {"args", std::move(args)}});
}

void instant(const std::string& name, double t, nlohmann::json args) {
  write({{"name", name}, {"ph", "i"}, {"t", t}, {"args", std::move(args)}});
}

void merge(const std::string& path) {
  std::vector<nlohmann::json> events;
  double first = 1e300;
  for (const auto& f : std::filesystem::directory_iterator(path + ".parts")) {
    std::ifstream in(f.path());
    for (std::string line; std::getline(in, line);) {
      try {
        events.push_back(nlohmann::json::parse(line));
        first = std::min(first, events.back().at("t").get<double>());
      } catch (const std::exception&) {  // the last line of a process killed while writing it
      }
    }
  }
  std::map<std::string, int> pid;  // "0.0" -> 0, ... in id order
  for (const auto& e : events) pid.emplace(e.at("id").get<std::string>(), 0);
  int n = 0;
  nlohmann::json trace = nlohmann::json::array();
  for (auto& [id, p] : pid) {
    p = n++;
    trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", p}, {"args", {{"name", "process " + id}}}});
  }
  for (const auto& e : events) {
    nlohmann::json t = {{"name", e.at("name")},
                        {"ph", e.at("ph")},
                        {"pid", pid.at(e.at("id").get<std::string>())},
                        {"tid", 0},
                        {"ts", (e.at("t").get<double>() - first) * 1e6},
                        {"args", e.at("args")}};
    if (e.contains("dur")) t["dur"] = e.at("dur").get<double>() * 1e6;
    if (t.at("ph") == "i") t["s"] = "p";
    trace.push_back(t);
  }
  std::ofstream(path) << nlohmann::json{{"traceEvents", trace}, {"displayTimeUnit", "ms"}}.dump(1) << "\n";
  std::filesystem::remove_all(path + ".parts");
}

}  // namespace dp::timeline
