// Extension 07c, on stage 07: FSDP's two collectives in fewer bytes. Stage 07 moves each unit twice per step in
// fp32: its weights all-gathered before forward (and backward), its gradient reduce-scattered after backward. Its
// seams, Fsdp::gather_unit() and Fsdp::reduce_scatter_unit(), say how. Here the weights may travel as bf16, fp16
// or block-scaled int8 (ZeRO++'s quantized weights: one fp32 scale per block of values, packed in front of them in
// the same byte buffer) and are decoded on every rank, and the gradients as the same formats with every sum in
// fp32 on the chunk's owner (common/comm/low_byte.hpp: an all-to-all of encoded pieces, then a local sum). Each
// rank's chunk is encoded on its own, padded to whole blocks, so a scale never spans two ranks' shards.
#pragma once

#include "common/comm/low_byte.hpp"
#include "stages/06_sharded_opt/strategies.hpp"  // zero1_strategy
#include "stages/07_fsdp/fsdp.hpp"
#include "stages/07_fsdp/strategies.hpp"

#include <memory>
#include <string>
#include <vector>

namespace dp {

/// How LowByteFsdp's units travel: fp32 for both is stage 07's Fsdp exactly. With `zero1`, stage 06's ZeRO-1 instead,
/// its flat gradient buffer reduce-scattered as `scatter` says (its all-gather carries the fp32 master weights).
struct LowByteFsdpOptions {
  WireSpec gather;         ///< the weights' all-gather
  LowByteOptions scatter;  ///< the gradients' reduce-scatter: its wire, and where the ranks' pieces are summed
  bool zero1 = false;      ///< stage 06's ZeRO-1, not FSDP
  /// "weights int8/256, gradients bf16 wire, fp32 sums", for tables.
  std::string name() const;
};

/// Stage 07's Fsdp with its units moved in the formats of `low`. Weights gathered in a low format are rounded once
/// (every rank computes with the same rounded weights; the optimizer steps the fp32 master shard), gradients once
/// per rank's piece, then summed in fp32.
class LowByteFsdp : public Fsdp {
 public:
  LowByteFsdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const ModuleUnits& units, FsdpOptions opts,
              LowByteFsdpOptions low);
  const LowByteFsdpOptions& low_byte() const { return low_; }

 protected:
  Work gather_unit(size_t u, const torch::Tensor& shard, torch::Tensor& full) override;
  ReduceScatterWork reduce_scatter_unit(size_t u, torch::Tensor& flat, torch::Tensor& out) override;

 private:
  ProcessGroup& pg_;
  LowByteFsdpOptions low_;
};

/// The wire names a variant takes: "fp32", "bf16", "fp16", "int8" for the weights, or "zero1" (stage 06's ZeRO-1,
/// whose weights travel in fp32); those four and "bf16-lowsum", "fp16-lowsum" (summed in 16 bits: the mistake,
/// measured) for the gradients.
std::vector<std::string> low_byte_gather_names();
std::vector<std::string> low_byte_scatter_names();

/// A variant named "WEIGHTS/GRADIENTS" ("fp32/fp32", "int8/int8", "fp32/bf16-lowsum", "zero1/int8"), int8 with `block`
/// values per scale. Throws dp::UsageError naming the value and the choices for another name or a block that is not
/// positive.
LowByteFsdpOptions parse_low_byte_variant(const std::string& name, int64_t block);

/// Stage 07's FSDP strategy (fsdp_strategy()) over a LowByteFsdp; with low.zero1, stage 06's (zero1_strategy()) with
/// low_byte_reduce_scatter_how(low.scatter), or its own reduce-scatter for fp32.
MakeStrategy low_byte_fsdp_strategy(FsdpOptions opts, LowByteFsdpOptions low);

}  // namespace dp
