// Stage 01's checks of its rings (ring_allreduce.cpp): the answers against the library's, the times on a
// simulated link against ring_seconds().
#pragma once

#include "common/dist/dist.hpp"
#include "common/measure/results.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dp {

/// The tolerance of bench_rings(): a measured time may differ from ring_seconds()'s by this fraction.
inline constexpr double kRingTolerance = 0.15;

/// Runs every ring of ring_allreduce.cpp on 1,001 integer-valued floats (seeded by `seed` and the rank) and
/// compares each with the library's collective, bit for bit; prints what differs (with ring_mismatch_hint()'s
/// named hint). True on this rank when all agree. A collective.
bool check_rings(ProcessGroup& pg, uint64_t seed);

/// Times each ring at each of `sizes` on ddp_launch --net's link (DP_NET_BIT_S) beside ring_seconds(), prints
/// and records a row each in `results`; false when a time of 20 ms or more is off by over kRingTolerance.
/// A collective.
bool bench_rings(ProcessGroup& pg, const std::vector<std::string>& sizes, int warmup, int iters, double budget_s,
                 Results& results);

}  // namespace dp
