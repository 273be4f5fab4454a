#include "extensions/05b_arrival_order/arrival_order_ddp.hpp"

#include "common/dist/runtime.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dp {

std::vector<std::vector<size_t>> assign_buckets_in_order(const std::vector<size_t>& order,
                                                         const std::vector<int64_t>& param_bytes, double bucket_cap_mb,
                                                         int64_t first_bucket_cap_bytes) {
  if (!std::isfinite(bucket_cap_mb) || bucket_cap_mb <= 0)
    throw UsageError(
        fmt::format("bucket size must be a positive number of MB (1 MB = 10^6 bytes), got {}", bucket_cap_mb));
  const double cap_bytes = bucket_cap_mb * 1e6;
  std::vector<char> seen(param_bytes.size(), 0);
  // [assign_in_order]
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> current;
  double current_bytes = 0;
  for (size_t k : order) {
    if (k >= param_bytes.size() || seen[k])
      throw std::invalid_argument("assign_buckets_in_order: bad or repeated index");
    seen[k] = 1;
    // A small first bucket: it is full, and on the wire, after the first few gradients of backward.
    const double cap = buckets.empty() ? std::min(cap_bytes, static_cast<double>(first_bucket_cap_bytes)) : cap_bytes;
    const double bytes = static_cast<double>(param_bytes[k]);
    if (!current.empty() && current_bytes + bytes > cap) {
      buckets.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(k);
    current_bytes += bytes;
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  // [assign_in_order]
  return buckets;
}

void ArrivalOrderDdp::gradient_copied(size_t param) {
  if (!rebuilt_) arrival_.push_back(param);
}

// At the end of the first finish_gradient_synchronization() that synchronized anything, on every rank (the
// same step on every rank), with no collective in flight.
void ArrivalOrderDdp::after_synchronization() {
  if (rebuilt_) return;
  std::vector<int64_t> bytes;
  size_t trainable = 0;
  for (const auto& p : parameters()) {
    bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
    trainable += p.requires_grad() ? 1 : 0;
  }
  if (arrival_.size() != trainable)
    throw std::logic_error(fmt::format("ArrivalOrderDdp: recorded {} gradients in arrival order, expected {}",
                                       arrival_.size(), trainable));
  // [rebuild]
  // Each rank recorded its own order. Autograd's order need not be the same on every rank (it follows
  // the engine's ready queue, which threads and devices can reorder), but the buckets must be: a rank that
  // launched a different bucket k would have Gloo add unrelated gradients. So every rank takes rank 0's
  // order: [number of trainable parameters] int64 indices into parameters(), broadcast once.
  ProcessGroup& pg = process_group();
  std::vector<int64_t> mine(arrival_.begin(), arrival_.end());
  auto order = torch::tensor(mine, torch::kInt64).to(pg.device());
  pg.broadcast(order, 0, "bucket order");
  order = order.cpu();
  std::vector<size_t> agreed(static_cast<size_t>(order.numel()));
  for (size_t k = 0; k < agreed.size(); ++k) agreed[k] = static_cast<size_t>(order[k].item<int64_t>());
  reassign(assign_buckets_in_order(agreed, bytes, bucket_cap_mb()));  // first bucket at most 1 MiB
  // [rebuild]
  arrival_.clear();
  rebuilt_ = true;
}

}  // namespace dp
