// The Transformer LM used by the DDP benchmarks, written with the LibTorch C++ frontend.
//
// It mirrors CS336's BasicsTransformerLM so that our parameter counts, tensor counts and gradient
// sizes match the numbers in the assignment: no biases, no dropout, pre-norm RMSNorm blocks, RoPE,
// SwiGLU and an lm_head that is not tied to the embedding. LibTorch 1.13 has no fused attention, so
// attention is two matmuls, a causal mask and a softmax.
#include "common/model/transformer.hpp"

#include "common/base/errors.hpp"
#include "common/base/format.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace dp {

namespace {

struct PresetRow {
  const char* name;
  int64_t d_model, d_ff, num_layers, num_heads;
};

// CS336 assignment 2, Table 1, plus a "tiny" size that trains in seconds on a laptop CPU and a "nano" one
// (164k parameters) for the end-to-end tests, where what is checked (curves equal over world sizes, a
// resume bit for bit) does not need size and each step costs a twentieth of tiny's.
constexpr PresetRow kPresets[] = {
    {"nano", 64, 256, 2, 2},        {"tiny", 256, 1024, 4, 4},     {"small", 768, 3072, 12, 12},
    {"medium", 1024, 4096, 24, 16}, {"large", 1280, 5120, 36, 20}, {"xl", 1600, 6400, 48, 25},
    {"2.7b", 2560, 10240, 32, 32},
};

}  // namespace

// Truncated normal N(0, std^2) cut at +-3 std, drawn from the global RNG (deterministic under
// torch::manual_seed). Draw normals, then redraw the ~0.27% that fall outside the cut until none is
// left; a few cheap rounds, where PyTorch's inverse-CDF method (erfinv) costs ~6x more on CPU.
void trunc_normal_(torch::Tensor w, double std) {
  torch::NoGradGuard no_grad;
  w.normal_(0.0, std);
  for (;;) {
    auto outside = w.abs() > 3 * std;
    const int64_t n = outside.sum().item<int64_t>();
    if (n == 0) break;
    w.masked_scatter_(outside, torch::randn({n}, w.options()) * std);
  }
}

// Bias-free Linear with CS336's init: its std sqrt(2 / (d_in + d_out)) keeps activations at unit
// scale in both directions (Glorot).
torch::nn::Linear make_linear(int64_t d_in, int64_t d_out) {
  torch::nn::Linear lin(torch::nn::LinearOptions(d_in, d_out).bias(false));
  trunc_normal_(lin->weight, std::sqrt(2.0 / double(d_in + d_out)));
  return lin;
}

// --- Configuration --------------------------------------------------------------------------------

TransformerConfig TransformerConfig::toy(int64_t d_model, int64_t context_length) {
  TransformerConfig c;
  c.name = "toy";
  c.vocab_size = 64;
  c.context_length = context_length;
  c.d_model = d_model;
  c.d_ff = 2 * d_model;
  c.num_layers = 2;
  c.num_heads = 2;
  return c;
}

TransformerConfig TransformerConfig::preset(const std::string& name, int64_t context_length) {
  const std::string key = lowercase(name);
  for (const auto& row : kPresets) {
    if (key != row.name) continue;
    TransformerConfig cfg;
    cfg.name = row.name;
    cfg.context_length = context_length;
    cfg.d_model = row.d_model;
    cfg.d_ff = row.d_ff;
    cfg.num_layers = row.num_layers;
    cfg.num_heads = row.num_heads;
    cfg.validate();
    return cfg;
  }
  throw UsageError(fmt::format("unknown model size '{}'; valid sizes: {}", name, fmt::join(preset_names(), ", ")));
}

std::vector<std::string> TransformerConfig::preset_names() {
  std::vector<std::string> names;
  for (const auto& row : kPresets) names.emplace_back(row.name);
  return names;
}

int64_t TransformerConfig::num_parameters() const {
  const int64_t V = vocab_size, d = d_model, L = num_layers;
  const int64_t per_block = 4 * d * d       // q, k, v, output projections
                            + 3 * d * d_ff  // w1, w2, w3
                            + 2 * d;        // ln1, ln2 gains
  return 2 * V * d                          // token embedding + untied lm_head
         + L * per_block + d;               // blocks + final RMSNorm gain
}

void TransformerConfig::validate() const {
  auto positive = [](int64_t v, const char* what) {
    if (v <= 0) throw UsageError(fmt::format("{} must be positive, got {}", what, v));
  };
  positive(vocab_size, "vocab_size");
  positive(context_length, "context_length");
  positive(d_model, "d_model");
  positive(d_ff, "d_ff");
  positive(num_layers, "num_layers");
  positive(num_heads, "num_heads");
  if (d_model % num_heads != 0 || d_head() % 2 != 0)
    throw UsageError(fmt::format("d_model {} must split into {} heads of even width (RoPE rotates pairs of dims)",
                                 d_model, num_heads));
  if (!(rope_theta > 0)) throw UsageError(fmt::format("rope_theta must be positive, got {}", rope_theta));
}

// --- Building blocks ------------------------------------------------------------------------------

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& positions, double theta) {
  const int64_t dh = x.size(-1);
  if (dh % 2 != 0) throw UsageError(fmt::format("RoPE needs an even head width, got {}", dh));
  // Angles in float64 so that large positions keep their precision, then cast to x's dtype.
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(x.device());
  auto inv_freq = torch::pow(theta, torch::arange(0, dh / 2, f64) * (-2.0 / double(dh)));  // [Dh/2]
  auto angles = positions.to(f64).unsqueeze(-1) * inv_freq;                                // [T, Dh/2]
  auto cos = angles.cos().to(x.scalar_type()), sin = angles.sin().to(x.scalar_type());

  // View the last dim as Dh/2 interleaved pairs (x[2i], x[2i+1]) and rotate each pair as a 2-D point.
  auto pair_shape = x.sizes().vec();
  pair_shape.back() = dh / 2;
  pair_shape.push_back(2);
  auto pairs = x.reshape(pair_shape);  // [..., T, Dh/2, 2]
  auto x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
  return torch::stack({cos * x1 - sin * x2, sin * x1 + cos * x2}, -1).reshape(x.sizes());
}

RMSNormImpl::RMSNormImpl(int64_t d, double eps) : eps(eps) { weight = register_parameter("weight", torch::ones({d})); }

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // Squares of bf16/fp16 activations lose precision and can overflow, so normalise in float32.
  auto xf = x.to(torch::kFloat32);
  auto inv_rms = torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);  // [..., 1]
  return (xf * inv_rms * weight).to(x.scalar_type());
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(int64_t d_model, int64_t num_heads, double rope_theta)
    : num_heads(num_heads), rope_theta(rope_theta) {
  q_proj = register_module("q_proj", make_linear(d_model, d_model));
  k_proj = register_module("k_proj", make_linear(d_model, d_model));
  v_proj = register_module("v_proj", make_linear(d_model, d_model));
  output_proj = register_module("output_proj", make_linear(d_model, d_model));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2), H = num_heads, dh = d / H;
  // [B, T, d] -> [B, T, H, Dh] -> [B, H, T, Dh]: every head attends independently.
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, dh}).transpose(1, 2); };
  auto positions = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
  auto q = apply_rope(heads(q_proj(x)), positions, rope_theta);
  auto k = apply_rope(heads(k_proj(x)), positions, rope_theta);
  auto v = heads(v_proj(x));

  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(dh));  // [B, H, T, T]
  // Query i may look at keys j <= i only: mask the strict upper triangle (the future) with -inf,
  // which softmax turns into exactly zero weight.
  auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  auto attn = torch::softmax(scores, -1);                                // [B, H, T, T]
  auto out = torch::matmul(attn, v).transpose(1, 2).reshape({B, T, d});  // [B, T, d]
  return output_proj(out);
}

SwiGLUImpl::SwiGLUImpl(int64_t d_model, int64_t d_ff) {
  w1 = register_module("w1", make_linear(d_model, d_ff));
  w2 = register_module("w2", make_linear(d_ff, d_model));
  w3 = register_module("w3", make_linear(d_model, d_ff));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  // The gate silu(w1 x) scales the value w3 x elementwise: [B, T, d_ff] -> w2 -> [B, T, d_model].
  return w2(torch::silu(w1(x)) * w3(x));
}

TransformerBlockImpl::TransformerBlockImpl(const TransformerConfig& cfg) {
  attn = register_module("attn", CausalSelfAttention(cfg.d_model, cfg.num_heads, cfg.rope_theta));
  ffn = register_module("ffn", SwiGLU(cfg.d_model, cfg.d_ff));
  ln1 = register_module("ln1", RMSNorm(cfg.d_model));
  ln2 = register_module("ln2", RMSNorm(cfg.d_model));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x) {
  // Pre-norm: each sublayer sees a normalised copy, and the residual stream itself is never normalised.
  auto h = x + attn(ln1(x));
  return h + ffn(ln2(h));
}

// --- The model --------------------------------------------------------------------------------------

TransformerLMImpl::TransformerLMImpl(const TransformerConfig& config) : cfg(config) {
  cfg.validate();
  token_embeddings = register_module("token_embeddings", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
  trunc_normal_(token_embeddings->weight, 1.0);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.num_layers; ++i) layers->push_back(TransformerBlock(cfg));
  ln_final = register_module("ln_final", RMSNorm(cfg.d_model));
  lm_head = register_module("lm_head", make_linear(cfg.d_model, cfg.vocab_size));
}

torch::Tensor TransformerLMImpl::forward(const torch::Tensor& tokens) { return forward_units(tokens, UnitRunner()); }

torch::Tensor run_unit(const UnitRunner& run, size_t unit, const std::function<torch::Tensor()>& body) {
  return run ? run(unit, body) : body();
}

torch::Tensor TransformerLMImpl::forward_units(const torch::Tensor& tokens, const UnitRunner& run) {
  if (tokens.dim() != 2 || tokens.size(1) > cfg.context_length)
    throw UsageError(fmt::format("tokens must be [batch, T] with T <= context_length {}, got {}", cfg.context_length,
                                 tokens.sizes().vec()));
  auto x = run_unit(run, 0, [&] { return token_embeddings(tokens); });  // [B, T, d_model]
  for (size_t i = 0; i < layers->size(); ++i)
    x = run_unit(run, i + 1, [&] { return layers[i]->as<TransformerBlockImpl>()->forward(x); });
  return run_unit(run, layers->size() + 1, [&] { return lm_head(ln_final(x)); });  // [B, T, V]
}

ModuleUnits TransformerLMImpl::units() {
  ModuleUnits u{{token_embeddings.ptr()}};
  for (const auto& layer : *layers) u.push_back({layer});
  u.push_back({ln_final.ptr(), lm_head.ptr()});
  return u;
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  // Flatten [B, T, V] to [B*T, V]: every token is one classification, and the mean is over all of them.
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace dp
