// Timelines: what each rank's compute thread and its collectives did, as a Chrome trace-event file.
//
// A benchmark table says *how long* a step took; a timeline says *why*. With `--trace FILE` a training
// stage records, for every timed step, forward / backward / optimizer spans on the compute lane, an
// instant when each gradient or bucket is ready, and one span per collective from its launch to its
// completion (taken from the collective's own completion callback, not from whoever waited on it).
// Rank 0 gathers every rank's events and writes one JSON file (common/measure/trace_write.hpp) that Perfetto
// (ui.perfetto.dev) and chrome://tracing open, one process per rank; `scripts/trace/timeline.py` turns it into
// a PNG.
//
// Recording is off unless a program enabled it, and the hot path then costs one relaxed atomic load.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace dp::trace {

/// Starts collecting events in this process (timestamps count from now). Call it on every rank right
/// after a barrier, so that the ranks' time origins agree to within one barrier's latency.
void enable();
/// True between enable() and write(): a trace was asked for.
bool enabled();
/// Events are only kept while recording is on (benchmarks switch it on for timed steps only).
void set_recording(bool on);
/// True when events are being kept; check it before building labels for an event.
bool recording();

/// A span on the compute lane, from construction to destruction (forward, backward, optimizer, ...).
class Span {
 public:
  explicit Span(std::string name, nlohmann::json args = nullptr);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_;
  std::string name_;
  nlohmann::json args_;
  std::chrono::steady_clock::time_point t0_;
};

/// A point in time on the compute lane, e.g. "bucket 3 ready".
void instant(std::string name, nlohmann::json args = nullptr);

/// A collective launched now; returns an id for collective_done(), or -1 when not recording.
/// `what` names the operation ("all_reduce"), `label` what it carries ("bucket 2", a parameter name).
int64_t collective_launched(const std::string& what, const std::string& label, int64_t bytes);
/// The collective `id` completed now (may be called from a communication thread). Ignores -1.
void collective_done(int64_t id);

/// This rank's events so far as a JSON array ({name, ph, comm, ts, dur, args}, microseconds since
/// enable()); ends the recording. common/measure/trace_write.hpp gathers them from every rank into one file.
nlohmann::json take_events();

}  // namespace dp::trace
