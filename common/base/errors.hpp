// The kinds of failure every program tells apart: bad input (exit 2), a failed check (exit 1), a run that
// cannot go on (exit 3: an elastic run with nothing to go on from), and in the workbook (docs/workbook.md)
// an exercise not written yet (exit 1).
#pragma once

#include <stdexcept>
#include <string>

namespace dp {

/// Bad input from the user (an option, an environment variable, a file). Programs exit with code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A self-check failed (results differ from the reference). Programs exit with code 1.
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The run cannot go on, and another process in its place could not either (stage 09: nobody holds the
/// state and there is no checkpoint to load). Programs exit with kCannotContinueCode; ddp_launch --elastic
/// starts no replacement for a rank that exits with it.
struct CannotContinue : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline constexpr int kCannotContinueCode = 3;

/// Thrown by the workbook's stubs (scripts/course/workbook.py writes them in place of a stage's exercise regions):
/// the exercise `id` ("02.1") is not written yet. One line, so a failing test shows all of it: what to
/// write, where the page explains it, a hint.
struct NotImplemented : std::logic_error {
  NotImplemented(const std::string& id, const std::string& title, const std::string& read, const std::string& hint)
      : std::logic_error("NotImplemented: workbook exercise " + id + " (" + title + ") is not written yet; read " +
                         read + "; hint: " + hint) {}
};

}  // namespace dp
