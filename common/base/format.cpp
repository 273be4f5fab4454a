// Thousands separators, byte counts with decimal units, the first line of an error.
#include "common/base/format.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cmath>

namespace dp {

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int i = 0;
  while (bytes >= 1000 && i < 4) {
    bytes /= 1000;
    ++i;
  }
  return bytes == std::floor(bytes) ? fmt::format("{:.0f} {}", bytes, units[i])
                                    : fmt::format("{:.3g} {}", bytes, units[i]);
}

std::string lowercase(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string count_of(int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string first_line(const std::string& what) {
  const auto nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kBFloat16: return "bfloat16";
    case c10::kFloat: return "float32";
    case c10::kHalf: return "float16";
    default: return c10::toString(t);
  }
}

}  // namespace dp
