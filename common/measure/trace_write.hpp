// Writing a timeline (common/base/trace.hpp): every rank's events gathered to rank 0, one Chrome trace-event
// file that Perfetto and chrome://tracing open, one process per rank.
#pragma once

#include <string>

namespace dp {

class ProcessGroup;

namespace trace {

/// Gathers every rank's events to rank 0, which writes the Chrome trace-event JSON to `path`
/// (atomically). Collectives that overlap on one rank are spread over several communication lanes.
/// Every rank must call it; it ends the recording.
void write(ProcessGroup& pg, const std::string& path);

}  // namespace trace
}  // namespace dp
