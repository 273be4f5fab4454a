// The formulas of common/measure/accounting.hpp.
#include "common/measure/accounting.hpp"

#include "common/base/format.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dp {
namespace {
// One ring pass over P fp32 values: each rank sends (N-1)/N of the 4P bytes.
double pass(int64_t num_params, int world_size) { return 4.0 * num_params * (world_size - 1) / world_size; }
}  // namespace

TrainingBytes fp32_training_bytes(int64_t num_params) {
  // fp32 weights and gradients take 4 bytes per parameter each; AdamW keeps two fp32 moments.
  return {4 * num_params, 4 * num_params, 8 * num_params};
}

TrainingBytes zero1_expected_bytes(int64_t num_params, int world_size) {
  const TrainingBytes full = fp32_training_bytes(num_params);
  return {full.params, full.grads, full.state / world_size};  // only the moments are split N ways
}

TrainingBytes fsdp_expected_bytes(int64_t num_params, int world_size) {
  const TrainingBytes full = fp32_training_bytes(num_params);
  return {full.params / world_size, full.grads / world_size, full.state / world_size};
}

double ddp_bytes_per_step(int64_t num_params, int world_size) { return 2 * pass(num_params, world_size); }

double zero1_bytes_per_step(int64_t num_params, int world_size) {
  return 2 * pass(num_params, world_size);  // reduce-scatter + all-gather: an all-reduce's two halves
}

double cs336_bytes_per_step(int64_t num_params, int world_size) {
  return 3 * pass(num_params, world_size);  // all-reduce (two passes) + every parameter broadcast once
}

double fsdp_bytes_per_step(int64_t num_params, int world_size, int gather_bytes) {
  const double ring = double(world_size - 1) / world_size;
  return ring * (2.0 * gather_bytes * num_params + 4.0 * num_params);  // two gathers, one reduce-scatter
}

double activation_bytes(const TransformerConfig& c, int64_t batch, int64_t tokens, int bytes_per_value) {
  const double per_token = double(c.num_layers) * (12.0 * c.d_model + 4.0 * c.d_ff + 2.0 * c.num_heads * tokens) +
                           3.0 * c.vocab_size + 2.0 * c.d_model;
  return per_token * double(batch) * double(tokens) * bytes_per_value;
}

// [estimate]
double peak_training_bytes(const TransformerConfig& m, const std::string& design, int world_size, int64_t batch,
                           int compute_bytes) {
  const double P = static_cast<double>(m.num_parameters()), N = world_size, e = compute_bytes;
  const double act = activation_bytes(m, batch, m.context_length, compute_bytes);
  if (design == "ddp") return 20 * P + act;                 // weights, grads, AdamW 16P, + 4P of buckets
  if (design == "zero1") return 12 * P + 12 * P / N + act;  // + the all-to-all's 4P buffers
  if (design != "fsdp" && design != "fsdp-keep")
    throw std::invalid_argument("peak_training_bytes: design '" + design + "' is not ddp, zero1, fsdp or fsdp-keep");
  const double unit =
      std::max(4.0 * m.d_model * m.d_model + 3.0 * m.d_model * m.d_ff, double(m.vocab_size) * m.d_model);
  // 16P/N of shards, shard grads and AdamW state; gathered units: the one computing, the one prefetched,
  // the all-to-all's send copy; two units' fp32 gradients in flight. fsdp-keep holds every unit from
  // forward to backward.
  const double gathered = design == "fsdp" ? 3 * unit * e : P * e + 2 * unit * e;
  return 16 * P / N + gathered + 2 * 4 * unit + act;
}
// [estimate]

std::string describe(const TransformerConfig& cfg) {
  const int64_t p = cfg.num_parameters();
  const TrainingBytes m = fp32_training_bytes(p);
  return fmt::format(
      "{}: d_model {}, d_ff {}, {} layers, {} heads, ctx {}, vocab {}; {} params; "
      "fp32 params {}, grads {}, AdamW state {}",
      cfg.name, cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.num_heads, cfg.context_length, cfg.vocab_size,
      with_commas(p), format_bytes(double(m.params)), format_bytes(double(m.grads)), format_bytes(double(m.state)));
}

static void check_mesh(int nodes, int per_node) {
  if (nodes < 1 || per_node < 1)
    throw std::invalid_argument(fmt::format("a mesh of {} nodes x {} ranks: both must be >= 1", nodes, per_node));
}

TierBytes flat_ring_bytes(double bytes, int nodes, int per_node) {
  check_mesh(nodes, per_node);
  const double W = nodes * per_node;
  const double per_rank = 2 * (W - 1) / W * bytes;  // every rank alike
  const double crossing = nodes > 1 ? nodes : 0;    // ranks whose successor is on another node
  return {per_rank * (W - crossing) / W, per_rank * crossing / W};
}

TierBytes hierarchical_bytes(double bytes, int nodes, int per_node) {
  check_mesh(nodes, per_node);
  const double L = per_node, M = nodes;
  return {2 * (L - 1) / L * bytes, 2 * (M - 1) / M * bytes / L};
}

double uplink_bytes_flat(double bytes, int nodes, int per_node) {
  check_mesh(nodes, per_node);
  const double W = nodes * per_node;
  return nodes > 1 ? 2 * (W - 1) / W * bytes : 0;  // what the node's one crossing rank sends
}

double uplink_bytes_hierarchical(double bytes, int nodes, int per_node) {
  return per_node * hierarchical_bytes(bytes, nodes, per_node).inter;  // all L ranks of the node cross
}

double uplink_bytes_per_step(const std::string& scheme, int64_t num_params, int nodes, int per_node,
                             int micro_batches) {
  const double G = 4.0 * static_cast<double>(num_params);  // fp32 gradients (or weights) in bytes
  const double W = nodes * per_node, L = per_node, K = micro_batches;
  if (scheme == "DDP, flat ring") return uplink_bytes_flat(G, nodes, per_node);
  if (scheme == "DDP, hierarchical" || scheme == "HSDP" || scheme == "HSDP, nothing until the last")
    return uplink_bytes_hierarchical(G, nodes, per_node);
  if (scheme == "HSDP, every micro-batch") return K * uplink_bytes_hierarchical(G, nodes, per_node);
  if (scheme == "FSDP, flat") return 3 * K * L * (W - L) / W * G;
  throw std::invalid_argument(fmt::format("uplink_bytes_per_step: unknown scheme '{}'", scheme));
}

}  // namespace dp
