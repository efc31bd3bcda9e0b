// The attention core of the region-aware layer as ONE op, forward and
// backward each a single fused pass (tensor cores on CUDA), recorded on the
// tape as one node. Per head h, with q, k, v the head's columns of qkv:
//
//   s_ij = scale q_i . k_j + E[h,i,j] + w_in[h] e_i e_j + w_x[h] (e_i (1-e_j) + (1-e_i) e_j)
//          (-inf where a_j = 0);   P = softmax_j(s);   Pd = P m / (1-p);   o_i = sum_j Pd_ij v_j
//
// Gradient rules (the spec's backward; Delta_i = rowsum(do_i * o_i) = rowsum(dP * P),
// so P is recomputed from the saved per-row log-sum-exp and no S x S tensor is kept):
//
//   dP = (do v^T) m / (1-p)         dS = P (dP - Delta)          (0 where a_j = 0)
//   q <- scale dS k      k <- scale dS^T q      v <- Pd^T do       (into the qkv gradient)
//   E <- sum_b dS on the [S,S] corner, 0 elsewhere    w_in <- sum dS e_i e_j    w_x <- sum dS cross_ij
//
// Saves qkv (as fp16 on CUDA at "high", the copy its kernels read), o, the
// log-sum-exp [B,H,S], the masks and the bias parameters;
// the dropout mask is regenerated from Philox (keyed like tg::dropout on the
// [B,H,S,S] probabilities). docs/derivations.md derives it.
//
// The CUDA kernels add a masked key's -inf to its score, so edit_region_bias
// must hold no +inf or NaN (-inf is fine): at a masked key such a bias gives
// a NaN score, and so a NaN row, where the CPU loops and the decomposed graph
// give -inf. Otherwise a NaN or infinite input gives NaN or Inf where the
// decomposed graph does (docs/derivations.md), but for one case: in a row
// that is already NaN, dS at a masked key is NaN (P = 0 times a NaN), where
// the decomposed graph's masked_fill gives 0, so that row's entry of
// grad edit_region_bias at the masked key is NaN too.
//
// Devices: CUDA float32 with head dim 64 runs the fused kernels (at "high"
// on fp16 tensor cores, each operand scaled by a power of two, TF32's
// mantissa; 3xTF32 at "highest"); another head dim or dtype on CUDA is
// a tg::Error (use AttentionImpl::Decomposed). On compute capability 9.0
// (H100, H200) the "high" kernels run on Hopper's warpgroup MMA: the
// backward, and the forward where edit_region_bias's M is a multiple of 4
// and its data 16-byte aligned (its TMA loads need both; else the mma.sync
// forward runs, with the same results up to the order of fp32 sums);
// tg::cuda::enable_warpgroup_attention(false) keeps both on mma.sync. On
// the CPU the same algorithm runs as plain loops, in float32 or float64, any
// head dim: for checking and teaching, not for speed.
#pragma once
#include <vector>

#include "core/cuda.h"
#include "core/tensor.h"
#include "ops/dropout.h"

namespace tg {

// qkv [B,S,3C] (column t*C + h*D + d), edit_mask and attn_mask [B,S] of 0/1,
// edit_region_bias [H,M,M] (S <= M), within/cross_edit_bias [H,1,1]  ->  o [B,S,C].
// Dropout: p and the Philox draw (an explicit mask is not supported).
Tensor fused_attention(const Tensor& qkv, const Tensor& edit_mask, const Tensor& attn_mask,
                       const Tensor& edit_region_bias, const Tensor& within_edit_bias, const Tensor& cross_edit_bias,
                       int64_t heads, const DropoutOptions& dropout = {},
                       MatmulPrecision precision = MatmulPrecision::Default);

// The same core with the qkv projection in the node: qkv = x W^T + b (x
// [B,S,C], qkv_weight [3 H D, C], qkv_bias [3 H D] or undefined), then
// fused_attention. Gradients: those of linear and fused_attention chained.
// One node, so that on CUDA at "high" the backward never holds qkv's float
// gradient [B,S,3C]: its kernel writes dk and dv as fp16 (each group of 16
// keys at its own power-of-two scale, then joined with dq into one fp16
// matrix at one scale) for the projection's fp16 GEMMs; there the k bias
// gradient is exactly 0, its value in exact arithmetic (the rows of dS sum
// to 0), unless dk holds a NaN or an Inf: then the k bias gradient is NaN
// there, non-finite where the decomposed graph's sum is. Elsewhere (CPU,
// "highest") the float gradient and linear's backward, as the two ops would.
Tensor fused_qkv_attention(const Tensor& x, const Tensor& qkv_weight, const Tensor& qkv_bias, const Tensor& edit_mask,
                           const Tensor& attn_mask, const Tensor& edit_region_bias, const Tensor& within_edit_bias,
                           const Tensor& cross_edit_bias, int64_t heads, const DropoutOptions& dropout = {},
                           MatmulPrecision precision = MatmulPrecision::Default);

// The whole layer: y = fused_qkv_attention(...) Wo^T + bo (out_weight
// [out, H D], out_bias [out] or undefined) -> y [B,S,out]. On CUDA at
// "high" one node: the forward kernel writes o's fp16 copy beside o, at a
// scale known before o exists (|o| <= max |v| / (1 - p): o's rows average
// v's, docs/derivations.md "The out-projection in the layer node"), and
// the out-projection's GEMMs read that copy, so o is never converted; the
// backward converts dL/dy alone and reuses the forward's copies of o and
// Wo. Elsewhere (CPU, "highest", an empty problem) the two nodes
// fused_qkv_attention and linear (linear_fp16 at "high"), with the same
// gradients.
Tensor fused_attention_layer(const Tensor& x, const Tensor& qkv_weight, const Tensor& qkv_bias,
                             const Tensor& edit_mask, const Tensor& attn_mask, const Tensor& edit_region_bias,
                             const Tensor& within_edit_bias, const Tensor& cross_edit_bias, const Tensor& out_weight,
                             const Tensor& out_bias, int64_t heads, const DropoutOptions& dropout = {},
                             MatmulPrecision precision = MatmulPrecision::Default);

namespace fused {

// The benchmark interface of shared/spec/region-attention.md: the whole
// layer's backward from the spec's saved tensors, on CUDA, float32.
struct BackwardInputs {
  Tensor grad_output, hidden_states, edit_region_mask, qkv_weight, qkv_bias, out_weight, out_bias,
      edit_region_bias, within_edit_bias, cross_edit_bias, attention_mask, query, key, value,
      attention_scores, attention_probs, attention_probs_dropped, attention_output, dropout_mask;
};

struct Gradients {
  Tensor hidden_states, qkv_weight, qkv_bias, out_weight, out_bias, edit_region_bias, within_edit_bias,
      cross_edit_bias;
};

// The 19 inputs and the 8 outputs in the spec's order, and their names.
std::vector<Tensor> inputs_of(const BackwardInputs& in);
std::vector<Tensor> outputs_of(const Gradients& g);
extern const char* const kInputNames[19];
extern const char* const kOutputNames[8];

// Reads grad_output, hidden_states, the weights, query/key/value,
// attention_probs, attention_probs_dropped, attention_output and the masks (P is
// read, not recomputed: no log-sum-exp is given); modifies none of them, and no
// output may share memory with an input or another output (tg::Error). On the CPU the masks are
// checked to hold only 0 and 1; on CUDA they are taken as given, since that
// check would need a host synchronisation, which this backward never makes.
// Precision on CUDA: at "high" the attention core's backward kernel and the
// four projection GEMMs run on fp16 tensor cores (each operand scaled by a
// power of two into fp16's range: TF32's 10-bit mantissa at twice its rate;
// dS scaled from a bound, docs/derivations.md). The bound holds for
// consistent saved tensors (P's rows sum to 1 or 0, Pd = P m / (1-p),
// o = Pd v); for others the gradients mean nothing, and may be Inf at
// either precision. A non-finite input gives non-finite gradients (at
// "highest" whole rows of NaN: a low part of Inf is Inf - Inf). At "highest"
// the core's kernel and the projections take every operand
// as fp16 hi + 2^-11 lo (to_fp16_split; three fp16 products: fp32-level
// accuracy). Delta comes from the identity rowsum(dP P) = rowsum(do o), with
// the given o. Where the exact dS cancels to 0 (a row with one unmasked key,
// S = 1, or a softmax saturated to one-hot in fp32), the spec's formula,
// Delta made from its own dP, gives exactly 0 there, and this backward the
// rounding of that identity: ~2^-11 (at "high") or ~2^-22 (at "highest") of
// sum_j P |dP|. With a saturated softmax (logits spread by ~10^4) that is
// 10x to 10^5x fp32's error on dx, dWqkv, dbqkv and dE at "highest"; with
// logits spread by ~10, or one key per row, every output is within 10x
// fp32's error plus 1e-6 of its scale (tests/stress_capi.py, bench/NOTES.md
// version 29).
Gradients region_attention_backward(const BackwardInputs& in, double scale, double dropout_p,
                                    MatmulPrecision precision = MatmulPrecision::Default);

// The same, writing into `out` (every element, zeros included), for the C API.
void region_attention_backward_into(const BackwardInputs& in, double scale, double dropout_p,
                                    MatmulPrecision precision, const Gradients& out);

}  // namespace fused

}  // namespace tg
