// Extension 05b, on stage 05: buckets rebuilt in the order gradients arrive. Stage 05 fills buckets in
// reverse registration order, a guess at the order backward produces gradients; a parameter registered
// late but used early (or a tied weight) breaks the guess, and its bucket waits. PyTorch's Reducer records
// the real order during the first iteration and rebuilds its buckets once; ArrivalOrderDdp does the same
// through stage 05's seams (gradient_copied(), after_synchronization(), reassign()).
#pragma once

#include "common/dist/dist.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace dp {

/// PyTorch's cap on the first bucket once buckets follow the order gradients arrive: 1 MiB (2^20 bytes).
constexpr int64_t kFirstBucketCapBytes = int64_t{1} << 20;

/// Groups the parameters listed in `order` (indices into `param_bytes`, in the order their gradients
/// became ready) into buckets in that order: the same greedy rule as assign_buckets(), except that the
/// first bucket is closed at min(first_bucket_cap_bytes, bucket_cap_mb * 10^6) bytes, so that the first
/// all-reduce can start early in backward. Parameters not in `order` get no bucket.
/// Throws dp::UsageError for a bad cap (as assign_buckets()), std::invalid_argument when an index is out
/// of range or listed twice.
std::vector<std::vector<size_t>> assign_buckets_in_order(const std::vector<size_t>& order,
                                                         const std::vector<int64_t>& param_bytes, double bucket_cap_mb,
                                                         int64_t first_bucket_cap_bytes = kFirstBucketCapBytes);

/// BucketedDdp whose buckets, after the first synchronized step, are rebuilt once in the order the
/// gradients became ready during it (rank 0's order, broadcast, so that every rank agrees), with the
/// first bucket capped at kFirstBucketCapBytes (1 MiB), as PyTorch's Reducer does. Used like BucketedDdp.
class ArrivalOrderDdp : public BucketedDdp {
 public:
  ArrivalOrderDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> module, double bucket_cap_mb)
      : BucketedDdp(pg, std::move(module), bucket_cap_mb) {}
  /// True once the buckets were rebuilt (after the first synchronized step); buckets(), bucket_count()
  /// and calls_per_step() then describe the new buckets.
  bool buckets_rebuilt() const { return rebuilt_; }

 protected:
  void gradient_copied(size_t param) override;  // records the arrival order until the rebuild
  void after_synchronization() override;        // the first time: agree on rank 0's order and rebuild

 private:
  bool rebuilt_ = false;
  std::vector<size_t> arrival_;  // parameters in the order their gradients were ready (first step)
};

}  // namespace dp
