#include "models/region_attention.h"

#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "ops/binary_mask.h"
#include "ops/edit_bias.h"
#include "ops/elementwise.h"
#include "ops/fused_attention.h"
#include "ops/masked_fill.h"
#include "ops/matmul.h"
#include "ops/softmax.h"
#include "ops/views.h"

namespace tg {

void check_region_attention_config(const char* op, const RegionAttentionConfig& c) {
  TG_CHECK(c.heads > 0 && c.hidden > 0 && c.hidden % c.heads == 0 && c.max_positions > 0, op, ": hidden ", c.hidden,
           " must be a positive multiple of heads ", c.heads, ", and max_positions ", c.max_positions, " positive");
}

RegionAttentionParams RegionAttentionParams::init(const RegionAttentionConfig& cfg, TensorOptions opts) {
  check_region_attention_config("RegionAttentionParams::init", cfg);
  opts.requires_grad = false;
  const int64_t C = cfg.hidden, H = cfg.heads, M = cfg.max_positions;
  auto small_normal = [&](const Shape& s) { return mul(randn(s, opts), 0.02).requires_grad_(); };
  RegionAttentionParams p;
  p.qkv_weight = small_normal({3 * C, C});
  p.qkv_bias = zeros({3 * C}, opts).requires_grad_();
  p.out_weight = small_normal({C, C});
  p.out_bias = zeros({C}, opts).requires_grad_();
  p.edit_region_bias = small_normal({H, M, M});
  p.within_edit_bias = small_normal({H, 1, 1});
  p.cross_edit_bias = small_normal({H, 1, 1});
  p.heads = H;
  return p;
}

namespace {
// The parameters in parameters()' order, with their names.
constexpr std::pair<Tensor RegionAttentionParams::*, const char*> kParameters[] = {
    {&RegionAttentionParams::qkv_weight, "qkv_weight"},
    {&RegionAttentionParams::qkv_bias, "qkv_bias"},
    {&RegionAttentionParams::out_weight, "out_weight"},
    {&RegionAttentionParams::out_bias, "out_bias"},
    {&RegionAttentionParams::edit_region_bias, "edit_region_bias"},
    {&RegionAttentionParams::within_edit_bias, "within_edit_bias"},
    {&RegionAttentionParams::cross_edit_bias, "cross_edit_bias"}};
}  // namespace

std::vector<Tensor> RegionAttentionParams::parameters() const {
  std::vector<Tensor> all;
  for (const auto& [member, name] : kParameters) all.push_back(this->*member);
  return all;
}

RegionAttentionParams RegionAttentionParams::trainable_copy(Device device) const {
  RegionAttentionParams copy = *this;
  for (const auto& [member, name] : kParameters) {
    check_defined("RegionAttentionParams::trainable_copy", name, copy.*member);
    const Tensor leaf = (copy.*member).detach();
    copy.*member = (leaf.device() == device ? leaf.clone() : leaf.to(device)).requires_grad_();
  }
  return copy;
}

namespace {
// x [B,S,C] and every parameter defined, with the shapes of a layer of hidden
// C and p.heads heads (so that a bias of another head count is not broadcast).
void check_layer(const Tensor& x, const RegionAttentionParams& p) {
  const char* op = "region_attention";
  check_defined(op, "x", x);
  TG_CHECK(x.dim() == 3, op, ": x must be [B,S,C], got ", x.shape());
  const int64_t C = x.shape()[2], H = p.heads;
  TG_CHECK(H > 0 && C % H == 0, op, ": hidden ", C, " is not divisible by heads ", H);
  const Tensor& E = p.edit_region_bias;
  check_defined(op, "edit_region_bias", E);
  TG_CHECK(E.dim() == 3 && E.shape()[0] == H && E.shape()[1] == E.shape()[2], op, ": edit_region_bias must be [", H,
           ",M,M], got ", E.shape());
  for (const auto& [t, name, shape] :
       {std::tuple{&p.qkv_weight, "qkv_weight", Shape{3 * C, C}}, {&p.qkv_bias, "qkv_bias", Shape{3 * C}},
        {&p.out_weight, "out_weight", Shape{C, C}}, {&p.out_bias, "out_bias", Shape{C}},
        {&p.within_edit_bias, "within_edit_bias", Shape{H, 1, 1}},
        {&p.cross_edit_bias, "cross_edit_bias", Shape{H, 1, 1}}}) {
    check_defined(op, name, *t);
    TG_CHECK(t->shape() == shape, op, ": ", name, " must be ", shape, ", got ", t->shape());
  }
}
}  // namespace

Tensor region_attention_decomposed(const Tensor& x, const Tensor& edit_mask, const Tensor& attn_mask,
                                   const RegionAttentionParams& p, const DropoutOptions& drop) {
  check_layer(x, p);
  const int64_t B = x.shape()[0], S = x.shape()[1], C = x.shape()[2], H = p.heads;
  TG_CHECK(edit_mask.defined() && edit_mask.shape() == Shape({B, S}), "region_attention: edit_mask must be [",
           B, ",", S, "], got ", edit_mask.defined() ? to_string(edit_mask.shape()) : "undefined");
  TG_CHECK(attn_mask.defined() && attn_mask.shape() == Shape({B, S}), "region_attention: attn_mask must be [",
           B, ",", S, "], got ", attn_mask.defined() ? to_string(attn_mask.shape()) : "undefined");
  check_binary_mask("region_attention", "attn_mask", attn_mask);
  const int64_t D = C / H;

  const Tensor qkv = linear(x, p.qkv_weight, p.qkv_bias)       // [B,S,3C], column t*C + h*D + d
                         .view({B, S, 3, H, D})
                         .permute({2, 0, 3, 1, 4});             // [3,B,H,S,D]
  const Tensor q = qkv.narrow(0, 0, 1).squeeze(0);
  const Tensor k = qkv.narrow(0, 1, 1).squeeze(0);
  const Tensor v = qkv.narrow(0, 2, 1).squeeze(0);

  Tensor s = mul(matmul(q, k.transpose(-1, -2)), 1.0 / std::sqrt(static_cast<double>(D)));
  s = add(s, edit_bias(p.edit_region_bias, p.within_edit_bias, p.cross_edit_bias, edit_mask));
  const Tensor key_masked = add(neg(attn_mask), 1.0).view({B, 1, 1, S});  // 1 where a == 0
  s = masked_fill(s, key_masked, -std::numeric_limits<double>::infinity());
  const Tensor probs = dropout(softmax(s), drop);                            // Pd
  const Tensor o = matmul(probs, v).permute({0, 2, 1, 3}).reshape({B, S, C});  // heads concatenated
  return linear(o, p.out_weight, p.out_bias);
}


Tensor region_attention(const Tensor& x, const Tensor& edit_mask, const Tensor& attn_mask,
                        const RegionAttentionParams& params, const DropoutOptions& dropout, AttentionImpl impl) {
  if (impl == AttentionImpl::Decomposed) return region_attention_decomposed(x, edit_mask, attn_mask, params, dropout);
  check_layer(x, params);
  // Both projections are part of the fused layer (one node on CUDA at "high").
  return fused_attention_layer(x, params.qkv_weight, params.qkv_bias, edit_mask, attn_mask, params.edit_region_bias,
                               params.within_edit_bias, params.cross_edit_bias, params.out_weight, params.out_bias,
                               params.heads, dropout);
}

}  // namespace tg
