// An all-reduce whose bytes travel in a low-precision wire format (common/comm/wire_format.hpp) while every sum
// is done in fp32. An all-reduce is a reduce-scatter followed by an all-gather; here each is an exchange of
// bytes, and the arithmetic happens between them, on each rank's own chunk, in fp32:
//   1. the buffer, cut into W chunks, is encoded chunk by chunk and chunk j is sent to rank j (all-to-all);
//   2. rank r decodes the W pieces of chunk r, adds them up in fp32 in rank order, and divides by W;
//   3. it encodes its average once and all-gathers it; every rank decodes all W chunks, its own included, so
//      every rank ends holding the same values.
// Each value is rounded twice (its rank's encoding, and the average's), however many ranks add up: the error
// does not grow with W. Summing in the wire's own 16 bits instead (what an fp16 all-reduce does, and what
// SumIn::wire plants on purpose) rounds every partial sum: W - 1 more roundings, of values as large as the
// partial sums.
#pragma once

#include "common/comm/shard_comm.hpp"  // ReduceScatterWork
#include "common/comm/wire_format.hpp"
#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dp {

/// Where a low-byte all-reduce adds the ranks' pieces up.
enum class SumIn {
  fp32,  ///< decoded to fp32, added in fp32 (the design)
  wire,  ///< in the wire's own dtype, one rounding per addition (bf16 and fp16 only: the mistake, for comparison)
};

/// A wire format and where the sums happen.
struct LowByteOptions {
  WireSpec wire;
  SumIn sum = SumIn::fp32;
  /// "bf16 wire, fp32 sums" and the like, for tables.
  std::string name() const;
};

/// How a buffer of `numel` values is laid out for W ranks: padded with zeros to a multiple of W x granule, so
/// that every chunk holds whole int8 blocks (a scale never spans two ranks' chunks).
struct LowByteLayout {
  int64_t numel = 0;   ///< values that carry data
  int64_t padded = 0;  ///< numel rounded up to a multiple of world x granule
  int64_t chunk = 0;   ///< padded / world: one rank's chunk, a multiple of the block
  int world = 1;
  static LowByteLayout of(int64_t numel, int world, const WireSpec& wire);
  /// Bytes one chunk takes on the wire.
  int64_t chunk_bytes(const WireSpec& wire) const { return wire.bytes(chunk); }
  /// Bytes each rank sends for one all-reduce: (W - 1) encoded pieces in the all-to-all, its encoded average to
  /// the W - 1 others in the all-gather: 2 (W - 1) x chunk_bytes, what a ring all-reduce of wire.bytes(padded)
  /// bytes sends.
  int64_t sent_bytes(const WireSpec& wire) const { return 2 * int64_t{world - 1} * chunk_bytes(wire); }
};

/// Runs the three steps on one group, reusing its byte buffers from call to call. Not thread-safe: one call
/// at a time (the hook below runs it on one worker thread).
class LowByteAllReduce {
 public:
  LowByteAllReduce(ProcessGroup& pg, LowByteOptions opts);
  /// Replaces `flat` (fp32, contiguous) by the average over the ranks, every rank the same values. Blocking; a
  /// collective (two). Throws std::invalid_argument for SumIn::wire with int8 or a tensor that is not fp32.
  void run(torch::Tensor& flat, const std::string& label = {});
  /// Bytes this rank sent since construction (LowByteLayout::sent_bytes per call).
  int64_t sent_bytes() const { return sent_; }
  const LowByteOptions& options() const { return opts_; }

 private:
  ProcessGroup& pg_;
  LowByteOptions opts_;
  torch::Tensor send_, recv_, mine_;  // uint8 [W x chunk bytes] twice and [chunk bytes]: kept between calls
  int64_t sent_ = 0;
};

/// Bytes a chunk of `n` values takes on the wire when it is encoded on its own, padded with zeros to whole blocks
/// (int8): the sharded collectives below encode every rank's chunk apart, so a block never spans two chunks.
int64_t chunk_wire_bytes(const WireSpec& wire, int64_t n);

/// A reduce-scatter whose pieces travel in a wire format (FSDP's and ZeRO's gradients in fewer bytes): `flat` (fp32
/// [W x n], contiguous) is cut into W chunks, chunk j encoded on its own and sent to rank j (an all-to-all of bytes);
/// wait() decodes the W pieces of this rank's chunk and adds them up in rank order, in fp32 (SumIn::wire: in the
/// wire's dtype, the mistake), into `out` (fp32 [n]): the sum, as reduce_scatter() leaves it. `flat` is free again
/// when this returns (it is encoded by then); `out` is written in wait(). Each rank sends (W - 1) chunk_wire_bytes.
/// Throws std::invalid_argument for tensors of other dtypes or lengths.
ReduceScatterWork low_byte_reduce_scatter_async(ProcessGroup& pg, const torch::Tensor& flat, torch::Tensor& out,
                                                const LowByteOptions& opts, const std::string& label = {});

/// low_byte_reduce_scatter_async() as a blocking ReduceScatterHow, named and with its bytes: what stage 06's ZeRO-1
/// takes (zero1_strategy(), Zero1Optimizer) to reduce-scatter its flat gradient buffer in fewer bytes.
ReduceScatterHow low_byte_reduce_scatter_how(const LowByteOptions& opts);

/// An all-gather whose values travel in a wire format (FSDP's weights in fewer bytes): this rank's `chunk` (fp32
/// [n]) is encoded once, every rank's encoding gathered, and wait() decodes rank r's into elements [r n, (r + 1) n)
/// of `full` ([W x n], contiguous, any floating dtype: decoded to fp32, then cast). Every rank decodes its own chunk
/// too, so all hold the same values. Each rank sends (W - 1) chunk_wire_bytes.
Work low_byte_all_gather_async(ProcessGroup& pg, const torch::Tensor& chunk, torch::Tensor& full, const WireSpec& wire,
                               const std::string& label = {});

/// What rank r holds in chunk r of the result after low_byte_reduce_scatter_async() and a division by W, for every
/// rank at once, from every rank's buffer (`per_rank[k]`, fp32 [W x n]): bit-identical to the collective.
torch::Tensor low_byte_scatter_average(const std::vector<torch::Tensor>& per_rank, const LowByteOptions& opts);

/// How far low_byte_scatter_average() with SumIn::fp32 may lie from the exact average, value by value: the mean
/// over ranks of each rank's rounding bound (each chunk encoded on its own), plus fp32's additions (W u32 mean |x|,
/// taken twice). The average is not rounded again: a reduce-scatter's result stays in fp32 on its owner.
torch::Tensor low_byte_scatter_bound(const std::vector<torch::Tensor>& per_rank, const WireSpec& wire);

/// What every rank's `full` holds after low_byte_all_gather_async() of the chunks that make up `whole` (fp32
/// [W x n], rank r's chunk at [r n, (r + 1) n)), in fp32: each chunk through the wire once, on its own.
torch::Tensor low_byte_gathered(const torch::Tensor& whole, int world, const WireSpec& wire);

/// How far low_byte_gathered() may lie from `whole`, value by value: one rounding, each chunk's blocks its own
/// (rounding_bound()).
torch::Tensor low_byte_gather_bound(const torch::Tensor& whole, int world, const WireSpec& wire);

/// What every rank of a LowByteAllReduce ends with, computed on one process from every rank's buffer
/// (`per_rank[r]`, fp32, all of one length): the same encodings and the same additions in the same order, so
/// bit-identical to the collective (tests check it). Lets an error study take any number of ranks.
torch::Tensor low_byte_average(const std::vector<torch::Tensor>& per_rank, const LowByteOptions& opts);

/// How far low_byte_average() with SumIn::fp32 may lie from the exact average of `per_rank`, value by value:
/// the mean over ranks of each rank's rounding bound (rounding_bound() of its own values), plus one rounding of
/// the average (rounding_bound() of the average, its own bound widened by the first term, which it may move
/// by), plus fp32's additions (W roundings of at most the sum of |x|: W u32 x mean |x|). A new fp32 tensor.
torch::Tensor low_byte_bound(const std::vector<torch::Tensor>& per_rank, const WireSpec& wire);

}  // namespace dp
