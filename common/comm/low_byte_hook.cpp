#include "common/comm/low_byte_hook.hpp"

#include "common/base/errors.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

namespace dp {

BucketWork LowByteHook::launch(torch::Tensor& bucket, const std::string& label) {
  std::shared_future<void> done = worker_.submit([this, bucket, label]() mutable { reduce_.run(bucket, label); },
                                                 label.empty() ? "a bucket" : label);
  BucketWork w;  // no Work of its own: wait() goes straight to `then`, which waits for the worker
  w.then = [done] { done.get(); };
  w.wire_bytes = bucket.numel() * static_cast<int64_t>(bucket.element_size());
  return w;
}

CommHook low_byte_hook(std::shared_ptr<LowByteHook> state) {
  return
      [state](ProcessGroup&, torch::Tensor& bucket, const std::string& label) { return state->launch(bucket, label); };
}

// [check]
void check_low_byte_all_reduce(ProcessGroup& pg, const LowByteOptions& opts, const std::vector<int64_t>& sizes,
                               const std::string& what, uint64_t seed) {
  const int W = pg.world_size();
  int64_t outside = 0;
  bool same = true;
  uint64_t draw = seed * 1000003;
  for (int64_t n : sizes) {
    std::vector<torch::Tensor> all;  // every rank's buffer, drawn alike on every rank
    for (int k = 0; k < W; ++k) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(++draw);
      all.push_back(torch::randn({n}, gen) * (k + 1));
    }
    torch::Tensor mine = all[pg.rank()].clone();
    LowByteAllReduce(pg, opts).run(mine);
    same = same && torch::equal(mine, low_byte_average(all, opts));
    auto exact = torch::zeros_like(mine, torch::kDouble);
    for (const auto& x : all) exact += x.to(torch::kDouble) / W;
    outside += ((mine.to(torch::kDouble) - exact).abs() > low_byte_bound(all, opts.wire)).sum().item<int64_t>();
  }
  if (!same) throw CheckFailed(fmt::format("{}: the collective differs from its one-process model", what));
  if (opts.sum == SumIn::fp32 && outside > 0)
    throw CheckFailed(fmt::format("{}: {} values outside the derived bound of the exact average", what, outside));
}
// [check]

}  // namespace dp
