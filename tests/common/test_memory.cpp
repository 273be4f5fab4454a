// Unit tests for common/memory: tensor bytes, optimizer state bytes, training bytes and the RSS probes.
#include "common/measure/memory.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

namespace optim = torch::optim;

TEST(Memory, TensorBytesCountEveryDefinedTensor) {
  EXPECT_EQ(dp::tensor_bytes({torch::zeros({10}), torch::zeros({2, 3}, torch::kFloat64), torch::Tensor()}),
            4 * 10 + 8 * 6);
  EXPECT_EQ(dp::tensor_bytes({}), 0);
}

TEST(Memory, TrainingBytesOfTiedModelWithAdamW) {
  auto model = dp::make_toy_model("tied");  // 4 distinct tensors, 1350 floats, the tied one listed twice
  optim::AdamW opt(dp::unique_parameters(*model), optim::AdamWOptions(0.1));
  auto before = dp::count_training_bytes(*model, opt);
  EXPECT_EQ(before.params, 4 * 1350);
  EXPECT_EQ(before.grads, 0);  // no backward yet
  EXPECT_EQ(before.state, 0);  // AdamW allocates its state in the first step
  model->forward(torch::rand({4, 10})).sum().backward();
  opt.step();
  auto after = dp::count_training_bytes(*model, opt);
  EXPECT_EQ(after.grads, 4 * 1350);
  EXPECT_EQ(after.state, 8 * 1350);  // exp_avg and exp_avg_sq
  EXPECT_EQ(after.total(), 16 * 1350);
  EXPECT_EQ(dp::optimizer_state_bytes(opt), after.state);
}

TEST(Memory, ResidentSetProbes) {
  EXPECT_GT(dp::peak_rss_bytes(), 0);
  EXPECT_GT(dp::current_rss_bytes(), 0);
  EXPECT_GE(dp::peak_rss_bytes(), dp::current_rss_bytes());
  const int64_t base = dp::current_rss_bytes();
  { auto big = torch::ones({50'000'000}); }  // 200 MB touched, then freed (mmap'ed: back to the OS)
  const int64_t high = dp::peak_rss_bytes();
  EXPECT_GE(high, base + 190'000'000);
#ifndef __SANITIZE_ADDRESS__  // AddressSanitizer keeps freed blocks in its quarantine, resident
  if (dp::reset_peak_rss()) {
    EXPECT_LT(dp::peak_rss_bytes(), high - 100'000'000);  // the peak forgot it
  }
#endif
  EXPECT_EQ(dp::cuda_peak_allocated_bytes(torch::kCPU), 0);  // no CUDA peak for a CPU device
  dp::reset_cuda_peak(torch::kCPU);
}

// DP_AVAILABLE_MEMORY_BYTES stands in for /proc/meminfo (the memory refusals' tests use it); anything but a
// whole number of bytes above 0 is refused by name, and check_fits_in_memory() refuses against it.
TEST(Memory, AvailableMemoryStandIn) {
  ::unsetenv("DP_AVAILABLE_MEMORY_BYTES");
  const int64_t real = dp::available_memory_bytes();
  EXPECT_GT(real, 0);  // Linux has had MemAvailable since 3.14
  ::setenv("DP_AVAILABLE_MEMORY_BYTES", "24000000000", 1);
  EXPECT_EQ(dp::available_memory_bytes(), 24'000'000'000);
  EXPECT_THROW(dp::check_fits_in_memory(13e9, 2, "two ranks", "use fewer"), dp::UsageError);  // 26 GB > 24
  EXPECT_NO_THROW(dp::check_fits_in_memory(11e9, 2, "two ranks", "use fewer"));               // 22 GB
  const dp::MemoryPool pool = dp::memory_pool(3, /*on_gpu=*/false);  // this machine's, shared by its 3 ranks
  EXPECT_EQ(pool.available, 24e9);
  EXPECT_EQ(pool.ranks, 3);
  EXPECT_EQ(pool.where, "this machine");
  for (const char* bad : {"24GB", "", "-1", "0", "1e9", "99999999999999999999"}) {
    ::setenv("DP_AVAILABLE_MEMORY_BYTES", bad, 1);
    try {
      dp::available_memory_bytes();
      ADD_FAILURE() << "accepted DP_AVAILABLE_MEMORY_BYTES=" << bad;
    } catch (const dp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("DP_AVAILABLE_MEMORY_BYTES=") + bad + ":"), std::string::npos)
          << e.what();
    }
  }
  ::unsetenv("DP_AVAILABLE_MEMORY_BYTES");
  EXPECT_GT(dp::available_memory_bytes(), 0);
}

}  // namespace
