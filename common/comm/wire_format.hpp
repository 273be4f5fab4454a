// How numbers travel when they travel in fewer bytes. A wire format turns fp32 values into
// bytes and back: bf16 or fp16 (2 bytes a value, each rounded to nearest) or block-quantized int8 (1 byte a
// value plus one fp32 scale per block of B values, the scales packed in front of the payload in the same
// byte buffer, so that one collective carries both). Every buffer here is uint8: the collectives only move
// bytes, so a backend that cannot sum bf16 (Gloo in LibTorch 1.13) still carries it.
#pragma once

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dp {

/// What one value costs on the wire.
enum class WireFormat {
  fp32,  ///< 4 bytes, exact
  bf16,  ///< 2 bytes, 8 significant bits: relative error at most 2^-8 per rounding, fp32's range
  fp16,  ///< 2 bytes, 11 significant bits: relative error at most 2^-11, but |x| < 65504 and subnormals below 2^-14
  int8,  ///< 1 byte + 4 bytes per block: x = q x scale, q in [-127, 127], scale = max |x| over the block / 127
};

/// A format and, for int8, its block length.
struct WireSpec {
  WireFormat format = WireFormat::fp32;
  int64_t block = 256;  ///< int8: values per scale (the scale adds 4 / block bytes per value)

  /// "fp32", "bf16", "fp16" or "int8" (with the block: "int8/256").
  std::string name() const;
  /// Values a buffer's length must be a multiple of: `block` for int8, else 1.
  int64_t granule() const { return format == WireFormat::int8 ? block : 1; }
  /// Bytes that `n` values take on the wire (n a multiple of granule()).
  int64_t bytes(int64_t n) const;
  /// The unit roundoff u: one rounding moves a value x by at most u |x| (bf16 2^-8, fp16 2^-11, fp32 2^-24);
  /// 0 for int8, whose error is absolute (int8_error_bound()).
  double unit_roundoff() const;
};

/// The formats' names, as `parse_wire_format` takes them.
std::vector<std::string> wire_format_names();

/// "fp32", "bf16", "fp16" or "int8" with `block` values per scale. Throws dp::UsageError naming the value and
/// the choices for another name, or a block that is not positive.
WireSpec parse_wire_format(const std::string& name, int64_t block = 256);

/// Encodes `x` (fp32, contiguous, [n], n a multiple of spec.granule()) into `out` (uint8, [spec.bytes(n)]).
/// int8: out holds n / block fp32 scales, then n int8 values; a block of zeros gets scale 0.
void encode(const WireSpec& spec, const torch::Tensor& x, torch::Tensor out);

/// Decodes `in` (uint8, [spec.bytes(n)]) into `out` (fp32, contiguous, [n]).
void decode(const WireSpec& spec, const torch::Tensor& in, torch::Tensor out);

/// One rounding through the format: decode(encode(x)), a new fp32 tensor.
torch::Tensor round_trip(const WireSpec& spec, const torch::Tensor& x);

/// What one rounding through `spec` may move each value of `x` by, at most (fp32 [n]): u |x| plus, for fp16, half
/// its smallest subnormal step (2^-25); for int8, half a step of the value's block: max |x| over the block / 254.
torch::Tensor rounding_bound(const WireSpec& spec, const torch::Tensor& x);

}  // namespace dp
