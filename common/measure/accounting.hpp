// What data-parallel training costs per device, as formulas: the bytes of training state each way of
// training keeps, the bytes each rank sends per step, the activations a Transformer keeps for backward.
// The one place these formulas live: stages, benchmarks and tests compare what they measure with them,
// and scripts/pages/accounting.py (docs/accounting.md) evaluates the same ones.
//
// P parameters in fp32, AdamW (two fp32 moments), N ranks. A ring all-reduce sends 2 (N-1)/N of the
// buffer per rank, a reduce-scatter or an all-gather (N-1)/N: "one pass" below is (N-1)/N x 4P bytes.
#pragma once

#include "common/model/transformer.hpp"

#include <cstdint>
#include <string>

namespace dp {

/// What training keeps on one rank.
struct TrainingBytes {
  int64_t params = 0;  ///< parameters held by this rank (each DDP replica holds the whole model)
  int64_t grads = 0;   ///< gradients held by this rank
  int64_t state = 0;   ///< optimizer state held by this rank
  /// params + grads + state.
  int64_t total() const { return params + grads + state; }
};

/// DDP (every rank holds everything): weights 4P, gradients 4P, AdamW moments 8P = 16P.
TrainingBytes fp32_training_bytes(int64_t num_params);

/// ZeRO-1 (either design): only the AdamW moments are split N ways: 4P + 4P + 8P/N.
TrainingBytes zero1_expected_bytes(int64_t num_params, int world_size);

/// FSDP / ZeRO-3 between steps: weights, gradients and moments all split N ways: 16P/N.
TrainingBytes fsdp_expected_bytes(int64_t num_params, int world_size);

/// Bytes one rank sends per step in DDP: one all-reduce of 4P bytes, two passes.
double ddp_bytes_per_step(int64_t num_params, int world_size);

/// True ZeRO-1: a reduce-scatter of the gradients and an all-gather of the parameters, two passes (the
/// all-reduce's two halves, so the same bytes as DDP).
double zero1_bytes_per_step(int64_t num_params, int world_size);

/// CS336's ZeRO-1 design: DDP's all-reduce (two passes) plus every parameter broadcast once (a third).
double cs336_bytes_per_step(int64_t num_params, int world_size);

/// FSDP / ZeRO-3: each unit's parameters gathered in forward and again in backward, `gather_bytes` per
/// value (4 fp32, 2 bf16), and the fp32 gradients reduce-scattered: (N-1)/N x (2 g P + 4P).
double fsdp_bytes_per_step(int64_t num_params, int world_size, int gather_bytes = 4);

/// Bytes that ONE rank sends in one collective, by the links they cross: inside its node, or over the uplink
/// between nodes. Ring arithmetic: every rank sends what it receives.
struct TierBytes {
  double intra = 0;
  double inter = 0;
};

/// A ring all-reduce of `bytes` over W = nodes x per_node ranks in rank order, AVERAGED over the W ranks.
/// Every rank sends 2(W-1)/W x bytes to its successor (W-1 steps of bytes/W to reduce-scatter, W-1 to
/// all-gather). The successor of a node's last rank is the next node's first: when nodes > 1 those `nodes`
/// ranks send all of theirs over an uplink and the other W - nodes all of theirs inside their node, so
/// inter = nodes/W x 2(W-1)/W x bytes and intra = (W - nodes)/W x 2(W-1)/W x bytes (all intra when nodes == 1:
/// the ring closes inside the node). It and the three below throw std::invalid_argument for nodes or per_node < 1.
TierBytes flat_ring_bytes(double bytes, int nodes, int per_node);

/// The hierarchical all-reduce of `bytes`, for every rank alike (M = nodes, L = per_node):
/// intra = 2 (L-1)/L x bytes (the reduce-scatter and the all-gather inside the node, (L-1)/L x bytes each),
/// inter = 2 (M-1)/M x bytes/L (a ring all-reduce of the rank's chunk of bytes/L across the M nodes).
TierBytes hierarchical_bytes(double bytes, int nodes, int per_node);

/// Bytes one node's uplink carries per direction in a flat ring all-reduce: the node's last rank sends its
/// 2(W-1)/W x bytes out and its first rank receives as much from the node before. 0 when nodes == 1.
double uplink_bytes_flat(double bytes, int nodes, int per_node);

/// The same for the hierarchical all-reduce: the node's L ranks each send 2(M-1)/M x bytes/L out (and
/// receive as much), so L x 2(M-1)/M x bytes/L = 2(M-1)/M x bytes, whatever L is.
double uplink_bytes_hierarchical(double bytes, int nodes, int per_node);

/// Bytes one node's uplink carries per training step, per direction, for P fp32 parameters on `nodes` nodes of
/// `per_node` ranks and K `micro_batches` per step, by scheme (stage 10's table; scripts/pages/accounting.py):
/// - "DDP, flat ring": uplink_bytes_flat(4P): the ring's node boundary carries one rank's whole share (once:
///   the micro-batches before the last accumulate locally);
/// - "DDP, hierarchical", "HSDP" (all-reduce on the last) and "HSDP, nothing until the last":
///   uplink_bytes_hierarchical(4P) = 2(M-1)/M x 4P once, HSDP's all-reduce of the shards being the hierarchical
///   all-reduce's middle step; "HSDP, every micro-batch": K times that;
/// - "FSDP, flat": per micro-batch three all-to-alls of 4P (two gathers, one reduce-scatter; Gloo's are
///   all-to-alls, common/comm/shard_comm.hpp), each rank sending (W-L)/W of each to other nodes, L ranks per
///   node: 3K x L (W-L)/W x 4P.
/// Throws std::invalid_argument for another scheme.
double uplink_bytes_per_step(const std::string& scheme, int64_t num_params, int nodes, int per_node,
                             int micro_batches = 1);

/// About how many bytes of activations a TransformerLM's forward() keeps for backward: per token and
/// layer the block's saved tensors (~12 d + 4 d_ff + 2 H T values), plus ~3 V for the logits and the
/// loss, times `bytes_per_value`. An estimate for memory checks, not a measurement.
double activation_bytes(const TransformerConfig& cfg, int64_t batch, int64_t tokens, int bytes_per_value = 4);

/// About the most bytes one rank holds while training the TransformerLM `m` with AdamW on `world_size` ranks,
/// `batch` sequences of `m.context_length` tokens per backward (its activations in `compute_bytes` per value:
/// 4 fp32, 2 bf16). `design`: "ddp" 20P (16P of training state, and stage 05's buckets, a copy of the
/// gradients), "zero1" 12P + 12P/N (the moments split, and the all-to-all's buffers), "fsdp" 16P/N and three
/// gathered units (the computing one, the prefetched one, the send copy) and two units' gradients in flight,
/// "fsdp-keep" every unit gathered from forward to backward. An estimate for the refusals before any work
/// (dp::check_fits_in_memory()), not a measurement. Throws std::invalid_argument on another design.
double peak_training_bytes(const TransformerConfig& m, const std::string& design, int world_size, int64_t batch,
                           int compute_bytes = 4);

/// One line: preset, shape, parameter count with thousands separators and the fp32 bytes of weights,
/// gradients and AdamW state (decimal units: 1 MB = 10^6 B), e.g.
/// "small: d_model 768, d_ff 3072, 12 layers, 12 heads, ctx 128, vocab 10000; 128,625,408 params;
/// fp32 params 515 MB, grads 515 MB, AdamW state 1.03 GB".
std::string describe(const TransformerConfig& cfg);

}  // namespace dp
