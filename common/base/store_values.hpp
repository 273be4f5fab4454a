// c10d::Store holds bytes; the programs keep text in it (ids, counts, times). The two conversions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dp {

/// The characters of `s` as the bytes c10d::Store::set() and compareSet() take.
inline std::vector<uint8_t> store_bytes(const std::string& s) { return {s.begin(), s.end()}; }
/// What c10d::Store::get() or compareSet() returned, as text.
inline std::string store_text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

}  // namespace dp
