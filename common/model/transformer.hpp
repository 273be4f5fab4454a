// A pre-norm Transformer language model with the layout of CS336's BasicsTransformerLM, its model-size
// presets and a closed-form parameter count (what it costs to train: common/measure/accounting.hpp).
#pragma once

#include "common/model/units.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dp {

/// Shape of a TransformerLM. The default sizes are those of the "tiny" preset.
struct TransformerConfig {
  std::string name = "custom";   ///< preset name, for describe()
  int64_t vocab_size = 10000;    ///< V: vocabulary size (CS336 uses 10,000 for every size)
  int64_t context_length = 128;  ///< longest sequence forward() accepts (tokens)
  int64_t d_model = 256;         ///< d: width of the residual stream
  int64_t d_ff = 1024;           ///< inner width of the SwiGLU feed-forward
  int64_t num_layers = 4;        ///< L: number of Transformer blocks
  int64_t num_heads = 4;         ///< attention heads; d_model / num_heads must be even (RoPE pairs)
  double rope_theta = 10000;     ///< RoPE base

  /// A named size: tiny (256/1024/4/4), small (768/3072/12/12), medium (1024/4096/24/16),
  /// large (1280/5120/36/20), xl (1600/6400/48/25), 2.7b (2560/10240/32/32), given as
  /// d_model/d_ff/num_layers/num_heads, vocabulary 10,000. Throws dp::UsageError on an unknown name.
  static TransformerConfig preset(const std::string& name, int64_t context_length = 128);
  /// A toy size for checks that run in seconds: vocabulary 64, 2 layers, 2 heads, d_ff = 2 x d_model.
  static TransformerConfig toy(int64_t d_model = 16, int64_t context_length = 8);
  /// The preset names, smallest first.
  static std::vector<std::string> preset_names();

  /// d_model / num_heads.
  int64_t d_head() const { return d_model / num_heads; }
  /// Parameter count without building the model: 2*V*d + L*(4*d^2 + 3*d*d_ff + 2*d) + d
  /// (embedding and untied lm_head; per block q/k/v/o, w1/w2/w3 and two RMSNorm gains; final RMSNorm).
  int64_t num_parameters() const;
  /// Number of parameter tensors: 3 + 9*L.
  int64_t num_parameter_tensors() const { return 3 + 9 * num_layers; }
  /// Throws dp::UsageError if a size is not positive or the heads do not split d_model into even parts.
  void validate() const;
};

/// Rotary position embedding. x: [..., T, Dh] (Dh even); positions: [T] int64, the position of each
/// row along T. Pairs are interleaved: dims (2i, 2i+1) rotate together by angle pos * theta^(-2i/Dh),
/// as in CS336 (not the "halves" pairing (i, i + Dh/2) of some other models). Returns x's shape and dtype.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& positions, double theta = 10000);

/// Fills `w` in place with a truncated normal N(0, std^2) cut at +-3 std, drawn from the global RNG.
void trunc_normal_(torch::Tensor w, double std);

/// A bias-free Linear(d_in, d_out) initialised as CS336 does: truncated normal, std sqrt(2 / (d_in + d_out)).
torch::nn::Linear make_linear(int64_t d_in, int64_t d_out);

/// Calls body() through `run` when there is one (a sharding wrapper's runner), else directly.
torch::Tensor run_unit(const UnitRunner& run, size_t unit, const std::function<torch::Tensor()>& body);

/// RMSNorm with a learnable gain (initialised to ones): x * rsqrt(mean(x^2) + eps) * weight, over the
/// last dim, computed in float32 and cast back to x's dtype. x: [..., d].
struct RMSNormImpl : torch::nn::Module {
  explicit RMSNormImpl(int64_t d, double eps = 1e-5);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;  ///< [d]
  double eps;
};
TORCH_MODULE(RMSNorm);

/// Causal multi-head self-attention with RoPE on q and k; q/k/v/output projections are bias-free
/// Linear(d_model, d_model). x: [B, T, d_model] -> [B, T, d_model].
struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(int64_t d_model, int64_t num_heads, double rope_theta);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, output_proj{nullptr};
  int64_t num_heads;
  double rope_theta;
};
TORCH_MODULE(CausalSelfAttention);

/// SwiGLU feed-forward: w2(silu(w1 x) * w3 x), bias-free; w1, w3: d_model -> d_ff, w2: d_ff -> d_model.
struct SwiGLUImpl : torch::nn::Module {
  SwiGLUImpl(int64_t d_model, int64_t d_ff);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(SwiGLU);

/// Pre-norm block: x = x + attn(ln1(x)); x = x + ffn(ln2(x)). x: [B, T, d_model].
/// Registration order attn, ffn, ln1, ln2 gives CS336's parameter order.
struct TransformerBlockImpl : torch::nn::Module {
  explicit TransformerBlockImpl(const TransformerConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);
  CausalSelfAttention attn{nullptr};
  SwiGLU ffn{nullptr};
  RMSNorm ln1{nullptr}, ln2{nullptr};
};
TORCH_MODULE(TransformerBlock);

/// The language model: token_embeddings [V, d] -> num_layers blocks -> ln_final -> lm_head (untied,
/// [V, d]). Weights are initialised from the global RNG (seed with torch::manual_seed first):
/// Linear weights truncated normal, std sqrt(2 / (d_in + d_out)), cut at 3 std; embedding truncated
/// normal std 1, cut at 3; RMSNorm gains ones. Parameter order: token_embeddings, then per layer
/// q/k/v/output_proj, w1/w2/w3, ln1, ln2, then ln_final, lm_head.
struct TransformerLMImpl : torch::nn::Module, UnitModel {
  explicit TransformerLMImpl(const TransformerConfig& cfg);
  /// tokens: [B, T] int64 with T <= context_length and values in [0, V) -> logits [B, T, V].
  torch::Tensor forward(const torch::Tensor& tokens);
  /// forward(), the same operations in the same order, with each unit's computation handed to `run`:
  /// unit 0 is the token embedding, units 1..L the blocks, unit L+1 ln_final and lm_head. (Not an
  /// overload of forward: a ModuleHolder's operator() needs a single forward.)
  torch::Tensor forward_units(const torch::Tensor& tokens, const UnitRunner& run) override;
  /// The modules of units 0..L+1 (see forward_units).
  ModuleUnits units() override;
  TransformerConfig cfg;
  torch::nn::Embedding token_embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm ln_final{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TransformerLM);

/// Mean cross-entropy over all tokens. logits: [B, T, V]; targets: [B, T] int64 -> scalar.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace dp
