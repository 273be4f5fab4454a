// Threads as ranks: PyTorch's own C++ c10d tests run every rank as a thread of one process, joined
// through an in-process store. Fast, no ports, and a failing rank fails the test.
#pragma once

#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <chrono>
#include <functional>
#include <mutex>

namespace dp::testing {

/// Runs fn(pg) on `world` threads, each rank `r` of one Gloo group over an in-process store, its tensors
/// on `device` ("cpu", or "cuda": every rank on the one GPU, as DistOptions::device says).
/// The collective timeout turns a stuck or dead rank into an exception instead of a hang; the first
/// exception thrown on any rank is rethrown here after all threads ended.
void run_ranks(int world, const std::function<void(ProcessGroup&)>& fn,
               std::chrono::milliseconds timeout = std::chrono::milliseconds(20000), const std::string& device = "");

/// True when this build has CUDA and a GPU is visible (the GPU tests skip otherwise, saying so).
bool gpu_visible();

/// torch's global RNG is shared by the threads: hold this while seeding and building a model. It is
/// dp::model_init_mutex() (common/model/models.hpp), the mutex the DDP checks hold for the same reason.
std::mutex& rng_mutex();

/// True when `t` is bit-identical on every rank (a collective: every rank must call it).
bool same_on_all_ranks(ProcessGroup& pg, const torch::Tensor& t);

}  // namespace dp::testing
