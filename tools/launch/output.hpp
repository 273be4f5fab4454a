// Turning a rank's byte stream into whole, tagged lines on the launcher's stdout or stderr.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace ddp_launch {

// Writes all of `data` to `fd`, retrying short writes and EINTR. Returns false if the reader is gone
// (EPIPE) or another error occurred; output is then dropped, the ranks keep running.
bool write_all(int fd, std::string_view data);

// The launcher's own messages: "ddp_launch: <line>" on stderr.
void say(const std::string& line);

// Collects the bytes of one rank's stdout (or stderr) and emits each complete line with one write(),
// so lines of different ranks never interleave mid-line.
//
// Prefix rule: a line gets `tag` ("[rank r/W] ") in front unless the tag is empty (--no-prefix) or the
// line already begins with "[rank " -- the tutorial's programs tag their own lines, and tagging twice
// would only add noise.
class LineForwarder {
 public:
  LineForwarder(int out_fd, std::string tag) : fd_(out_fd), tag_(std::move(tag)) {}

  // Append bytes read from the rank's pipe; every line completed by them is written out at once.
  void feed(const char* data, std::size_t n);

  // End of stream: a last line without '\n' is written too (with a '\n' added).
  void finish();

 private:
  void emit(std::string_view line);  // `line` without its '\n'

  int fd_;
  std::string tag_;
  std::string pending_;  // the incomplete last line so far
};

}  // namespace ddp_launch
