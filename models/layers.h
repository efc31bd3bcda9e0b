// The layers of a DiT-style edit-diffusion model, as tg::nn::Modules built
// from the ops in ops/*.h: the tape composes their backward, so none of them
// has a backward of its own. Parameter names follow PyTorch and the DiT
// reference code, so a state_dict reads like theirs.
#pragma once
#include <memory>
#include <vector>

#include "models/module.h"
#include "models/region_attention.h"

namespace tg::nn {

// U(-bound, bound) from tg's generator (tg::manual_seed makes it reproducible).
Tensor uniform(const Shape& shape, double bound, TensorOptions opts = {});

// y = x W^T + b; weight [out, in], bias [out]. Initialised like torch.nn.Linear
// (kaiming_uniform with a = sqrt(5)): weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, TensorOptions opts = {});
  Tensor forward(const Tensor& x) const;

  const int64_t in_features, out_features;
  Tensor& weight;
  Tensor& bias;  // undefined when built without bias
};

// Layer norm over the last dim (size `normalized_shape`); weight = 1 and
// bias = 0 when `elementwise_affine`, else none.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     TensorOptions opts = {});
  Tensor forward(const Tensor& x) const;

  const int64_t normalized_shape;
  const double eps;
  Tensor& weight;
  Tensor& bias;
};

// torch.nn.Embedding: a table weight [num_embeddings, embedding_dim] ~ N(0,1);
// forward picks one row per index, as a one-hot [n, num_embeddings] times the
// table, so the tape's matmul gives the table its gradient.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, TensorOptions opts = {});
  Tensor forward(const std::vector<int64_t>& indices) const;  // -> [n, embedding_dim]

  const int64_t num_embeddings, embedding_dim;
  Tensor& weight;
};

enum class Activation { GELU, SiLU };

// fc2(act(fc1(x))): the transformer MLP (GELU, tanh form) and the timestep MLP (SiLU).
class MLP : public Module {
 public:
  MLP(int64_t in_features, int64_t hidden_features, int64_t out_features, Activation activation = Activation::GELU,
      TensorOptions opts = {});
  Tensor forward(const Tensor& x) const;

  const Activation activation;
  std::shared_ptr<Linear> fc1, fc2;
};

// Images [B, C, Hp*p, Wp*p] -> patches [B, Hp*Wp, C*p*p]: patches in row-major
// order, each flattened as (channel, row, column), the layout of a stride-p
// convolution's weight [E, C, p, p]. unpatchify is its inverse.
Tensor patchify(const Tensor& images, int64_t patch_size);
Tensor unpatchify(const Tensor& patches, int64_t patch_size, int64_t grid_height, int64_t grid_width);

// Patch embedding as a Linear on patchify()'s flattened patches: the same
// function as ViT's stride-p convolution, in ops that exist (views and one
// GEMM). forward takes images, forward_patches patches already cut. No
// position embedding: the attention's edit_region_bias [H,M,M] is a learned
// position bias.
class PatchEmbed : public Module {
 public:
  PatchEmbed(int64_t patch_size, int64_t in_channels, int64_t embed_dim, TensorOptions opts = {});
  Tensor forward(const Tensor& images) const;           // [B, C, Hp*p, Wp*p] -> [B, Hp*Wp, E]
  Tensor forward_patches(const Tensor& patches) const;  // [B, N, C*p*p] -> [B, N, E]

  const int64_t patch_size, in_channels;
  std::shared_ptr<Linear> proj;
};

// DiT's sinusoidal timestep features, [B] -> [B, dim]: cos(t f_i) for the
// first half, sin(t f_i) for the second, f_i = max_period^(-i / (dim/2)); a
// zero column pads an odd dim. Computed on the host in float64 (timesteps are
// data: t must not require grad), returned in t's dtype and on t's device.
Tensor timestep_features(const Tensor& t, int64_t dim, double max_period = 10000.0);

// DiT's TimestepEmbedder: an MLP (SiLU) over timestep_features.
class TimestepEmbedding : public Module {
 public:
  explicit TimestepEmbedding(int64_t hidden, int64_t frequency_dim = 256, TensorOptions opts = {});
  Tensor forward(const Tensor& t) const;  // [B] -> [B, hidden]

  const int64_t frequency_dim;
  std::shared_ptr<MLP> mlp;
};

// Region-aware self-attention with edit bias as a module around the
// functional tg::region_attention (models/region_attention.h). Parameters:
// qkv.weight [3C,C], qkv.bias [3C], out.weight [C,C], out.bias [C] (nn.Linear's
// init), edit_region_bias [H,M,M], within_edit_bias and cross_edit_bias
// [H,1,1] (N(0,1) * 0.02, as RegionAttentionParams::init). Dropout on the
// attention probabilities with probability `dropout` in train() only.
class RegionAwareSelfAttention : public Module {
 public:
  explicit RegionAwareSelfAttention(const RegionAttentionConfig& config, double dropout = 0.0,
                                    AttentionImpl impl = AttentionImpl::Decomposed, TensorOptions opts = {});
  // x [B,S,C], edit_mask and attn_mask [B,S] of 0/1 -> [B,S,C].
  Tensor forward(const Tensor& x, const Tensor& edit_mask, const Tensor& attn_mask) const;
  // The parameters as the functional form takes them.
  RegionAttentionParams params() const;

  const int64_t heads;
  double dropout;
  AttentionImpl impl;
  std::shared_ptr<Linear> qkv, out;
  Tensor& edit_region_bias;
  Tensor& within_edit_bias;
  Tensor& cross_edit_bias;
};

// A DiT block with adaLN-Zero conditioning. From c [B,C], adaLN_modulation =
// Linear(SiLU(c)) gives shift, scale and gate for the attention and for the
// MLP; with modulate(h, shift, scale) = h (1 + scale) + shift,
//
//   x = x + gate_msa * attn(modulate(norm1(x), shift_msa, scale_msa))
//   x = x + gate_mlp * mlp(modulate(norm2(x), shift_mlp, scale_mlp))
//
// norm1/norm2 have no affine parameters (the modulation is the affine), and
// adaLN_modulation starts at zero, so a new block is the identity.
class DiTBlock : public Module {
 public:
  DiTBlock(const RegionAttentionConfig& config, double mlp_ratio = 4.0, double dropout = 0.0,
           AttentionImpl impl = AttentionImpl::Decomposed, TensorOptions opts = {});
  // x [B,S,C], c [B,C], edit_mask and attn_mask [B,S] -> [B,S,C].
  Tensor forward(const Tensor& x, const Tensor& c, const Tensor& edit_mask, const Tensor& attn_mask) const;

  const int64_t hidden;
  std::shared_ptr<LayerNorm> norm1;
  std::shared_ptr<RegionAwareSelfAttention> attn;
  std::shared_ptr<LayerNorm> norm2;
  std::shared_ptr<MLP> mlp;
  std::shared_ptr<Linear> adaLN_modulation;
};

// DiT's FinalLayer: from c [B,C], adaLN_modulation = Linear(SiLU(c)) gives
// shift and scale, and x [B,S,C] -> linear(modulate(norm_final(x), shift,
// scale)) [B,S,out_features]. adaLN_modulation and linear start at zero, so a
// new model outputs 0.
class FinalLayer : public Module {
 public:
  FinalLayer(int64_t hidden, int64_t out_features, TensorOptions opts = {});
  Tensor forward(const Tensor& x, const Tensor& c) const;

  const int64_t hidden;
  std::shared_ptr<LayerNorm> norm_final;
  std::shared_ptr<Linear> linear;
  std::shared_ptr<Linear> adaLN_modulation;
};

}  // namespace tg::nn
