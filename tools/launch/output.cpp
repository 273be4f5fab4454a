#include "output.hpp"

#include <unistd.h>

#include <cerrno>

namespace ddp_launch {
namespace {
// A rank that prints megabytes without a newline (a progress bar drawn with '\r', a binary dump)
// must not make the launcher buffer without bound: past this size the line is cut and written.
constexpr std::size_t kMaxLine = 1 << 20;
constexpr std::string_view kOwnTag = "[rank ";
}  // namespace

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

void say(const std::string& line) { write_all(STDERR_FILENO, "ddp_launch: " + line + "\n"); }

void LineForwarder::feed(const char* data, std::size_t n) {
  pending_.append(data, n);
  std::size_t start = 0;
  for (std::size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    emit(std::string_view(pending_).substr(start, nl - start));
  }
  pending_.erase(0, start);
  if (pending_.size() >= kMaxLine) {
    emit(pending_);
    pending_.clear();
  }
}

void LineForwarder::finish() {
  if (!pending_.empty()) emit(pending_);
  pending_.clear();
}

// What a rank printed in the backend's words, not ours, for a classic mistake: a named hint, once per run.
static void hint_for(std::string_view line) {
  static bool said = false;
  if (said || line.find("op.preamble.length <= op.nbytes") == std::string_view::npos) return;
  said = true;
  say("hint [collective-mismatch]: Gloo received more bytes than this collective expects: the ranks issued "
      "collectives of different sizes, or in different orders (a hook that fired in another order on one rank, "
      "a bucket launched out of index order, ranks that built different models)");
}

void LineForwarder::emit(std::string_view line) {
  std::string out;
  const bool tagged = tag_.empty() || line.substr(0, kOwnTag.size()) == kOwnTag;
  out.reserve(line.size() + tag_.size() + 1);
  if (!tagged) out += tag_;
  out += line;
  out += '\n';
  write_all(fd_, out);  // one write per line: the launcher's output is flushed line by line
  hint_for(line);
}

}  // namespace ddp_launch
