// Region-aware self-attention with edit bias (the attention of edit-diffusion
// models such as Step1X-Edit), built as a graph of small ops so its backward
// comes from the tape. The operator is specified in shared/spec/region-attention.md.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/dropout.h"

namespace tg {

struct RegionAttentionConfig {
  int64_t hidden = 1024;         // C
  int64_t heads = 16;            // H; head_dim D = C / H
  int64_t max_positions = 1024;  // M
};
// hidden a positive multiple of heads, max_positions positive; errors name op.
void check_region_attention_config(const char* op, const RegionAttentionConfig& c);

struct RegionAttentionParams {
  Tensor qkv_weight;        // [3C, C]
  Tensor qkv_bias;          // [3C]
  Tensor out_weight;        // [C, C]
  Tensor out_bias;          // [C]
  Tensor edit_region_bias;  // [H, M, M]
  Tensor within_edit_bias;  // [H, 1, 1]
  Tensor cross_edit_bias;   // [H, 1, 1]
  int64_t heads = 16;

  // Weights and position/edit biases ~ N(0,1) * 0.02, linear biases zero; all require grad.
  static RegionAttentionParams init(const RegionAttentionConfig& cfg, TensorOptions opts = {});
  std::vector<Tensor> parameters() const;
  // A copy on `device` whose parameters are new leaves that require grad,
  // each with memory of its own (a clone where it is on `device` already):
  // training it, or its gradients, leave this one as it is.
  RegionAttentionParams trainable_copy(Device device) const;
};

// How the attention core runs: as the graph of small ops, or as one fused op
// (ops/fused_attention.h, fused_attention_layer): on CUDA at "high" one node
// for the whole layer, both projections on fp16 tensor cores; elsewhere one
// node for the qkv projection and the core, then the out-projection's
// linear. The projections are cuBLAS GEMMs on CUDA. Fused on CUDA needs
// float32 and head dim 64 (else a tg::Error); on the CPU it runs the fused
// algorithm as loops.
enum class AttentionImpl { Decomposed, Fused };

// The layer: x [B,S,C]; edit_mask [B,S] (1 = inside the edit region);
// attn_mask [B,S] (0 = masked key); both hold only 0 and 1.
Tensor region_attention(const Tensor& x, const Tensor& edit_mask, const Tensor& attn_mask,
                        const RegionAttentionParams& params, const DropoutOptions& dropout = {},
                        AttentionImpl impl = AttentionImpl::Decomposed);

// The decomposed form, op by op.
Tensor region_attention_decomposed(const Tensor& x, const Tensor& edit_mask, const Tensor& attn_mask,
                                   const RegionAttentionParams& params, const DropoutOptions& dropout = {});

}  // namespace tg
