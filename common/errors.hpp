// The two kinds of failure every program tells apart, by exit code: bad input (2) and a failed check (1).
#pragma once

#include <stdexcept>

namespace dp {

/// Bad input from the user (an option, an environment variable, a file). Programs exit with code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A self-check failed (results differ from the reference). Programs exit with code 1.
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace dp
