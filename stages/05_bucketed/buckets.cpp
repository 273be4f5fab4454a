#include "stages/05_bucketed/buckets.hpp"

#include "common/dist/runtime.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <utility>  // std::exchange

namespace dp {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<int64_t>& param_bytes,
                                                const std::vector<bool>& trainable, double bucket_cap_mb) {
  if (!std::isfinite(bucket_cap_mb) || bucket_cap_mb <= 0)
    throw UsageError(
        fmt::format("bucket size must be a positive number of MB (1 MB = 10^6 bytes), got {}", bucket_cap_mb));
  if (param_bytes.size() != trainable.size())
    throw std::invalid_argument("assign_buckets: param_bytes and trainable differ in length");

  // [exercise 05.1: cut the parameters into buckets of at most the cap, last registered first]
  // [assign]
  const double cap_bytes = bucket_cap_mb * 1e6;
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> current;
  double current_bytes = 0;
  for (size_t k = param_bytes.size(); k-- > 0;) {  // last registered parameter first
    if (param_bytes[k] < 0) throw std::invalid_argument("assign_buckets: negative parameter size");
    if (!trainable[k]) continue;  // frozen: no gradient to send
    const double bytes = static_cast<double>(param_bytes[k]);
    if (!current.empty() && current_bytes + bytes > cap_bytes) {  // would overflow: close this bucket
      buckets.push_back(std::exchange(current, {}));
      current_bytes = 0;
    }
    current.push_back(k);  // an empty bucket takes any parameter, even one larger than the cap
    current_bytes += bytes;
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  // [assign]
  return buckets;
  // [/exercise 05.1]
}

}  // namespace dp
