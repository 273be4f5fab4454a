// A checksum over bytes (checkpoint files carry one, and two ranks compare their parameters by one), and a mixer
// that turns nearby integers into unrelated generator seeds.
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

/// SplitMix64's finaliser: spreads nearby integers (steps 0, 1, 2; buckets 0, 1, 2) over all 64 bits, so that
/// seeds built from them (seed ^ splitmix64(step)) give unrelated generator streams, where seed + step would make
/// (seed 1, step 0) replay (seed 0, step 1).
inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace dp
