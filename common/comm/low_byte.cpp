#include "common/comm/low_byte.hpp"

#include "common/comm/shard_comm.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace dp {

namespace {

// The first n elements of `buf`, reallocated only when it is too short: a buffer allocated once, at the
// longest length seen, and reused.
torch::Tensor first(torch::Tensor& buf, int64_t n, const torch::TensorOptions& options) {
  if (!buf.defined() || buf.numel() < n) buf = torch::empty({n}, options);
  return buf.narrow(0, 0, n);
}

torch::ScalarType wire_dtype(const WireSpec& wire) {
  if (wire.format == WireFormat::bf16) return torch::kBFloat16;
  if (wire.format == WireFormat::fp16) return torch::kHalf;
  throw std::invalid_argument(fmt::format("a sum in the wire's dtype needs bf16 or fp16, not {}", wire.name()));
}

// [sum]
// The W decoded pieces of one chunk added up, in rank order, then divided by W: in fp32, or (the mistake,
// SumIn::wire) in the wire's 16-bit dtype, each addition rounded there. `pieces[k]` is rank k's, fp32.
torch::Tensor average_of(const std::vector<torch::Tensor>& pieces, const LowByteOptions& opts) {
  const auto W = static_cast<int64_t>(pieces.size());
  if (opts.sum == SumIn::fp32) {
    auto acc = pieces[0].clone();
    for (int64_t k = 1; k < W; ++k) acc.add_(pieces[k]);
    return acc.div_(W);
  }
  const auto low = wire_dtype(opts.wire);
  auto acc = pieces[0].to(low);
  for (int64_t k = 1; k < W; ++k) acc = acc + pieces[k].to(low);  // rounded to 16 bits after every addition
  return acc.to(torch::kFloat).div_(W);
}
// [sum]

}  // namespace

std::string LowByteOptions::name() const {
  return fmt::format("{} wire, {} sums", wire.name(), sum == SumIn::fp32 ? "fp32" : wire.name());
}

LowByteLayout LowByteLayout::of(int64_t numel, int world, const WireSpec& wire) {
  LowByteLayout L;
  L.numel = numel;
  L.world = world;
  const int64_t unit = world * wire.granule();
  L.padded = (numel + unit - 1) / unit * unit;
  L.chunk = L.padded / world;
  return L;
}

LowByteAllReduce::LowByteAllReduce(ProcessGroup& pg, LowByteOptions opts) : pg_(pg), opts_(std::move(opts)) {
  if (opts_.sum == SumIn::wire) wire_dtype(opts_.wire);  // int8 has no dtype to sum in: refuse it now
}

void LowByteAllReduce::run(torch::Tensor& flat, const std::string& label) {
  if (flat.scalar_type() != torch::kFloat || !flat.is_contiguous())
    throw std::invalid_argument("LowByteAllReduce: the tensor must be contiguous fp32");
  const int W = pg_.world_size();
  const WireSpec& wire = opts_.wire;
  const auto L = LowByteLayout::of(flat.numel(), W, wire);
  if (L.numel == 0) return;
  torch::NoGradGuard no_grad;
  auto line = flat.view({-1});
  torch::Tensor buf = line;  // [padded]: `flat` itself, or a copy padded with zeros (they add nothing)
  if (L.padded != L.numel) {
    buf = torch::zeros({L.padded}, flat.options());
    buf.narrow(0, 0, L.numel).copy_(line);
  }
  const int64_t E = L.chunk_bytes(wire);
  const auto bytes = flat.options().dtype(torch::kUInt8);
  auto send = first(send_, W * E, bytes);
  auto recv = first(recv_, W * E, bytes);
  auto mine = first(mine_, E, bytes);
  // [steps]
  // 1. Chunk j, encoded, goes to rank j; piece k of `recv` is rank k's encoding of this rank's chunk.
  for (int j = 0; j < W; ++j) encode(wire, buf.narrow(0, j * L.chunk, L.chunk), send.narrow(0, j * E, E));
  pg_.all_to_all_async(recv, send, label + " (" + wire.name() + " pieces)").wait();
  // 2. Decoded to fp32 and averaged here, on this rank's chunk only.
  std::vector<torch::Tensor> pieces;
  for (int k = 0; k < W; ++k) {
    pieces.push_back(torch::empty({L.chunk}, flat.options()));
    decode(wire, recv.narrow(0, k * E, E), pieces.back());
  }
  encode(wire, average_of(pieces, opts_), mine);
  // 3. Every rank's encoded average to every rank (`send` is free again: the all-gather's scratch).
  all_gather_flat(pg_, mine, recv, label + " (" + wire.name() + " averages)", AllGatherAlgo::automatic, send);
  for (int j = 0; j < W; ++j) decode(wire, recv.narrow(0, j * E, E), buf.narrow(0, j * L.chunk, L.chunk));
  // [steps]
  if (!buf.is_same(line)) line.copy_(buf.narrow(0, 0, L.numel));
  sent_ += L.sent_bytes(wire);
}

torch::Tensor low_byte_average(const std::vector<torch::Tensor>& per_rank, const LowByteOptions& opts) {
  if (per_rank.empty()) throw std::invalid_argument("low_byte_average: no ranks");
  const int W = static_cast<int>(per_rank.size());
  const auto L = LowByteLayout::of(per_rank[0].numel(), W, opts.wire);
  torch::NoGradGuard no_grad;
  // The encodings are value by value (bf16, fp16) or block by block with blocks inside chunks (int8), so
  // rounding the whole padded buffer at once rounds every chunk exactly as its own encoding does.
  std::vector<torch::Tensor> rounded;
  for (const auto& x : per_rank) {
    if (x.numel() != L.numel) throw std::invalid_argument("low_byte_average: ranks' buffers differ in length");
    auto padded = torch::zeros({L.padded}, x.options().dtype(torch::kFloat));
    padded.narrow(0, 0, L.numel).copy_(x.reshape({-1}));
    rounded.push_back(round_trip(opts.wire, padded));
  }
  auto avg = round_trip(opts.wire, average_of(rounded, opts));
  return avg.narrow(0, 0, L.numel).clone();
}

torch::Tensor low_byte_bound(const std::vector<torch::Tensor>& per_rank, const WireSpec& wire) {
  const int W = static_cast<int>(per_rank.size());
  const auto L = LowByteLayout::of(per_rank.at(0).numel(), W, wire);
  torch::NoGradGuard no_grad;
  auto padded = [&](const torch::Tensor& x) {
    auto p = torch::zeros({L.padded}, x.options().dtype(torch::kDouble));
    p.narrow(0, 0, L.numel).copy_(x.reshape({-1}));
    return p;
  };
  auto mean = torch::zeros({L.padded}, torch::kDouble);      // the exact average
  auto mean_abs = torch::zeros({L.padded}, torch::kDouble);  // mean |x| over ranks
  auto first = torch::zeros({L.padded}, torch::kDouble);     // mean over ranks of each encoding's bound
  for (const auto& x : per_rank) {
    auto p = padded(x);
    mean += p / W;
    mean_abs += p.abs() / W;
    first += rounding_bound(wire, p.to(torch::kFloat)).to(torch::kDouble) / W;
  }
  // W - 1 fp32 additions and one division, each at most u32 times the running sum's |value| <= W mean |x|;
  // taken twice for the first-order terms left out.
  auto adds = mean_abs * (2.0 * W * std::ldexp(1.0, -24));
  auto second = rounding_bound(wire, (mean.abs() + first + adds).to(torch::kFloat)).to(torch::kDouble);
  return (first + adds + second).narrow(0, 0, L.numel).to(torch::kFloat).clone();
}

}  // namespace dp
