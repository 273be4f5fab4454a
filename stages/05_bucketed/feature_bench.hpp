// Stage 05's program: the check of the overlapped optimizer and the gradient-accumulation benchmark.
#pragma once

#include "common/ddp_bench.hpp"
#include "common/dist.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace dp {

/// Throws CheckFailed unless BucketedDdp::overlap_optimizer() with AdamW trains a small Transformer bit for
/// bit like one AdamW step after finish_gradient_synchronization() (arrival-order 1 kB buckets, 3 steps).
/// Prints a PASS line on rank 0. Collective.
void check_overlapped_optimizer(ProcessGroup& pg);

/// Times K micro-batches of cfg.global_batch sequences per AdamW step (the first K-1 under no_sync())
/// against K = 1 on cfg's Transformer, step by step interleaved; prints a line per K and returns them
/// (step time, time per sequence, collectives per step). Collective.
nlohmann::json bench_accumulation(ProcessGroup& pg, const BenchConfig& cfg, int K, double cap, const std::string& hook,
                                  BucketOrder order);

}  // namespace dp
