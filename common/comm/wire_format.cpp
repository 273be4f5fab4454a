#include "common/comm/wire_format.hpp"

#include "common/base/errors.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace dp {

namespace {

torch::ScalarType dtype_of(WireFormat f) { return f == WireFormat::bf16 ? torch::kBFloat16 : torch::kHalf; }

void check_length(const WireSpec& spec, int64_t n, const char* who) {
  if (n % spec.granule() != 0)
    throw std::invalid_argument(
        fmt::format("{}: {} values are not a multiple of the {} block ({})", who, n, spec.name(), spec.granule()));
}

}  // namespace

std::string WireSpec::name() const {
  switch (format) {
    case WireFormat::fp32: return "fp32";
    case WireFormat::bf16: return "bf16";
    case WireFormat::fp16: return "fp16";
    case WireFormat::int8: return fmt::format("int8/{}", block);
  }
  return "?";
}

int64_t WireSpec::bytes(int64_t n) const {
  switch (format) {
    case WireFormat::fp32: return 4 * n;
    case WireFormat::bf16:
    case WireFormat::fp16: return 2 * n;
    case WireFormat::int8: return n + 4 * (n / block);  // the payload, then one fp32 scale per block
  }
  return 0;
}

double WireSpec::unit_roundoff() const {
  switch (format) {
    case WireFormat::fp32: return std::ldexp(1.0, -24);
    case WireFormat::bf16:
      return std::ldexp(1.0, -8);  // 7 stored bits + the implicit one: half an ulp is 2^-8 of the value
    case WireFormat::fp16: return std::ldexp(1.0, -11);  // 10 stored bits + the implicit one
    case WireFormat::int8: return 0;
  }
  return 0;
}

std::vector<std::string> wire_format_names() { return {"fp32", "bf16", "fp16", "int8"}; }

WireSpec parse_wire_format(const std::string& name, int64_t block) {
  WireSpec spec;
  spec.block = block;
  if (name == "fp32")
    spec.format = WireFormat::fp32;
  else if (name == "bf16")
    spec.format = WireFormat::bf16;
  else if (name == "fp16")
    spec.format = WireFormat::fp16;
  else if (name == "int8")
    spec.format = WireFormat::int8;
  else
    throw UsageError(fmt::format("unknown wire format '{}': use fp32, bf16, fp16 or int8", name));
  if (block < 1) throw UsageError(fmt::format("--block {}: an int8 block holds at least 1 value", block));
  return spec;
}

// [encode]
void encode(const WireSpec& spec, const torch::Tensor& x, torch::Tensor out) {
  const int64_t n = x.numel();
  check_length(spec, n, "encode");
  if (out.numel() != spec.bytes(n)) throw std::invalid_argument("encode: the output is not spec.bytes(n) long");
  torch::NoGradGuard no_grad;
  switch (spec.format) {
    case WireFormat::fp32: out.copy_(x.view(torch::kUInt8)); return;
    case WireFormat::bf16:
    case WireFormat::fp16:
      out.copy_(x.to(dtype_of(spec.format)).view(torch::kUInt8));  // rounded to nearest, 2 bytes each
      return;
    case WireFormat::int8: {
      const int64_t blocks = n / spec.block;
      auto xb = x.view({blocks, spec.block});
      auto scale = std::get<0>(xb.abs().max(1)) / 127.0f;  // [blocks]: the largest value maps to +-127
      auto safe = torch::where(scale > 0, scale, torch::ones_like(scale));
      auto q = (xb / safe.unsqueeze(1)).round_().clamp_(-127, 127).to(torch::kChar);  // [blocks, block]
      out.narrow(0, 0, 4 * blocks).copy_(scale.contiguous().view(torch::kUInt8));
      out.narrow(0, 4 * blocks, n).copy_(q.view({n}).view(torch::kUInt8));  // the bytes as they are, not converted
      return;
    }
  }
}
// [encode]

void decode(const WireSpec& spec, const torch::Tensor& in, torch::Tensor out) {
  const int64_t n = out.numel();
  check_length(spec, n, "decode");
  if (in.numel() != spec.bytes(n)) throw std::invalid_argument("decode: the input is not spec.bytes(n) long");
  torch::NoGradGuard no_grad;
  switch (spec.format) {
    case WireFormat::fp32: out.view(torch::kUInt8).copy_(in); return;
    case WireFormat::bf16:
    case WireFormat::fp16: {
      auto low = torch::empty({n}, out.options().dtype(dtype_of(spec.format)));
      low.view(torch::kUInt8).copy_(in);
      out.copy_(low);  // widened exactly
      return;
    }
    case WireFormat::int8: {
      const int64_t blocks = n / spec.block;
      auto scale = torch::empty({blocks}, out.options());
      scale.view(torch::kUInt8).copy_(in.narrow(0, 0, 4 * blocks));
      auto q = torch::empty({n}, out.options().dtype(torch::kChar));
      q.view(torch::kUInt8).copy_(in.narrow(0, 4 * blocks, n));
      out.view({blocks, spec.block}).copy_(q.view({blocks, spec.block}).to(torch::kFloat) * scale.unsqueeze(1));
      return;
    }
  }
}

torch::Tensor round_trip(const WireSpec& spec, const torch::Tensor& x) {
  auto flat = x.contiguous().view({-1});
  auto bytes = torch::empty({spec.bytes(flat.numel())}, flat.options().dtype(torch::kUInt8));
  encode(spec, flat, bytes);
  auto out = torch::empty_like(flat);
  decode(spec, bytes, out);
  return out.view(x.sizes());
}

torch::Tensor rounding_bound(const WireSpec& spec, const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  const double u32 = std::ldexp(1.0, -24);
  switch (spec.format) {
    case WireFormat::fp32: return torch::zeros_like(x);
    case WireFormat::bf16:
      return x.abs() * spec.unit_roundoff();  // bf16 has fp32's exponent range: no subnormal term that matters
    case WireFormat::fp16:
      return x.abs() * spec.unit_roundoff() + std::ldexp(1.0, -25);  // below 2^-14 the step is 2^-24: half of it
    case WireFormat::int8: {
      // Half a step, scale / 2 = max / 254, plus fp32's own roundings: x / scale is rounded (127 u32 steps at
      // most, i.e. max x u32) and q x scale once more (u32 |x| <= u32 max): 2 u32 max in all, with margin.
      check_length(spec, x.numel(), "rounding_bound");
      auto xb = x.reshape({-1, spec.block});
      auto max = std::get<0>(xb.abs().max(1, /*keepdim=*/true));
      return (max * (1.0 / 254 + 2 * u32)).expand_as(xb).reshape(x.sizes()).clone();
    }
  }
  return {};
}

}  // namespace dp
