// A pre-norm Transformer language model with the layout of CS336's BasicsTransformerLM, its model-size
// presets, a closed-form parameter count and the fp32 training memory it implies.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dp {

/// Shape of a TransformerLM. The default sizes are those of the "tiny" preset.
struct TransformerConfig {
  std::string name = "custom";    ///< preset name, for describe()
  int64_t vocab_size = 10000;     ///< V: vocabulary size (CS336 uses 10,000 for every size)
  int64_t context_length = 128;   ///< longest sequence forward() accepts (tokens)
  int64_t d_model = 256;          ///< d: width of the residual stream
  int64_t d_ff = 1024;            ///< inner width of the SwiGLU feed-forward
  int64_t num_layers = 4;         ///< L: number of Transformer blocks
  int64_t num_heads = 4;          ///< attention heads; d_model / num_heads must be even (RoPE pairs)
  double rope_theta = 10000;      ///< RoPE base

  /// A named size: tiny (256/1024/4/4), small (768/3072/12/12), medium (1024/4096/24/16),
  /// large (1280/5120/36/20), xl (1600/6400/48/25), 2.7b (2560/10240/32/32), given as
  /// d_model/d_ff/num_layers/num_heads, vocabulary 10,000. Throws dp::UsageError on an unknown name.
  static TransformerConfig preset(const std::string& name, int64_t context_length = 128);
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

/// How a wrapper that shards a model (FSDP) runs one unit of it. LibTorch's C++ modules have no forward
/// hooks, so a model that can be sharded says where its units begin and end: it calls
/// `run(unit, body)`, and `run` must call `body()` once and return its result. In between, the wrapper
/// may gather the unit's weights first and free them afterwards. An empty runner calls body() directly.
using UnitRunner = std::function<torch::Tensor(size_t unit, const std::function<torch::Tensor()>& body)>;
/// The modules of each unit, in the order forward() runs the units.
using ModuleUnits = std::vector<std::vector<std::shared_ptr<torch::nn::Module>>>;

/// Bytes of fp32 training state for P parameters: weights 4P, gradients 4P, AdamW moments 8P.
struct MemoryBytes {
  int64_t params = 0, grads = 0, adam_state = 0;
  int64_t total() const { return params + grads + adam_state; }
};
MemoryBytes fp32_training_bytes(int64_t num_params);

/// About how many bytes of activations forward() keeps for backward: per token and layer the block's
/// saved tensors (~12 d + 4 d_ff + 2 H T values), plus ~3 V for the logits and the loss, times
/// `bytes_per_value`. An estimate for memory checks, not a measurement.
double activation_bytes(const TransformerConfig& cfg, int64_t batch, int64_t tokens, int bytes_per_value = 4);

/// One line: preset, shape, parameter count with thousands separators and the fp32 bytes of weights,
/// gradients and AdamW state (decimal units: 1 MB = 10^6 B), e.g.
/// "small: d_model 768, d_ff 3072, 12 layers, 12 heads, ctx 128, vocab 10000; 128,625,408 params;
/// fp32 params 515 MB, grads 515 MB, AdamW state 1.03 GB".
std::string describe(const TransformerConfig& cfg);

/// Formats an integer with thousands separators: 1998235200 -> "1,998,235,200".
std::string with_commas(int64_t n);

/// Rotary position embedding. x: [..., T, Dh] (Dh even); positions: [T] int64, the position of each
/// row along T. Pairs are interleaved: dims (2i, 2i+1) rotate together by angle pos * theta^(-2i/Dh),
/// as in CS336 (not the "halves" pairing (i, i + Dh/2) of some other models). Returns x's shape and dtype.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& positions, double theta = 10000);

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
struct TransformerLMImpl : torch::nn::Module {
  explicit TransformerLMImpl(const TransformerConfig& cfg);
  /// tokens: [B, T] int64 with T <= context_length and values in [0, V) -> logits [B, T, V].
  torch::Tensor forward(const torch::Tensor& tokens);
  /// forward(), the same operations in the same order, with each unit's computation handed to `run`:
  /// unit 0 is the token embedding, units 1..L the blocks, unit L+1 ln_final and lm_head. (Not an
  /// overload of forward: a ModuleHolder's operator() needs a single forward.)
  torch::Tensor forward_units(const torch::Tensor& tokens, const UnitRunner& run);
  /// The modules of units 0..L+1 (see forward_units).
  ModuleUnits units();
  TransformerConfig cfg;
  torch::nn::Embedding token_embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm ln_final{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TransformerLM);

/// CS336 2026's ToyFSDPModel, the model of its FSDP tests: Embedding(100, 64) -> RMSNorm(64) ->
/// Linear 64->128 -> ReLU -> RMSNorm(128) -> Linear 128->64 -> lm_head 64->100, bias-free Linears
/// initialised like the TransformerLM's. 29,376 parameters; tokens [B, T] in [0, 100) -> logits [B, T, 100].
/// Units (forward_units): 0 embedding, 1 norm1 + fc1, 2 norm2 + fc2, 3 lm_head.
struct ToyFSDPModelImpl : torch::nn::Module {
  ToyFSDPModelImpl();
  torch::Tensor forward(const torch::Tensor& tokens) { return forward_units(tokens, {}); }
  torch::Tensor forward_units(const torch::Tensor& tokens, const UnitRunner& run);
  ModuleUnits units();
  torch::nn::Embedding embedding{nullptr};
  RMSNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, lm_head{nullptr};
};
TORCH_MODULE(ToyFSDPModel);

/// Mean cross-entropy over all tokens. logits: [B, T, V]; targets: [B, T] int64 -> scalar.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace dp
