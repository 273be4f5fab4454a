// A checksum over bytes: checkpoint files carry one, and two ranks compare their parameters by one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dp {

/// FNV-1a's 64-bit offset basis: the hash of no bytes.
constexpr uint64_t kFnv1a64Basis = 0xcbf29ce484222325ULL;

/// The 64-bit FNV-1a hash of `n` bytes, continuing from `h`: hashing two pieces one after the other
/// (the first result passed as `h`) gives the hash of their concatenation. Not cryptographic: it finds
/// accidents (a flipped bit, a truncated copy), not tampering.
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv1a64Basis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h = (h ^ p[i]) * 0x100000001b3ULL;  // FNV's 64-bit prime
  }
  return h;
}

}  // namespace dp
