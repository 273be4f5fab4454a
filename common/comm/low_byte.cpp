#include "common/comm/low_byte.hpp"

#include "common/comm/shard_comm.hpp"

#include <fmt/format.h>

#include <cmath>
#include <functional>
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
// The W decoded pieces of one chunk added up in rank order: in fp32, or (the mistake, SumIn::wire) in the wire's
// 16-bit dtype, each addition rounded there. `pieces[k]` is rank k's, fp32; the sum comes back in fp32.
torch::Tensor sum_of(const std::vector<torch::Tensor>& pieces, const LowByteOptions& opts) {
  const auto W = static_cast<int64_t>(pieces.size());
  if (opts.sum == SumIn::fp32) {
    auto acc = pieces[0].clone();
    for (int64_t k = 1; k < W; ++k) acc.add_(pieces[k]);
    return acc;
  }
  const auto low = wire_dtype(opts.wire);
  auto acc = pieces[0].to(low);
  for (int64_t k = 1; k < W; ++k) acc = acc + pieces[k].to(low);  // rounded to 16 bits after every addition
  return acc.to(torch::kFloat);
}

// The average: the sum, then divided by W in fp32.
torch::Tensor average_of(const std::vector<torch::Tensor>& pieces, const LowByteOptions& opts) {
  return sum_of(pieces, opts).div_(static_cast<int64_t>(pieces.size()));
}
// [sum]

// `n` rounded up to whole blocks of the wire: the values a chunk of n is encoded as.
int64_t whole_blocks(const WireSpec& wire, int64_t n) {
  return (n + wire.granule() - 1) / wire.granule() * wire.granule();
}

// `f` (a round trip, a rounding bound) applied to each of the W chunks of `x` (fp32 [W x n]) on its own, each
// padded with zeros to whole blocks as the sharded collectives encode it: a new fp32 [W x n].
torch::Tensor per_chunk(const torch::Tensor& x, int world,
                        const std::function<torch::Tensor(const WireSpec&, const torch::Tensor&)>& f,
                        const WireSpec& wire) {
  const int64_t n = x.numel() / world, cp = whole_blocks(wire, n);
  if (n * world != x.numel()) throw std::invalid_argument("low-byte model: a buffer's length is not W chunks");
  auto out = torch::empty({x.numel()}, torch::kFloat);
  auto padded = torch::zeros({cp}, torch::kFloat);
  for (int r = 0; r < world; ++r) {
    padded.narrow(0, 0, n).copy_(x.reshape({-1}).narrow(0, r * n, n));
    out.narrow(0, r * n, n).copy_(f(wire, padded).narrow(0, 0, n));
  }
  return out;
}

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

int64_t chunk_wire_bytes(const WireSpec& wire, int64_t n) { return wire.bytes(whole_blocks(wire, n)); }

// [sharded]
ReduceScatterWork low_byte_reduce_scatter_async(ProcessGroup& pg, const torch::Tensor& flat, torch::Tensor& out,
                                                const LowByteOptions& opts, const std::string& label) {
  const int W = pg.world_size();
  const int64_t n = out.numel();
  if (flat.scalar_type() != torch::kFloat || out.scalar_type() != torch::kFloat || !flat.is_contiguous() ||
      flat.numel() != W * n)
    throw std::invalid_argument("low_byte_reduce_scatter_async: fp32 tensors of W x n and n values are needed");
  if (opts.sum == SumIn::wire) wire_dtype(opts.wire);  // int8 has no dtype to sum in
  const WireSpec wire = opts.wire;
  const int64_t cp = whole_blocks(wire, n), E = wire.bytes(cp);
  torch::NoGradGuard no_grad;
  const auto bytes = flat.options().dtype(torch::kUInt8);
  auto send = torch::empty({W * E}, bytes), recv = torch::empty({W * E}, bytes);
  auto padded = torch::zeros({cp}, flat.options());  // a chunk, then zeros up to whole blocks
  for (int j = 0; j < W; ++j) {
    padded.narrow(0, 0, n).copy_(flat.narrow(0, j * n, n));
    encode(wire, padded, send.narrow(0, j * E, E));  // chunk j, for rank j
  }
  Work work = pg.all_to_all_async(recv, send, label + " (" + wire.name() + " pieces)");
  // After the exchange, piece k of `recv` is rank k's encoding of this rank's chunk: decode, add up in rank order.
  auto finish = [recv, send, out, opts, W, n, cp, E]() mutable {
    torch::NoGradGuard guard;
    std::vector<torch::Tensor> pieces;
    for (int k = 0; k < W; ++k) {
      pieces.push_back(torch::empty({cp}, out.options()));
      decode(opts.wire, recv.narrow(0, k * E, E), pieces.back());
      pieces.back() = pieces.back().narrow(0, 0, n);
    }
    out.copy_(sum_of(pieces, opts));
  };
  return ReduceScatterWork(std::move(work).then(std::move(finish)), {}, {});
}

ReduceScatterHow low_byte_reduce_scatter_how(const LowByteOptions& opts) {
  ReduceScatterHow how;
  how.name = opts.name() + " (all-to-all + local sum)";
  how.custom = [opts](ProcessGroup& pg, torch::Tensor& flat, torch::Tensor& out, const std::string& label) {
    low_byte_reduce_scatter_async(pg, flat, out, opts, label).wait();
  };
  how.bytes = [wire = opts.wire](int64_t padded, int world) {
    return double(world - 1) * static_cast<double>(chunk_wire_bytes(wire, padded / world));
  };
  return how;
}

Work low_byte_all_gather_async(ProcessGroup& pg, const torch::Tensor& chunk, torch::Tensor& full, const WireSpec& wire,
                               const std::string& label) {
  const int W = pg.world_size();
  const int64_t n = chunk.numel();
  if (chunk.scalar_type() != torch::kFloat || !full.is_contiguous() || full.numel() != W * n)
    throw std::invalid_argument("low_byte_all_gather_async: an fp32 chunk of n values and W x n to fill are needed");
  const int64_t cp = whole_blocks(wire, n), E = wire.bytes(cp);
  torch::NoGradGuard no_grad;
  const auto bytes = chunk.options().dtype(torch::kUInt8);
  auto padded = torch::zeros({cp}, chunk.options().dtype(torch::kFloat));
  padded.narrow(0, 0, n).copy_(chunk.reshape({-1}));
  auto mine = torch::empty({E}, bytes), recv = torch::empty({W * E}, bytes);
  encode(wire, padded, mine);  // once: every rank decodes this same encoding, this one included
  Work work = all_gather_flat_async(pg, mine, recv, label + " (" + wire.name() + ")");
  auto finish = [mine, recv, padded, full, wire, W, n, E]() mutable {
    torch::NoGradGuard guard;
    for (int r = 0; r < W; ++r) {
      decode(wire, recv.narrow(0, r * E, E), padded);
      full.narrow(0, r * n, n).copy_(padded.narrow(0, 0, n));  // to the compute dtype
    }
  };
  return std::move(work).then(std::move(finish));
}
// [sharded]

torch::Tensor low_byte_scatter_average(const std::vector<torch::Tensor>& per_rank, const LowByteOptions& opts) {
  if (per_rank.empty()) throw std::invalid_argument("low_byte_scatter_average: no ranks");
  const int W = static_cast<int>(per_rank.size());
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> rounded;
  for (const auto& x : per_rank) rounded.push_back(per_chunk(x.to(torch::kFloat), W, round_trip, opts.wire));
  return average_of(rounded, opts);
}

torch::Tensor low_byte_scatter_bound(const std::vector<torch::Tensor>& per_rank, const WireSpec& wire) {
  const int W = static_cast<int>(per_rank.size());
  if (W == 0) throw std::invalid_argument("low_byte_scatter_bound: no ranks");
  torch::NoGradGuard no_grad;
  auto mean_abs = torch::zeros({per_rank[0].numel()}, torch::kDouble);
  auto first = torch::zeros_like(mean_abs);  // mean over ranks of each encoding's bound
  for (const auto& x : per_rank) {
    mean_abs += x.reshape({-1}).to(torch::kDouble).abs() / W;
    first += per_chunk(x.to(torch::kFloat), W, rounding_bound, wire).to(torch::kDouble) / W;
  }
  // W - 1 fp32 additions and one division, each at most u32 times W mean |x|; taken twice (first-order terms).
  return (first + mean_abs * (2.0 * W * std::ldexp(1.0, -24))).to(torch::kFloat);
}

torch::Tensor low_byte_gathered(const torch::Tensor& whole, int world, const WireSpec& wire) {
  torch::NoGradGuard no_grad;
  return per_chunk(whole.to(torch::kFloat), world, round_trip, wire);
}

torch::Tensor low_byte_gather_bound(const torch::Tensor& whole, int world, const WireSpec& wire) {
  torch::NoGradGuard no_grad;
  return per_chunk(whole.to(torch::kFloat), world, rounding_bound, wire);
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
