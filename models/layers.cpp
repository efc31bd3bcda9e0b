#include "models/layers.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/layer_norm.h"
#include "ops/matmul.h"
#include "ops/views.h"

namespace tg::nn {

namespace {

// nn.Linear's init bound 1/sqrt(in) (kaiming_uniform with a = sqrt(5) gives
// gain sqrt(1/3), and bound = gain sqrt(3 / fan_in)).
double linear_init_bound(int64_t in_features, int64_t out_features) {
  TG_CHECK(in_features > 0 && out_features > 0, "Linear: in_features ", in_features, " and out_features ",
           out_features, " must be positive");
  return 1.0 / std::sqrt(static_cast<double>(in_features));
}

Tensor small_normal(const Shape& shape, TensorOptions opts) {
  opts.requires_grad = false;
  return mul(randn(shape, opts), 0.02);
}

int64_t checked_heads(const RegionAttentionConfig& c) {
  check_region_attention_config("RegionAwareSelfAttention", c);
  return c.heads;
}

Shape embedding_table_shape(int64_t num_embeddings, int64_t embedding_dim) {
  TG_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: num_embeddings ", num_embeddings,
           " and embedding_dim ", embedding_dim, " must be positive");
  return {num_embeddings, embedding_dim};
}

// The MLP's width, hidden * mlp_ratio rounded down: at least 1, and below
// 2^31 (checked before the cast, which would be undefined beyond int64).
int64_t mlp_hidden(int64_t hidden, double mlp_ratio) {
  const double width = static_cast<double>(hidden) * mlp_ratio;
  TG_CHECK(width >= 1 && width < 0x1p31, "DiTBlock: mlp_ratio ", mlp_ratio, " gives an MLP width of ", width,
           " for hidden ", hidden, "; it must be at least 1 and below 2^31");
  return static_cast<int64_t>(width);
}

Tensor modulate(const Tensor& h, const Tensor& shift, const Tensor& scale) {
  return add(mul(h, add(scale, 1.0)), shift);
}

// adaLN-Zero: a modulation (or output) layer that starts at zero.
std::shared_ptr<Linear> zero_linear(int64_t in, int64_t out, TensorOptions opts) {
  auto layer = std::make_shared<Linear>(in, out, true, opts);
  NoGradGuard no_grad;
  layer->weight.zero_();
  layer->bias.zero_();
  return layer;
}

// The tokens x [B,S,hidden] and the conditioning c [B,hidden] of an adaLN layer.
void check_tokens_and_conditioning(const char* op, const Tensor& x, const Tensor& c, int64_t hidden) {
  check_defined(op, "x", x);
  check_defined(op, "c", c);
  TG_CHECK(x.dim() == 3 && x.size(2) == hidden, op, ": x must be [B,S,", hidden, "], got ", x.shape());
  TG_CHECK(c.dim() == 2 && c.size(0) == x.size(0) && c.size(1) == hidden, op, ": c must be [", x.size(0), ",",
           hidden, "] for x ", x.shape(), ", got ", c.shape());
}

}  // namespace

Tensor uniform(const Shape& shape, double bound, TensorOptions opts) {
  TG_CHECK(std::isfinite(bound) && bound >= 0, "uniform: bound must be finite and >= 0, got ", bound);
  opts.requires_grad = false;
  return add(mul(rand(shape, opts), 2 * bound), -bound);
}

// ---- Linear

Linear::Linear(int64_t in, int64_t out, bool with_bias, TensorOptions opts)
    : in_features(in),
      out_features(out),
      weight(register_parameter("weight", uniform({out, in}, linear_init_bound(in, out), opts))),
      bias(register_parameter("bias", with_bias ? uniform({out}, linear_init_bound(in, out), opts) : Tensor())) {}

Tensor Linear::forward(const Tensor& x) const { return linear(x, weight, bias); }

// ---- LayerNorm

LayerNorm::LayerNorm(int64_t n, double eps, bool affine, TensorOptions opts)
    : normalized_shape(n),
      eps(eps),
      weight(register_parameter("weight", affine ? ones({n}, {opts.dtype, opts.device}) : Tensor())),
      bias(register_parameter("bias", affine ? zeros({n}, {opts.dtype, opts.device}) : Tensor())) {
  TG_CHECK(n > 0, "LayerNorm: normalized_shape must be positive, got ", n);
}

Tensor LayerNorm::forward(const Tensor& x) const {
  check_defined("LayerNorm", "x", x);
  TG_CHECK(x.dim() >= 1 && x.size(-1) == normalized_shape, "LayerNorm: x must end in dim ", normalized_shape,
           ", got ", x.shape());
  return layer_norm(x, weight, bias, eps);
}

// ---- Embedding

Embedding::Embedding(int64_t num, int64_t dim, TensorOptions opts)
    : num_embeddings(num),
      embedding_dim(dim),
      weight(register_parameter("weight", randn(embedding_table_shape(num, dim), {opts.dtype, opts.device}))) {}

Tensor Embedding::forward(const std::vector<int64_t>& indices) const {
  TG_CHECK(!indices.empty(), "Embedding: got no indices");
  const int64_t n = static_cast<int64_t>(indices.size());
  std::vector<double> one_hot(n * num_embeddings, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    TG_CHECK(indices[i] >= 0 && indices[i] < num_embeddings, "Embedding: index ", i, " is ", indices[i],
             ", outside the table's [0, ", num_embeddings, ")");
    one_hot[i * num_embeddings + indices[i]] = 1.0;
  }
  return matmul(from_vector(one_hot, {n, num_embeddings}, {weight.dtype(), weight.device()}), weight);
}

// ---- MLP

MLP::MLP(int64_t in, int64_t hidden, int64_t out, Activation act, TensorOptions opts)
    : activation(act),
      fc1(register_module("fc1", std::make_shared<Linear>(in, hidden, true, opts))),
      fc2(register_module("fc2", std::make_shared<Linear>(hidden, out, true, opts))) {}

Tensor MLP::forward(const Tensor& x) const {
  const Tensor h = fc1->forward(x);
  return fc2->forward(activation == Activation::GELU ? gelu(h) : silu(h));
}

// ---- patches

Tensor patchify(const Tensor& images, int64_t p) {
  check_defined("patchify", "images", images);
  TG_CHECK(p > 0, "patchify: patch_size must be positive, got ", p);
  TG_CHECK(images.dim() == 4 && images.size(2) % p == 0 && images.size(3) % p == 0,
           "patchify: images must be [B,C,H,W] with H and W multiples of patch_size ", p, ", got ", images.shape());
  const int64_t B = images.size(0), C = images.size(1), Hp = images.size(2) / p, Wp = images.size(3) / p;
  return images.reshape({B, C, Hp, p, Wp, p}).permute({0, 2, 4, 1, 3, 5}).reshape({B, Hp * Wp, C * p * p});
}

Tensor unpatchify(const Tensor& patches, int64_t p, int64_t Hp, int64_t Wp) {
  check_defined("unpatchify", "patches", patches);
  TG_CHECK(p > 0 && Hp > 0 && Wp > 0, "unpatchify: patch_size ", p, " and grid ", Hp, "x", Wp, " must be positive");
  TG_CHECK(patches.dim() == 3 && patches.size(1) == Hp * Wp && patches.size(2) % (p * p) == 0,
           "unpatchify: patches must be [B,", Hp * Wp, ",C*", p * p, "] for a ", Hp, "x", Wp, " grid of ", p, "x", p,
           " patches, got ", patches.shape());
  const int64_t B = patches.size(0), C = patches.size(2) / (p * p);
  return patches.reshape({B, Hp, Wp, C, p, p}).permute({0, 3, 1, 4, 2, 5}).reshape({B, C, Hp * p, Wp * p});
}

PatchEmbed::PatchEmbed(int64_t p, int64_t channels, int64_t embed_dim, TensorOptions opts)
    : patch_size(p),
      in_channels(channels),
      proj(register_module("proj", std::make_shared<Linear>(channels * p * p, embed_dim, true, opts))) {
  TG_CHECK(p > 0 && channels > 0, "PatchEmbed: patch_size ", p, " and in_channels ", channels, " must be positive");
}

Tensor PatchEmbed::forward(const Tensor& images) const {
  check_defined("PatchEmbed", "images", images);
  TG_CHECK(images.dim() == 4 && images.size(1) == in_channels, "PatchEmbed: images must be [B,", in_channels,
           ",H,W], got ", images.shape());
  return forward_patches(patchify(images, patch_size));
}

Tensor PatchEmbed::forward_patches(const Tensor& patches) const {
  check_defined("PatchEmbed", "patches", patches);
  TG_CHECK(patches.dim() == 3 && patches.size(2) == proj->in_features, "PatchEmbed: patches must be [B,N,",
           proj->in_features, "], got ", patches.shape());
  return proj->forward(patches);
}

// ---- timesteps

Tensor timestep_features(const Tensor& t, int64_t dim, double max_period) {
  check_defined("timestep_features", "t", t);
  TG_CHECK(t.dim() == 1, "timestep_features: t must be [B], got ", t.shape());
  TG_CHECK(dim > 0 && max_period > 0, "timestep_features: dim ", dim, " and max_period ", max_period,
           " must be positive");
  TG_CHECK(!t.requires_grad(), "timestep_features: t ", t.shape(),
           " requires grad, but the features are computed from its values and pass no gradient back");
  const int64_t B = t.size(0), half = dim / 2;
  const std::vector<double> times = t.to_vector();
  std::vector<double> frequency(half), features(B * dim, 0.0);
  for (int64_t i = 0; i < half; ++i) frequency[i] = std::exp(-std::log(max_period) * static_cast<double>(i) / half);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < half; ++i) {
      const double arg = times[b] * frequency[i];
      features[b * dim + i] = std::cos(arg);
      features[b * dim + half + i] = std::sin(arg);
    }
  return from_vector(features, {B, dim}, {t.dtype(), t.device()});
}

TimestepEmbedding::TimestepEmbedding(int64_t hidden, int64_t freq_dim, TensorOptions opts)
    : frequency_dim(freq_dim),
      mlp(register_module("mlp", std::make_shared<MLP>(freq_dim, hidden, hidden, Activation::SiLU, opts))) {}

Tensor TimestepEmbedding::forward(const Tensor& t) const { return mlp->forward(timestep_features(t, frequency_dim)); }

// ---- RegionAwareSelfAttention

RegionAwareSelfAttention::RegionAwareSelfAttention(const RegionAttentionConfig& c, double p, AttentionImpl impl,
                                                   TensorOptions opts)
    : heads(checked_heads(c)),
      dropout(p),
      impl(impl),
      qkv(register_module("qkv", std::make_shared<Linear>(c.hidden, 3 * c.hidden, true, opts))),
      out(register_module("out", std::make_shared<Linear>(c.hidden, c.hidden, true, opts))),
      edit_region_bias(register_parameter("edit_region_bias", small_normal({heads, c.max_positions, c.max_positions}, opts))),
      within_edit_bias(register_parameter("within_edit_bias", small_normal({heads, 1, 1}, opts))),
      cross_edit_bias(register_parameter("cross_edit_bias", small_normal({heads, 1, 1}, opts))) {
  check_dropout_p("RegionAwareSelfAttention", "dropout", p);
}

RegionAttentionParams RegionAwareSelfAttention::params() const {
  return {qkv->weight, qkv->bias, out->weight, out->bias, edit_region_bias, within_edit_bias, cross_edit_bias, heads};
}

Tensor RegionAwareSelfAttention::forward(const Tensor& x, const Tensor& edit_mask, const Tensor& attn_mask) const {
  DropoutOptions drop;
  drop.p = is_training() ? dropout : 0.0;
  return region_attention(x, edit_mask, attn_mask, params(), drop, impl);
}

// ---- DiTBlock

DiTBlock::DiTBlock(const RegionAttentionConfig& c, double mlp_ratio, double dropout, AttentionImpl impl,
                   TensorOptions opts)
    : hidden(c.hidden),
      norm1(register_module("norm1", std::make_shared<LayerNorm>(c.hidden, 1e-6, false, opts))),
      attn(register_module("attn", std::make_shared<RegionAwareSelfAttention>(c, dropout, impl, opts))),
      norm2(register_module("norm2", std::make_shared<LayerNorm>(c.hidden, 1e-6, false, opts))),
      mlp(register_module("mlp", std::make_shared<MLP>(c.hidden, mlp_hidden(c.hidden, mlp_ratio), c.hidden,
                                                       Activation::GELU, opts))),
      adaLN_modulation(register_module("adaLN_modulation", zero_linear(c.hidden, 6 * c.hidden, opts))) {}

Tensor DiTBlock::forward(const Tensor& x, const Tensor& c, const Tensor& edit_mask, const Tensor& attn_mask) const {
  check_tokens_and_conditioning("DiTBlock", x, c, hidden);
  const Tensor mod = adaLN_modulation->forward(silu(c)).unsqueeze(1);  // [B,1,6C]
  // shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, each [B,1,C]
  auto chunk = [&](int64_t i) { return mod.narrow(2, i * hidden, hidden); };
  const Tensor attended = attn->forward(modulate(norm1->forward(x), chunk(0), chunk(1)), edit_mask, attn_mask);
  const Tensor h = add(x, mul(chunk(2), attended));
  return add(h, mul(chunk(5), mlp->forward(modulate(norm2->forward(h), chunk(3), chunk(4)))));
}

// ---- FinalLayer

FinalLayer::FinalLayer(int64_t hidden, int64_t out_features, TensorOptions opts)
    : hidden(hidden),
      norm_final(register_module("norm_final", std::make_shared<LayerNorm>(hidden, 1e-6, false, opts))),
      linear(register_module("linear", zero_linear(hidden, out_features, opts))),
      adaLN_modulation(register_module("adaLN_modulation", zero_linear(hidden, 2 * hidden, opts))) {}

Tensor FinalLayer::forward(const Tensor& x, const Tensor& c) const {
  check_tokens_and_conditioning("FinalLayer", x, c, hidden);
  const Tensor mod = adaLN_modulation->forward(silu(c)).unsqueeze(1);  // [B,1,2C]: shift, scale
  return linear->forward(modulate(norm_final->forward(x), mod.narrow(2, 0, hidden), mod.narrow(2, hidden, hidden)));
}

}  // namespace tg::nn
