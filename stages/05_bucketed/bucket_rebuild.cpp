// BucketedDdp with BucketOrder::arrival: after the first synchronized step, the buckets are rebuilt in the
// order the gradients became ready in it (what PyTorch's Reducer does after its first iteration).
#include "stages/05_bucketed/bucketed_ddp.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dp {

// Called at the end of the first finish_gradient_synchronization() that synchronized anything, on every
// rank (the same step on every rank), with the mutex held and no collective in flight.
void BucketedDdp::rebuild_in_arrival_order() {
  if (arrival_.size() != hooked_.size())
    throw std::logic_error(fmt::format("BucketedDdp: recorded {} gradients in arrival order, expected {}",
                                       arrival_.size(), hooked_.size()));
  // [rebuild]
  // Each rank recorded its own order. Autograd's order need not be the same on every rank (it follows
  // the engine's ready queue, which threads and devices can reorder), but the buckets must be: a rank that
  // launched a different bucket k would have Gloo add unrelated gradients. So every rank takes rank 0's
  // order: [number of trainable parameters] int64 indices into parameters(), broadcast once.
  std::vector<int64_t> mine(arrival_.begin(), arrival_.end());
  auto order = torch::tensor(mine, torch::kInt64).to(pg_.device());
  pg_.broadcast(order, 0, "bucket order");
  order = order.cpu();
  std::vector<size_t> agreed(static_cast<size_t>(order.numel()));
  for (size_t k = 0; k < agreed.size(); ++k) agreed[k] = static_cast<size_t>(order[k].item<int64_t>());

  std::vector<int64_t> bytes;
  for (auto& p : params_) bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
  assignment_ = assign_buckets_in_order(agreed, bytes, cap_mb_);  // first bucket at most 1 MiB
  build_buffers();
  // [rebuild]
  arrival_.clear();
  rebuilt_ = true;
}

}  // namespace dp
