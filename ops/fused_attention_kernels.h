// The fused attention kernels' arguments and entry points, and the pieces of
// the math both back ends share (the score of one (i, j) pair).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/cuda.h"
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "ops/edit_bias_kernels.h"
#include "ops/reduce_kernels.h"

namespace tg {

struct AttentionDims {
  int64_t B, H, S, D, M;
};

// The forward's inputs. q, k, v: [B,H,S,D] tensors with a unit d stride
// (views of the projection qkv [B,S,3C], or contiguous tensors).
struct AttentionInputs {
  Tensor q, k, v;
  Tensor edit_mask, attn_mask;               // [B,S], 0/1, contiguous
  Tensor edit_region_bias, within, cross;    // [H,M,M], [H], [H], contiguous
  AttentionDims d;
  double scale = 1, p = 0;                   // dropout only when p > 0
  PhiloxState rng;
};

// The backward's extra inputs and its outputs. P comes from the log-sum-exp
// (training: recomputed, the dropout mask regenerated) or, when probs is
// defined, is read from probs and probs_dropped [B,H,S,S] (the benchmark
// interface). Outputs are zeroed by the caller and accumulated atomically:
// dq, dk, dv [B,H,S,D] views (unit d stride); when defined (wanted), dE [H,M,M],
// dw_in and dw_x [H], the per-key column sums of dS and the per-query row sums
// of Pd [B,H,S] (for the careful bias gradient of the benchmark).
struct AttentionGradTensors {
  Tensor dout;                  // dL/do [B,S,C], contiguous
  Tensor lse, delta;            // [B,H,S]
  Tensor probs, probs_dropped;  // optional [B,H,S,S]
  Tensor dq, dk, dv, dE, dw_in, dw_x;
  Tensor colsum_ds, rowsum_pd;  // optional
};

// The score of query i against key j of head h before masking.
template <class T>
TG_HD T attention_score(T qk, T scale, T E_hij, T w_in, T w_x, T ei, T ej) {
  return scale * qk + E_hij + w_in * ei * ej + w_x * cross_term(ei, ej);
}

template <Device Dev>
struct FusedAttentionKernels {
  // o [B,S,C] (head h in columns h*D ..) and the log-sum-exp lse [B,H,S]
  // (-inf for a row whose keys are all masked; its o is 0).
  static void forward(const AttentionInputs& in, const Tensor& o, const Tensor& lse, MatmulPrecision precision);
  // delta[b,h,i] = sum_d dout[b,i,h*D+d] o[b,i,h*D+d].
  static void row_dot(const Tensor& dout, const Tensor& o, const Tensor& delta, AttentionDims d);
  static void backward(const AttentionInputs& in, const AttentionGradTensors& g, MatmulPrecision precision);
};

// out[h*D + d] = factor * sum over (b, s) of w[b,h,s] x[b,h,s,d], written once
// for both devices as column sums over the B*S token rows: the qkv bias
// gradient of the benchmark interface from fp32 row and column sums.
template <class T>
struct HeadWeighted {
  const T *w, *x;
  int64_t S, H, D, sb, sh, ss;
  T factor;
  TG_HD T operator()(int64_t r, int64_t c) const {
    // 32-bit quotients (B*S and H*D fit, checked by the caller): a 64-bit division costs several times more
    const uint32_t b = uint32_t(r) / uint32_t(S), s = uint32_t(r) - b * uint32_t(S);
    const uint32_t h = uint32_t(c) / uint32_t(D), d = uint32_t(c) - h * uint32_t(D);
    return factor * w[(b * H + h) * S + s] * x[b * sb + h * sh + s * ss + d];
  }
};

template <Device Dev>
struct AttentionBiasKernels {
  // weights [B,H,S], x [B,H,S,D] (unit d stride), out [H*D] contiguous.
  static void head_weighted_sums(const Tensor& weights, const Tensor& x, double factor, const Tensor& out);
};
TG_EXTERN_CUDA_KERNELS(AttentionBiasKernels);

template <Device Dev>
void AttentionBiasKernels<Dev>::head_weighted_sums(const Tensor& w, const Tensor& x, double factor, const Tensor& out) {
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3);
  if (B * S == 0 || H * D == 0) return;
  TG_CHECK(B * S <= UINT32_MAX && H * D <= UINT32_MAX, "fused_attention (qkv bias): ", B, " x ", S, " tokens or ", H,
           " x ", D, " columns exceed 32-bit indexing");
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    const HeadWeighted<T> value{w.data<T>(), x.data<T>(), S, H, D, x.strides()[0], x.strides()[1], x.strides()[2],
                                static_cast<T>(factor)};
    column_sums_with(Loop<Dev>{"fused_attention (qkv bias)"}, value, B * S, H * D, out.data<T>(), x.device());
  });
}

}  // namespace tg
