// A timeline of processes that may die (stage 09's --trace FILE): what every process did, on one clock,
// whether it lived to the end or not (common/base/trace.hpp records one process that lives to write its file).
// Each process appends its events to a file of its own as they happen (FILE.parts/<id>.jsonl, one
// flushed line per event), so a process killed mid-run leaves its events behind; the last generation's
// rank 0 merges them into one Chrome trace-event file (Perfetto, chrome://tracing; scripts/pages/plot.py
// draws it), one process per id ("1.0": slot 1's first process, "1.1": its replacement).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace dp {

/// Seconds since the epoch: the clock every process on this machine reads alike, which the timeline's
/// times (and a run's records of when a fault fired) are in.
double wall_seconds();

}  // namespace dp

namespace dp::timeline {

/// Starts recording for the process `id` into `path`.parts/ (nothing is recorded without it).
void open(const std::string& path, const std::string& id);
/// A span from `t0` to `t1` (seconds since the epoch: every process on this machine reads the same clock).
void span(const std::string& name, double t0, double t1, nlohmann::json args = nullptr);
/// A point in time: a fault fired, a failure seen.
void instant(const std::string& name, double t, nlohmann::json args = nullptr);
/// Merges every process's events into `path` (one process per id, time from the earliest event, in µs) and
/// removes the parts. Call it from one process once the others are done.
void merge(const std::string& path);

}  // namespace dp::timeline
