// Stage 05: which parameters share a bucket. A pure function, so it is unit-tested without ranks.
#pragma once

#include <cstdint>
#include <vector>

namespace dp {

/// Groups parameters into buckets of about `bucket_cap_mb` megabytes, 1 MB = 10^6 bytes (decimal,
/// like the CLI's "MB"; PyTorch's bucket_cap_mb means MiB, 2^20 bytes).
///
/// `param_bytes[i]` is the size of parameter i (in registration order) and `trainable[i]` whether it
/// gets a gradient. Parameters are taken in REVERSE registration order, because backward produces the
/// last layers' gradients first: the first bucket then fills, and can be sent, earliest. Frozen
/// parameters are skipped. A parameter joins the current bucket unless that would push the bucket past
/// the cap, in which case the bucket is closed and a new one started; a parameter is never split, so a
/// parameter larger than the cap gets a bucket of its own.
///
/// Returns the parameter indices of each bucket, bucket 0 first, each in the order they were added.
/// Throws dp::UsageError when bucket_cap_mb is not a positive finite number, std::invalid_argument
/// when the two vectors differ in length or a size is negative.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<int64_t>& param_bytes,
                                                const std::vector<bool>& trainable, double bucket_cap_mb);

}  // namespace dp
