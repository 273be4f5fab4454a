// Numbers and words as people read and write them: thousands separators, byte counts with units, counts
// of things ("1 rank", "2 ranks"), lower case for matching option values, and the first line of an
// exception's text.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace dp {

/// Formats an integer with thousands separators: 1998235200 -> "1,998,235,200".
std::string with_commas(int64_t n);

/// Formats bytes with a decimal unit ("100 MB", "1.5 GB"; 1 MB = 10^6 B).
std::string format_bytes(double bytes);

/// `s` in ASCII lower case: option values such as units and preset names are matched case-insensitively.
std::string lowercase(std::string s);

/// `n` and a noun, singular for one: (1, "rank") -> "1 rank", (2, "rank") -> "2 ranks" (nouns that take -s).
std::string count_of(int64_t n, const std::string& noun);

/// "float32", "bfloat16", "float16" (ATen's name for the others): how checks and tables name a dtype.
std::string dtype_name(c10::ScalarType t);

/// The first line of `what`: c10d and Gloo put backtraces after it, which users need not read.
std::string first_line(const std::string& what);

}  // namespace dp
