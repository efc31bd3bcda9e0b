#include "ops/fused_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "core/pack.h"
#include "core/random.h"
#include "ops/binary_mask.h"
#include "ops/copy.h"
#include "ops/fused_attention_kernels.h"
#include "ops/matmul.h"
#include "ops/matmul_kernels.h"
#include "ops/reduce.h"
#include "ops/reduce_kernels.h"
#include "ops/untracked.h"

namespace tg {

TG_INSTANTIATE_KERNELS(AttentionBiasKernels, Device::CPU);

// ---- CPU kernels: the algorithm of the CUDA kernels as plain loops (key
// blocks of 64 with an online softmax, P recomputed from the log-sum-exp,
// Delta from do . o), in float32 or float64, for any head dim.

namespace {

constexpr int64_t kKeyBlock = 64;  // the CUDA kernels' key tile

// Element (b, h, s, d) of a [B,H,S,D] view with a unit d stride.
template <class T>
struct Heads {
  T* ptr;
  int64_t sb, sh, ss;
  explicit Heads(const Tensor& t)
      : ptr(t.data<std::remove_const_t<T>>()), sb(t.strides()[0]), sh(t.strides()[1]), ss(t.strides()[2]) {}
  T* row(int64_t b, int64_t h, int64_t s) const { return ptr + b * sb + h * sh + s * ss; }
};

template <class T>
T dot(const T* x, const T* y, int64_t n) {
  T acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * y[i];
  return acc;
}

// The (b, h) problem's scores, row by row, as the kernels see them.
template <class T>
struct CpuScores {
  const AttentionInputs& in;
  Heads<const T> q, k;
  const T *e, *a, *E, *w_in, *w_x;

  explicit CpuScores(const AttentionInputs& inputs)
      : in(inputs), q(inputs.q), k(inputs.k), e(inputs.edit_mask.data<T>()), a(inputs.attn_mask.data<T>()),
        E(inputs.edit_region_bias.data<T>()), w_in(inputs.within.data<T>()), w_x(inputs.cross.data<T>()) {}

  // s_ij, or -inf for a masked key.
  T operator()(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const AttentionDims& d = in.d;
    if (a[b * d.S + j] == T(0)) return -std::numeric_limits<T>::infinity();
    return attention_score<T>(dot(q.row(b, h, i), k.row(b, h, j), d.D), static_cast<T>(in.scale),
                              E[(h * d.M + i) * d.M + j], w_in[h], w_x[h], e[b * d.S + i], e[b * d.S + j]);
  }
  // keep_ij / (1 - p): the dropout factor of the Philox mask on the [B,H,S,S] probabilities.
  T keep_scale(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (in.p == 0) return T(1);
    const int64_t row = (b * in.d.H + h) * in.d.S + i;
    const bool kept = dropout_bits(in.rng, row, j, in.d.S) >= dropout_keep_threshold(static_cast<float>(in.p));
    return kept ? static_cast<T>(1 / (1 - in.p)) : T(0);
  }
};

template <class T>
void cpu_forward(const AttentionInputs& in, const Tensor& o_t, const Tensor& lse_t) {
  const AttentionDims d = in.d;
  const CpuScores<T> score(in);
  const Heads<const T> v(in.v);
  T* o = o_t.data<T>();
  T* lse = lse_t.data<T>();
  const T inf = std::numeric_limits<T>::infinity();
  cpu::parallel_for(d.B * d.H * d.S, [&](int64_t row) {
    const int64_t i = row % d.S, h = (row / d.S) % d.H, b = row / (d.S * d.H);
    std::vector<T> acc(d.D, T(0)), s(kKeyBlock);
    T m = -inf, l = 0;
    for (int64_t j0 = 0; j0 < d.S; j0 += kKeyBlock) {
      const int64_t n = std::min(kKeyBlock, d.S - j0);
      T block_max = -inf;
      for (int64_t j = 0; j < n; ++j) block_max = std::max(block_max, s[j] = score(b, h, i, j0 + j));
      const T m_new = std::max(m, block_max);
      const T shift = m_new == -inf ? T(0) : m_new;  // all masked so far: nothing to rescale
      const T correction = std::exp(m - shift);
      l *= correction;
      for (T& x : acc) x *= correction;
      for (int64_t j = 0; j < n; ++j) {
        const T p = std::exp(s[j] - shift);
        l += p;
        const T pd = p * score.keep_scale(b, h, i, j0 + j);
        const T* vj = v.row(b, h, j0 + j);
        for (int64_t dd = 0; dd < d.D; ++dd) acc[dd] += pd * vj[dd];
      }
      m = m_new;
    }
    // l is 0 only where every key is masked (o 0, lse -inf); a NaN l (a NaN
    // or +inf score: std::max passes over NaN, so it shows in l) gives NaN.
    T* oi = o + (b * d.S + i) * d.H * d.D + h * d.D;
    for (int64_t dd = 0; dd < d.D; ++dd) oi[dd] = l != 0 ? acc[dd] / l : T(0);
    lse[row] = l != 0 ? m + std::log(l) : -inf;
  });
}

template <class T>
void cpu_row_dot(const Tensor& dout, const Tensor& o, const Tensor& delta, AttentionDims d) {
  const T *g = dout.data<T>(), *y = o.data<T>();
  T* out = delta.data<T>();
  cpu::parallel_for(d.B * d.H * d.S, [&](int64_t row) {
    const int64_t i = row % d.S, h = (row / d.S) % d.H, b = row / (d.S * d.H);
    const int64_t at = (b * d.S + i) * d.H * d.D + h * d.D;
    out[row] = dot(g + at, y + at, d.D);
  });
}

// Zeroes what the backward adds to in dE [H,M,M], or does not write: all of
// it, or for B = 1 (the [S,S] corner written) the rest when the corner is at
// least half of it (else one whole fill is cheaper: H200, 373/1 took 9 us
// longer with two partial fills). The first partial fill starts at a column
// that is a multiple of 4 (16-byte stores); the backward writes over the
// corner's columns it zeroes.
void zero_edit_bias_gradient(const Tensor& dE, const AttentionDims& d) {
  if (d.B != 1 || 2 * d.S * d.S < d.M * d.M) return fill_into(dE, 0.0);
  const int64_t from = d.S / 4 * 4;
  fill_into(dE.narrow(1, 0, d.S).narrow(2, from, d.M - from), 0.0);
  fill_into(dE.narrow(1, d.S, d.M - d.S), 0.0);
}

template <class T>
void cpu_backward(const AttentionInputs& in, const AttentionGradTensors& g) {
  const AttentionDims d = in.d;
  const CpuScores<T> score(in);
  const Heads<const T> q(in.q), k(in.k), v(in.v);
  const Heads<T> dq(g.dq), dk(g.dk), dv(g.dv);
  const T *dout = g.dout.data<T>(), *delta = g.delta.data<T>(), *e = in.edit_mask.data<T>();
  const T* lse = g.probs.defined() ? nullptr : g.lse.data<T>();
  const T *P = data_or_null<T>(g.probs), *Pd = data_or_null<T>(g.probs_dropped);
  T *dE = data_or_null<T>(g.dE), *dw_in = data_or_null<T>(g.dw_in), *dw_x = data_or_null<T>(g.dw_x);
  T *colsum = data_or_null<T>(g.colsum_ds), *rowsum = data_or_null<T>(g.rowsum_pd);
  const T scale = static_cast<T>(in.scale), inf = std::numeric_limits<T>::infinity();
  TG_CHECK(g.keys_zeroed, "fused_attention_backward (CPU): dk and dv must be zeroed (this backward adds to them)");
  if (dE && d.B == 1) fill_into(g.dE.narrow(1, 0, d.S).narrow(2, 0, d.S), 0.0);  // the corner is written, as on CUDA
  cpu::parallel_for(d.H, [&](int64_t h) {  // heads write disjoint outputs
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t i = 0; i < d.S; ++i) {
        const int64_t row = (b * d.H + h) * d.S + i;
        const T* do_i = dout + (b * d.S + i) * d.H * d.D + h * d.D;
        for (int64_t j = 0; j < d.S; ++j) {
          const int64_t at = row * d.S + j;
          const T dpd = dot(do_i, v.row(b, h, j), d.D);
          T p, pd, ds;
          if (P) {  // read: dS = Pd dPd - P Delta, since P dP = Pd dPd
            p = P[at];
            pd = Pd[at];
            ds = pd * dpd - p * delta[row];
          } else {  // recompute P from the log-sum-exp and regenerate the mask
            const T s = score(b, h, i, j);
            p = (s == -inf || lse[row] == -inf) ? T(0) : std::exp(s - lse[row]);
            const T keep = score.keep_scale(b, h, i, j);
            pd = p * keep;
            ds = p * (dpd * keep - delta[row]);
          }
          const T ei = e[b * d.S + i], ej = e[b * d.S + j];
          const T *qi = q.row(b, h, i), *kj = k.row(b, h, j);
          T *dqi = dq.row(b, h, i), *dkj = dk.row(b, h, j), *dvj = dv.row(b, h, j);
          for (int64_t dd = 0; dd < d.D; ++dd) {
            dqi[dd] += scale * ds * kj[dd];
            dkj[dd] += scale * ds * qi[dd];
            dvj[dd] += pd * do_i[dd];
          }
          if (dE) dE[(h * d.M + i) * d.M + j] += ds;
          if (dw_in) dw_in[h] += ds * ei * ej, dw_x[h] += ds * cross_term(ei, ej);
          if (colsum) colsum[(b * d.H + h) * d.S + j] += ds;
          if (rowsum) rowsum[row] += pd;
        }
      }
  });
}

}  // namespace

template <>
void FusedAttentionKernels<Device::CPU>::forward(const AttentionInputs& in, const Tensor& o, const Tensor& lse,
                                                 MatmulPrecision, const Tensor& o_half) {
  TG_CHECK(!o_half.defined(), "fused_attention: o's fp16 copy exists on CUDA only");
  TG_DISPATCH_FLOAT(o.dtype(), T, [&] { cpu_forward<T>(in, o, lse); });
}

template <>
void FusedAttentionKernels<Device::CPU>::row_dot(const Tensor& dout, const Tensor& o, const Tensor& delta,
                                                 AttentionDims d) {
  TG_DISPATCH_FLOAT(o.dtype(), T, [&] { cpu_row_dot<T>(dout, o, delta, d); });
}

template <>
void FusedAttentionKernels<Device::CPU>::backward(const AttentionInputs& in, const AttentionGradTensors& g,
                                                  MatmulPrecision) {
  for (const Tensor* t : {&g.dw_in, &g.dw_x})  // written, as sums (added to below)
    if (t->defined()) fill_into(*t, 0.0);
  TG_DISPATCH_FLOAT(g.dout.dtype(), T, [&] { cpu_backward<T>(in, g); });
}

template <>
bool FusedAttentionKernels<Device::CPU>::writes_key_gradients(const AttentionDims&, MatmulPrecision, bool) {
  return false;
}

template <>
int64_t FusedAttentionKernels<Device::CPU>::edit_bias_sums_size(const AttentionDims&, MatmulPrecision, bool) {
  return 0;  // the CPU backward adds into dw_in and dw_x
}

template <>
KernelResidency FusedAttentionKernels<Device::CPU>::backward_residency(MatmulPrecision, bool) {
  TG_FAIL("fused_attention_backward: CTAs per SM exist on CUDA only");
}

template <>
void FusedAttentionKernels<Device::CPU>::finish_edit_bias_sums(const AttentionInputs&, const AttentionGradTensors&,
                                                               MatmulPrecision, bool) {
  TG_FAIL("fused_attention_backward: the edit-bias sums' scratch exists on CUDA only");
}

template <>
void FusedAttentionKernels<Device::CPU>::reset_key_halves(const HalfKeyGradients&) {
  TG_FAIL("fused_attention_backward: fp16 key gradients exist on CUDA only");
}

template <>
void FusedAttentionKernels<Device::CPU>::reduce_dq(const Tensor&, const HalfKeyGradients&, const AttentionDims&) {
  TG_FAIL("reduce_dq: fp16 key gradients exist on CUDA only");
}

template <>
void FusedAttentionKernels<Device::CPU>::join_half_qkv(const Tensor&, const HalfKeyGradients&, const AttentionDims&,
                                                       const Tensor&) {
  TG_FAIL("join_half_qkv: fp16 key gradients exist on CUDA only");
}

// ---- the op

namespace {

constexpr int64_t kCudaHeadDim = 64;  // the head dim the CUDA kernels cover

// Head view t (0 = q, 1 = k, 2 = v) of qkv [B,S,3C] as [B,H,S,D]; no copy.
Tensor head_view(const Tensor& qkv, int64_t t, int64_t H) {
  const int64_t B = qkv.size(0), S = qkv.size(1), C3 = qkv.size(2), D = C3 / 3 / H;
  return make_view(qkv, {B, H, S, D}, {S * C3, D, C3, 1}, qkv.offset() + t * H * D);
}

// The gradient of qkv [B,S,3C] for the backward kernels, as g's dq, dk, dv,
// not zeroed yet (zero_qkv_gradient); g.keys_zeroed: whether the kernels add
// to dk and dv too, rather than write them.
Tensor qkv_gradient(const Tensor& like, const AttentionDims& d, MatmulPrecision precision, bool read,
                    AttentionGradTensors& g) {
  g.keys_zeroed = !TG_DISPATCH_DEVICE(like, FusedAttentionKernels, writes_key_gradients, d, precision, read);
  const Tensor dqkv = empty({d.B, d.S, 3 * d.H * d.D}, {like.dtype(), like.device()});
  g.dq = head_view(dqkv, 0, d.H), g.dk = head_view(dqkv, 1, d.H), g.dv = head_view(dqkv, 2, d.H);
  return dqkv;
}

// Zeroes what the kernels add to in qkv_gradient's dqkv: the q columns, or all.
void zero_qkv_gradient(const Tensor& dqkv, const AttentionGradTensors& g) {
  if (g.keys_zeroed) return fill_into(dqkv, 0.0);
  const int64_t C3 = dqkv.size(2);
  fill_into(rows_view(dqkv, C3).narrow(1, 0, C3 / 3), 0.0);
}

// The core's arguments, checked before anything runs: qkv of `qkv_shape`
// [B,S,3C] (named `qkv` in errors: fused_attention's argument, or
// fused_qkv_attention's projection), of `like`'s dtype and device. Errors name op.
void check_core_args(const char* op, const std::string& qkv, const Shape& qkv_shape, const Tensor& like,
                     const Tensor& e, const Tensor& a, const Tensor& E, const Tensor& w_in, const Tensor& w_x,
                     int64_t H) {
  for (const auto& [t, name] : {std::pair{&e, "edit_mask"}, {&a, "attn_mask"}, {&E, "edit_region_bias"},
                                {&w_in, "within_edit_bias"}, {&w_x, "cross_edit_bias"}})
    check_defined(op, name, *t);
  TG_CHECK(qkv_shape.size() == 3, op, ": ", qkv, " must be [B,S,3C], got ", qkv_shape);
  const int64_t B = qkv_shape[0], S = qkv_shape[1];
  TG_CHECK(H > 0 && qkv_shape[2] % (3 * H) == 0, op, ": ", qkv, " ", qkv_shape, " does not split into 3 x ", H,
           " heads");
  const int64_t D = qkv_shape[2] / 3 / H;
  TG_CHECK(E.dim() == 3 && E.size(0) == H && E.size(1) == E.size(2), op, ": edit_region_bias must be [", H,
           ",M,M], got ", E.shape());
  TG_CHECK(S <= E.size(1), op, ": sequence length ", S, " of ", qkv, " ", qkv_shape, " exceeds the ", E.size(1),
           " positions of edit_region_bias ", E.shape());
  TG_CHECK(w_in.shape() == Shape({H, 1, 1}) && w_x.shape() == Shape({H, 1, 1}), op,
           ": within_edit_bias and cross_edit_bias must be [", H, ",1,1], got ", w_in.shape(), " and ", w_x.shape());
  TG_CHECK(e.shape() == Shape({B, S}) && a.shape() == Shape({B, S}), op, ": edit_mask and attn_mask must be [", B, ",",
           S, "], got ", e.shape(), " and ", a.shape());
  for (const Tensor* t : {&e, &a, &E, &w_in, &w_x}) check_same_dtype_device(op, like, *t);
  check_binary_masks(op, {{"edit_mask", e}, {"attn_mask", a}});
  if (like.is_cuda()) {
    TG_CHECK(like.dtype() == DType::Float32, op, ": the CUDA kernels are float32; ", qkv, " ", qkv_shape, " is ",
             like.dtype());
    TG_CHECK(D == kCudaHeadDim, op, ": the CUDA kernels cover head dim ", kCudaHeadDim, "; ", qkv, " ", qkv_shape,
             " with ", H, " heads has head dim ", D, " (use AttentionImpl::Decomposed)");
    check_cuda_batch_heads(op, B, H);  // before the projection runs and a dropout draw is taken
  }
}

// The kernels' view of checked arguments: from qkv [B,S,3C] (qkv_shape), or
// from its fp16 copy alone (qkv undefined, qkv_half given: linear_to_fp16's),
// whose q, k and v are then undefined.
AttentionInputs core_inputs_of(const Shape& qkv_shape, const Tensor& qkv, Fp16Group qkv_half, const Tensor& e,
                               const Tensor& a, const Tensor& E, const Tensor& w_in, const Tensor& w_x, int64_t H) {
  const int64_t B = qkv_shape[0], S = qkv_shape[1], D = qkv_shape[2] / 3 / H;
  AttentionInputs in;
  if (qkv.defined()) {
    const Tensor q = materialize_aligned(qkv);  // the CUDA kernels read 16-byte vectors of q, k, v
    in.qkv = q;
    in.q = head_view(q, 0, H);
    in.k = head_view(q, 1, H);
    in.v = head_view(q, 2, H);
  }
  in.qkv_half = std::move(qkv_half);
  in.edit_mask = materialize(e);
  in.attn_mask = materialize(a);
  in.edit_region_bias = materialize(E);
  in.within = materialize(w_in).view({H});
  in.cross = materialize(w_x).view({H});
  in.d = {B, H, S, D, E.size(1)};
  in.scale = 1.0 / std::sqrt(static_cast<double>(D));
  return in;
}

void check_dropout(const char* op, const DropoutOptions& dropout) {
  check_dropout_p(op, "dropout p", dropout.p);
  TG_CHECK(!dropout.mask.defined(), op, ": an explicit dropout mask is not supported (the kernels draw it from "
           "Philox); pass p and optionally rng");
}

// p and the Philox draw (the default generator's next, unless given).
void draw_dropout(const DropoutOptions& dropout, AttentionInputs& in) {
  in.p = dropout.p;
  if (in.p > 0) in.rng = dropout.rng ? *dropout.rng : default_generator().next();
}

// The core's saved tensors, first in a node's list: q, k, v (undefined where
// the fp16 copy is kept), o, lse, the masks, the bias parameters, and the
// fp16 copy's values and scalars.
enum CoreSaved : size_t { kQ, kK, kV, kO, kLse, kEditMask, kAttnMask, kE, kWithin, kCross, kHalfValues, kHalfScalars,
                          kCoreSaved };

// Whether the core's kernels read qkv's fp16 copy (CUDA, "high", a nonempty
// problem: B H S rows of queries).
bool core_reads_half_qkv(const Tensor& qkv, MatmulPrecision precision, int64_t query_rows) {
  return qkv.is_cuda() && precision == MatmulPrecision::High && query_rows > 0;
}

// The core's forward on checked inputs: o [B,S,C] and the log-sum-exp
// [B,H,S]. At "high" on CUDA the kernels read qkv's fp16 copy (in.qkv_half:
// given, or converted here), which the backward keeps in place of the float
// q, k, v (half their memory); o_half: o's fp16 copy too where defined
// (FusedAttentionKernels::forward).
std::vector<Tensor> core_forward(AttentionInputs& in, MatmulPrecision precision, const Tensor& o_half = Tensor()) {
  const AttentionDims d = in.d;
  const TensorOptions opts{in.edit_region_bias.dtype(), in.edit_region_bias.device()};  // qkv's (checked)
  if (in.qkv_half.matrices.empty() && core_reads_half_qkv(in.qkv, precision, d.B * d.H * d.S))
    in.qkv_half = to_fp16({rows_view(in.qkv, 3 * d.H * d.D)});
  const bool half_qkv = !in.qkv_half.matrices.empty();
  Tensor o = empty({d.B, d.S, d.H * d.D}, opts);
  const Tensor lse = empty({d.B, d.H, d.S}, opts);
  TG_DISPATCH_DEVICE(o, FusedAttentionKernels, forward, in, o, lse, precision, o_half);
  const auto unless_half = [&](const Tensor& t) { return half_qkv ? Tensor() : t; };
  const Tensor half_values = half_qkv ? in.qkv_half.matrices[0].values : Tensor();
  return {unless_half(in.q), unless_half(in.k), unless_half(in.v), o, lse, in.edit_mask, in.attn_mask,
          in.edit_region_bias, in.within, in.cross, half_values, in.qkv_half.scalars};
}

// The sizes and settings a closure keeps; the tensors live in its saved list.
AttentionInputs core_meta(AttentionInputs in) {
  in.qkv = in.q = in.k = in.v = in.edit_mask = in.attn_mask = in.edit_region_bias = in.within = in.cross = Tensor();
  in.qkv_half = {};
  return in;
}

AttentionInputs core_inputs(AttentionInputs in, const autograd::SavedTensors& s) {
  in.q = s[kQ], in.k = s[kK], in.v = s[kV], in.edit_mask = s[kEditMask], in.attn_mask = s[kAttnMask];
  in.edit_region_bias = s[kE], in.within = s[kWithin], in.cross = s[kCross];
  if (s[kHalfValues].defined()) in.qkv_half = {{{s[kHalfValues], in.d.B * in.d.S, 3 * in.d.H * in.d.D}}, s[kHalfScalars], {}};
  return in;
}

// Delta = rowsum(dout o) per (b, h, i) into delta; with fp16 tiles (half)
// returns dout's fp16 copy (split: to_fp16_split's), converted by the same
// pass over dout where o allows 16-byte loads (to_fp16_with_head_dots).
Fp16Group delta_and_half_dout(const Tensor& dout, const Tensor& o, const Tensor& delta, const AttentionDims& d,
                              bool half, bool split) {
  const Tensor dout_rows = rows_view(dout, d.H * d.D);
  if (half && aligned16(o.raw_data()) && aligned16(dout.raw_data()))
    return to_fp16_with_head_dots(dout_rows, {rows_view(o, d.H * d.D), delta, d.S}, split);
  TG_DISPATCH_DEVICE(dout, FusedAttentionKernels, row_dot, dout, o, delta, d);
  if (!half) return {};
  return split ? to_fp16_split({dout_rows}) : to_fp16({dout_rows});
}

// The backward's start: Delta = rowsum(do o), after which o goes; with fp16
// tiles dO's fp16 copy, after which the float dO goes (both before any
// gradient buffer exists). Then dE (zeroed as the kernel needs) and dw_in,
// dw_x where wanted.
AttentionGradTensors start_core_backward(const AttentionInputs& in, Tensor g, const autograd::SavedTensors& s,
                                         bool needs_E, bool needs_w) {
  const AttentionDims d = in.d;
  const TensorOptions opts{g.dtype(), g.device()};
  AttentionGradTensors gt;
  gt.dout = materialize_aligned(g);
  g = Tensor();
  gt.lse = s[kLse];
  gt.delta = empty({d.B, d.H, d.S}, opts);
  const bool half = !in.qkv_half.matrices.empty();
  gt.dout_half = delta_and_half_dout(gt.dout, s[kO], gt.delta, d, half, false);
  s.release_early(kO);
  if (half) gt.dout = Tensor();
  if (needs_E) {
    gt.dE = empty({d.H, d.M, d.M}, opts);
    zero_edit_bias_gradient(gt.dE, d);
  }
  if (needs_w) gt.dw_in = empty({d.H}, opts), gt.dw_x = empty({d.H}, opts);
  return gt;
}

// The core's kernels into qkv's float gradient [B,S,3C].
Tensor float_qkv_backward(const AttentionInputs& in, AttentionGradTensors& gt, MatmulPrecision precision) {
  const Tensor dqkv = qkv_gradient(gt.delta, in.d, precision, false, gt);
  zero_qkv_gradient(dqkv, gt);
  TG_DISPATCH_DEVICE(dqkv, FusedAttentionKernels, backward, in, gt, precision);
  return dqkv;
}

// The gradients of E, w_in and w_x as the node returns them.
std::vector<Tensor> edit_bias_grads(const AttentionGradTensors& gt, const autograd::GradMask& needs, size_t E) {
  const int64_t H = gt.dw_in.defined() ? gt.dw_in.size(0) : 0;
  return {gt.dE, autograd::grad_if(needs[E + 1], [&] { return gt.dw_in.view({H, 1, 1}); }),
          autograd::grad_if(needs[E + 2], [&] { return gt.dw_x.view({H, 1, 1}); })};
}

// fused_qkv_attention's backward at "high" on CUDA: the core's kernel writes
// dq as float and dk, dv as fp16 (HalfKeyGradients), the three are joined
// into one fp16 dqkv, and the projection's GEMMs read it with fp16 copies of
// x (for dW) and w (for dx), each saved only where needed. The float dqkv
// [B,S,3C] never exists (docs/derivations.md, "The qkv projection in the
// fused node"); q, k, v's fp16 copy and dO's go right after the kernel
// (unless the graph is retained). Returns {dx2, dw, db} where needs says.
std::vector<Tensor> half_qkv_projection_backward(AttentionInputs& in, AttentionGradTensors& gt,
                                                 const autograd::SavedTensors& s, const Tensor& x2, const Tensor& w,
                                                 const autograd::GradMask& needs) {
  const AttentionDims d = in.d;
  const int64_t rows = d.B * d.S, C = d.H * d.D;
  const TensorOptions opts{gt.delta.dtype(), gt.delta.device()};
  Tensor dq = empty({d.B, d.S, C}, opts);
  fill_into(dq, 0.0);
  gt.dq = make_view(dq, {d.B, d.H, d.S, d.D}, {d.S * C, d.D, C, 1}, dq.offset());
  HalfKeyGradients& kv = gt.key_halves;
  kv.values = empty({rows * C}, opts);  // [B S, 2C] fp16
  kv.exponents = empty({d.B * d.H * ((d.S + kHalfKeyGroup - 1) / kHalfKeyGroup)}, opts);
  kv.scratch = empty({2}, opts);
  kv.db = empty({3 * C}, opts);  // dbk = 0 (the rows of dS sum to 0) but for a NaN or Inf in dk
  TG_DISPATCH_DEVICE(dq, FusedAttentionKernels, reset_key_halves, kv);
  TG_DISPATCH_DEVICE(dq, FusedAttentionKernels, backward, in, gt, MatmulPrecision::High);
  for (const size_t i : {kHalfValues, kHalfScalars, kLse}) s.release_early(i);
  in.qkv_half = {};
  gt.dout_half = {};
  gt.dq = gt.lse = gt.delta = Tensor();
  // x's and w's fp16 copies (x for dW, w for dx) beside dq's reduction and
  // the join, off the step's critical path. They are allocated after the
  // kernel in stream order, once q, k, v's copy is freed: at 8 x 1024 the
  // step's peak grows by 5 MiB (bench/NOTES.md version 53).
  const bool projection_grads = needs[0] || needs[1];
  std::vector<Tensor> operands;
  if (needs[1]) operands.push_back(x2);
  if (needs[0]) operands.push_back(w);
  const Fp16Group converted = projection_grads ? fp16_group(operands) : Fp16Group{};
  cuda::Fork convert_operands(projection_grads);
  if (projection_grads) convert_operands.run([&] { convert_to_fp16(operands, converted); });
  TG_DISPATCH_DEVICE(dq, FusedAttentionKernels, reduce_dq, dq, kv, d);  // dbq, and dq's max for join_half_qkv
  const Tensor db = kv.db;
  if (!projection_grads) return {Tensor(), Tensor(), autograd::keep_if(needs[2], db)};

  const Tensor dqkv_values = empty({rows * 3 * C / 2}, opts);
  TG_DISPATCH_DEVICE(dq, FusedAttentionKernels, join_half_qkv, dq, kv, d, dqkv_values);
  dq = kv.values = Tensor();
  convert_operands.join();
  std::vector<Fp16ScaleSource> sources{{{dqkv_values, rows, 3 * C}, kv.scratch, 0, Fp16ScaleSource::kExponent}};
  for (int i = 0; i < int(converted.matrices.size()); ++i) sources.push_back({converted.matrices[i], converted.scalars, i});
  const Fp16Group group = regroup_fp16(sources);
  const int ix = needs[1] ? 1 : -1, iw = needs[0] ? (needs[1] ? 2 : 1) : -1;  // group: dqkv, then x and w as converted
  auto [dx, dw] = projection_grads_fp16(group, iw, ix);  // dx = dqkv W, dW = dqkv^T x
  return {std::move(dx), std::move(dw), autograd::keep_if(needs[2], db)};
}

}  // namespace

Tensor fused_attention(const Tensor& qkv, const Tensor& edit_mask, const Tensor& attn_mask, const Tensor& E,
                       const Tensor& w_in, const Tensor& w_x, int64_t heads, const DropoutOptions& dropout,
                       MatmulPrecision precision_in) {
  const char* op = "fused_attention";
  check_defined(op, "qkv", qkv);
  check_core_args(op, "qkv", qkv.shape(), qkv, edit_mask, attn_mask, E, w_in, w_x, heads);
  check_dropout(op, dropout);
  AttentionInputs in = core_inputs_of(qkv.shape(), qkv, {}, edit_mask, attn_mask, E, w_in, w_x, heads);
  draw_dropout(dropout, in);
  const MatmulPrecision precision = resolve_precision(precision_in);
  std::vector<Tensor> saved = core_forward(in, precision);
  const Tensor o = saved[kO];
  return autograd::record(OpId::fused_attention, o, {qkv, E, w_in, w_x}, std::move(saved),
                          [meta = core_meta(in), precision](Tensor g, const auto& s, const autograd::GradMask& needs) {
    const AttentionInputs in = core_inputs(meta, s);
    AttentionGradTensors gt = start_core_backward(in, std::move(g), s, needs[1], needs[2] || needs[3]);
    std::vector<Tensor> grads{autograd::keep_if(needs[0], float_qkv_backward(in, gt, precision))};
    for (Tensor& t : edit_bias_grads(gt, needs, 1)) grads.push_back(std::move(t));
    return grads;
  });
}

namespace {

// fused_qkv_attention's (and fused_attention_layer's) projection, checked:
// x2 = x's [B S, C] rows and w the weight (contiguous where its GEMMs run on
// fp16: half), for a qkv of qkv_shape [B,S,3 H D].
struct QkvProjection {
  const char* op;  // errors name it
  Tensor x2, w;
  Shape qkv_shape;
  bool half;
};

// A projection's weight [rows, in] and optional bias [rows], in x's dtype
// and on its device; errors name op, the arguments and what the weight
// reads (input).
void check_projection_weight(const char* op, const Tensor& x, const char* weight_name, const Tensor& weight,
                             const char* rows, int64_t in, const std::string& input, const char* bias_name,
                             const Tensor& bias) {
  check_defined(op, weight_name, weight);
  TG_CHECK(weight.dim() == 2 && weight.size(1) == in, op, ": ", weight_name, " must be [", rows, ", ", in, "] for ",
           input, ", got ", weight.shape());
  check_same_dtype_device(op, x, weight);
  if (!bias.defined()) return;
  check_same_dtype_device(op, x, bias);
  TG_CHECK(bias.shape() == Shape{weight.size(0)}, op, ": ", bias_name, " must be [", weight.size(0), "] for ",
           weight_name, " ", weight.shape(), ", got ", bias.shape());
}

// The checks of fused_qkv_attention's arguments, errors naming op; precision resolved.
QkvProjection checked_qkv_projection(const char* op, const Tensor& x, const Tensor& qkv_weight,
                                     const Tensor& qkv_bias, const Tensor& edit_mask, const Tensor& attn_mask,
                                     const Tensor& E, const Tensor& w_in, const Tensor& w_x, int64_t heads,
                                     const DropoutOptions& dropout, MatmulPrecision precision) {
  check_defined(op, "x", x);
  TG_CHECK(x.dim() == 3, op, ": x must be [B,S,C], got ", x.shape());
  check_projection_weight(op, x, "qkv_weight", qkv_weight, "3 H D", x.size(2), "x " + to_string(x.shape()),
                          "qkv_bias", qkv_bias);
  const Shape qkv_shape{x.size(0), x.size(1), qkv_weight.size(0)};
  check_core_args(op, "the projection x W^T", qkv_shape, x, edit_mask, attn_mask, E, w_in, w_x, heads);
  check_dropout(op, dropout);
  // At "high" on CUDA the projection's GEMMs run on fp16 tensor cores, like the core's (linear_fp16).
  const bool half = x.is_cuda() && x.dtype() == DType::Float32 && precision == MatmulPrecision::High;
  return {op, rows_view(materialize(x), x.size(2)), half ? materialize(qkv_weight) : qkv_weight, qkv_shape, half};
}

// Whether the core reads only qkv's fp16 copy, which the projection's GEMM
// then writes: no float qkv at all.
bool projection_writes_half_qkv(const QkvProjection& pr, int64_t heads, MatmulPrecision precision) {
  return pr.half && core_reads_half_qkv(pr.x2, precision, pr.qkv_shape[0] * heads * pr.qkv_shape[1]);
}

// The projection and the core's forward: the core's inputs (in) and its
// saved tensors, then x2 (for dW) and w (for dx) where wanted (m: x's,
// qkv_weight's); o_half as core_forward's. Where the fp16 projection's GEMM
// runs (start_linear_to_fp16), the core's forward kernel reads qkv's copy at
// its first scale while its max is found on a side stream, and before_core
// (where given) runs before the kernel, while qkv's scalars are those of
// the first scale.
std::vector<Tensor> qkv_attention_forward(const QkvProjection& pr, const Tensor& qkv_bias, const Tensor& edit_mask,
                                          const Tensor& attn_mask, const Tensor& E, const Tensor& w_in,
                                          const Tensor& w_x, int64_t heads, const DropoutOptions& dropout,
                                          MatmulPrecision precision, const autograd::GradMask& m,
                                          AttentionInputs& in, const Tensor& o_half = Tensor(),
                                          const std::function<void(const AttentionInputs&)>& before_core = {}) {
  const bool half_copy = projection_writes_half_qkv(pr, heads, precision);
  const Tensor qkv = half_copy ? Tensor()
                               : linear_forward(pr.op, pr.x2, pr.w, qkv_bias, precision, pr.half)
                                     .view(pr.qkv_shape);
  const Tensor bias = half_copy && qkv_bias.defined() ? materialize(qkv_bias) : Tensor();
  const Fp16Product qkv_half = half_copy ? start_linear_to_fp16(pr.x2, pr.w, bias) : Fp16Product{};
  in = core_inputs_of(pr.qkv_shape, qkv, qkv_half.y, edit_mask, attn_mask, E, w_in, w_x, heads);
  draw_dropout(dropout, in);
  if (before_core) before_core(in);
  cuda::Fork qkv_amax(qkv_half.pending);
  qkv_amax.run([&] { find_fp16_product_amax(qkv_half); });
  std::vector<Tensor> saved = core_forward(in, precision, o_half);
  qkv_amax.join();
  finish_fp16_product(qkv_half);
  saved.push_back(autograd::keep_if(m[1], pr.x2));  // dW = dqkv^T x
  saved.push_back(autograd::keep_if(m[0], pr.w));   // dx = dqkv W
  return saved;
}

// fused_qkv_attention's gradients {x, W, b, E, w_in, w_x} where needs says,
// from g = dL/do and the saved list qkv_attention_forward made.
std::vector<Tensor> qkv_attention_backward(const AttentionInputs& meta, MatmulPrecision precision, bool half,
                                           const Shape& x_shape, Tensor g, const autograd::SavedTensors& s,
                                           const autograd::GradMask& needs) {
  AttentionInputs in = core_inputs(meta, s);
  AttentionGradTensors gt = start_core_backward(in, std::move(g), s, needs[3], needs[4] || needs[5]);
  const Tensor x2 = s[kCoreSaved], w = s[kCoreSaved + 1];
  const autograd::GradMask projection{needs[0], needs[1], needs[2]};
  std::vector<Tensor> grads;
  if (!in.qkv_half.matrices.empty()) {
    grads = half_qkv_projection_backward(in, gt, s, x2, w, projection);
  } else {
    Tensor dqkv = float_qkv_backward(in, gt, precision);
    Tensor g2 = rows_view(dqkv, dqkv.size(2));
    dqkv = Tensor();
    grads = linear_backward(std::move(g2), x2, w, projection, precision, half);
  }
  if (grads[0].defined()) grads[0] = grads[0].view(x_shape);
  for (Tensor& t : edit_bias_grads(gt, needs, 3)) grads.push_back(std::move(t));
  return grads;
}

// fused_attention_layer's saved tensors after qkv_attention_forward's: the
// out-projection's fp16 group {Wo, o} (its matrices' values and scalars),
// and Wo itself (read by nothing: kept so that an in-place change to it
// before the backward is caught, as linear's saved weight is).
enum LayerSaved : size_t { kOutWeightHalf = kCoreSaved + 2, kOutInputHalf, kOutScalars, kOutWeight };

// The out-projection's backward in the layer node, from g2 = dL/dy [B S,
// out]: {do [B S, C], dWo, dbo} where needs says, with g's fp16 copy
// regrouped with the forward's copies of Wo [out, C] and o (no second
// conversion of either).
std::vector<Tensor> out_projection_backward(Tensor g2, int64_t C, const autograd::SavedTensors& s,
                                            const autograd::GradMask& needs) {
  const Tensor scalars = s[kOutScalars];
  const int64_t rows = g2.size(0), out = g2.size(1);
  const int iw = needs[0] ? 1 : -1, ix = needs[1] ? 1 + int(needs[0]) : -1;
  return linear_backward_fp16(std::move(g2), needs, iw, ix, [&](const Tensor& g) {
    const Fp16Group g_half = to_fp16({g});
    std::vector<Fp16ScaleSource> sources{{g_half.matrices[0], g_half.scalars, 0}};
    if (needs[0]) sources.push_back({{s[kOutWeightHalf], out, C}, scalars, 0});
    if (needs[1]) sources.push_back({{s[kOutInputHalf], rows, C}, scalars, 1});
    return regroup_fp16(sources);
  });
}

// fused_qkv_attention's node on arguments checked_qkv_projection made pr of.
Tensor qkv_attention_node(const QkvProjection& pr, const Tensor& x, const Tensor& qkv_weight, const Tensor& qkv_bias,
                          const Tensor& edit_mask, const Tensor& attn_mask, const Tensor& E, const Tensor& w_in,
                          const Tensor& w_x, int64_t heads, const DropoutOptions& dropout,
                          MatmulPrecision precision) {
  const autograd::GradMask m = autograd::grad_mask({x, qkv_weight, qkv_bias});
  AttentionInputs in;
  std::vector<Tensor> saved =
      qkv_attention_forward(pr, qkv_bias, edit_mask, attn_mask, E, w_in, w_x, heads, dropout, precision, m, in);
  const Tensor o = saved[kO];
  return autograd::record(OpId::fused_qkv_attention, o, {x, qkv_weight, qkv_bias, E, w_in, w_x}, std::move(saved),
                          [meta = core_meta(in), precision, half = pr.half, x_shape = x.shape()](
                              Tensor g, const auto& s, const autograd::GradMask& needs) {
    return qkv_attention_backward(meta, precision, half, x_shape, std::move(g), s, needs);
  });
}

}  // namespace

Tensor fused_qkv_attention(const Tensor& x, const Tensor& qkv_weight, const Tensor& qkv_bias, const Tensor& edit_mask,
                           const Tensor& attn_mask, const Tensor& E, const Tensor& w_in, const Tensor& w_x,
                           int64_t heads, const DropoutOptions& dropout, MatmulPrecision precision_in) {
  const MatmulPrecision precision = resolve_precision(precision_in);
  const QkvProjection pr = checked_qkv_projection("fused_qkv_attention", x, qkv_weight, qkv_bias, edit_mask,
                                                  attn_mask, E, w_in, w_x, heads, dropout, precision);
  return qkv_attention_node(pr, x, qkv_weight, qkv_bias, edit_mask, attn_mask, E, w_in, w_x, heads, dropout,
                            precision);
}

Tensor fused_attention_layer(const Tensor& x, const Tensor& qkv_weight, const Tensor& qkv_bias,
                             const Tensor& edit_mask, const Tensor& attn_mask, const Tensor& E, const Tensor& w_in,
                             const Tensor& w_x, const Tensor& out_weight, const Tensor& out_bias, int64_t heads,
                             const DropoutOptions& dropout, MatmulPrecision precision_in) {
  const char* op = "fused_attention_layer";
  const MatmulPrecision precision = resolve_precision(precision_in);
  const QkvProjection pr = checked_qkv_projection(op, x, qkv_weight, qkv_bias, edit_mask, attn_mask, E, w_in, w_x,
                                                  heads, dropout, precision);
  const int64_t C = pr.qkv_shape[2] / 3;
  check_projection_weight(op, x, "out_weight", out_weight, "out", C,
                          "the attention's " + std::to_string(C) + " columns", "out_bias", out_bias);
  if (!projection_writes_half_qkv(pr, heads, precision)) {  // two nodes: the core, then the out-projection
    const Tensor o =
        qkv_attention_node(pr, x, qkv_weight, qkv_bias, edit_mask, attn_mask, E, w_in, w_x, heads, dropout, precision);
    return precision == MatmulPrecision::High ? linear_fp16(o, out_weight, out_bias)
                                              : linear(o, out_weight, out_bias, precision);
  }
  // One node: the forward kernel writes o's fp16 copy at a scale known from
  // v's bound, which the out-projection's GEMMs read (no conversion of o).
  const autograd::GradMask m = autograd::grad_mask({x, qkv_weight, qkv_bias, E, w_in, w_x, out_weight, out_bias});
  const Tensor wo = materialize(out_weight);
  const Fp16Group wo_half = fp16_group({wo});
  cuda::Fork convert_wo(true);  // Wo's copy beside the projection
  convert_wo.run([&] { convert_to_fp16({wo}, wo_half); });
  const int64_t rows = pr.qkv_shape[0] * pr.qkv_shape[1];
  const Fp16Matrix o_half = allocate_fp16_matrix(rows, C, x.device());
  AttentionInputs in;
  Fp16Group out_group;  // {Wo, o}, o at the scale the kernel writes it: from qkv's bound scale at its first scale
  const auto regroup_out = [&](const AttentionInputs& core) {
    convert_wo.join();
    out_group = regroup_fp16({{wo_half.matrices[0], wo_half.scalars, 0},
                              {o_half, core.qkv_half.scalars, 0, Fp16ScaleSource::kBound, keep_scale_exponent(core.p)}});
  };
  std::vector<Tensor> saved = qkv_attention_forward(pr, qkv_bias, edit_mask, attn_mask, E, w_in, w_x, heads, dropout,
                                                    precision, m, in, o_half.values, regroup_out);
  const Tensor y = gemm_fp16(out_group, 1, false, 0, true, out_bias.defined() ? materialize(out_bias) : Tensor());
  const bool attention_grads = m[0] || m[1] || m[2] || m[3] || m[4] || m[5];
  if (!attention_grads) std::fill(saved.begin(), saved.end(), Tensor());  // the core's backward will not run
  saved.push_back(attention_grads ? out_group.matrices[0].values : Tensor());  // do = dy Wo
  saved.push_back(autograd::keep_if(m[6], o_half.values));                    // dWo = dy^T o
  saved.push_back(out_group.scalars);
  saved.push_back(out_weight);
  const Shape y_shape{pr.qkv_shape[0], pr.qkv_shape[1], out_weight.size(0)};
  return autograd::record(
      OpId::fused_attention_layer, y.view(y_shape), {x, qkv_weight, qkv_bias, E, w_in, w_x, out_weight, out_bias},
      std::move(saved),
      [meta = core_meta(in), precision, x_shape = x.shape(), C, out = out_weight.size(0)](
          Tensor g, const auto& s, const autograd::GradMask& needs) {
        const bool attention = needs[0] || needs[1] || needs[2] || needs[3] || needs[4] || needs[5];
        Tensor g2 = rows_view(materialize(g), out);
        g = Tensor();  // g2 is the only handle: dropped once converted
        std::vector<Tensor> out_grads =
            out_projection_backward(std::move(g2), C, s, {attention, needs[6], needs[7]});
        for (const size_t i : {kOutWeightHalf, kOutInputHalf, kOutScalars}) s.release_early(i);
        std::vector<Tensor> grads(6);
        if (attention) {
          Tensor dout = out_grads[0].view({x_shape[0], x_shape[1], C});
          out_grads[0] = Tensor();  // dout is the only handle: the core's backward drops it once converted
          grads = qkv_attention_backward(meta, precision, true, x_shape, std::move(dout), s,
                                         {needs[0], needs[1], needs[2], needs[3], needs[4], needs[5]});
        }
        grads.push_back(std::move(out_grads[1]));
        grads.push_back(std::move(out_grads[2]));
        return grads;
      });
}

// ---- the benchmark interface: the whole layer's backward from the spec's inputs

namespace fused {

namespace {

struct LayerDims {
  int64_t B, S, C, H, D, M;
};

// Every input and output against the spec's shapes, one device and dtype, contiguous.
LayerDims check_backward_args(const BackwardInputs& in, const Gradients& out) {
  const char* op = "region_attention_backward";
  check_defined(op, "hidden_states", in.hidden_states);
  TG_CHECK(in.hidden_states.dim() == 3, op, ": hidden_states must be [B,S,C], got ", in.hidden_states.shape());
  check_defined(op, "edit_region_bias", in.edit_region_bias);
  TG_CHECK(in.edit_region_bias.dim() == 3, op, ": edit_region_bias must be [H,M,M], got ", in.edit_region_bias.shape());
  const int64_t B = in.hidden_states.size(0), S = in.hidden_states.size(1), C = in.hidden_states.size(2);
  const int64_t H = in.edit_region_bias.size(0), M = in.edit_region_bias.size(1);
  TG_CHECK(H > 0 && C % H == 0, op, ": hidden ", C, " is not divisible by heads ", H);
  TG_CHECK(S <= M, op, ": sequence length ", S, " exceeds max_positions ", M);
  const int64_t D = C / H;
  const std::vector<std::tuple<const Tensor*, const char*, Shape>> expected = {
      {&in.grad_output, "grad_output", {B, S, C}},     {&in.hidden_states, "hidden_states", {B, S, C}},
      {&in.edit_region_mask, "edit_region_mask", {B, S}}, {&in.qkv_weight, "qkv_weight", {3 * C, C}},
      {&in.qkv_bias, "qkv_bias", {3 * C}},             {&in.out_weight, "out_weight", {C, C}},
      {&in.out_bias, "out_bias", {C}},                 {&in.edit_region_bias, "edit_region_bias", {H, M, M}},
      {&in.within_edit_bias, "within_edit_bias", {H, 1, 1}}, {&in.cross_edit_bias, "cross_edit_bias", {H, 1, 1}},
      {&in.attention_mask, "attention_mask", {B, S}},  {&in.query, "query", {B, H, S, D}},
      {&in.key, "key", {B, H, S, D}},                  {&in.value, "value", {B, H, S, D}},
      {&in.attention_probs, "attention_probs", {B, H, S, S}},
      {&in.attention_probs_dropped, "attention_probs_dropped", {B, H, S, S}},
      {&in.attention_output, "attention_output", {B, S, C}},
      {&out.hidden_states, "grad_hidden_states", {B, S, C}}, {&out.qkv_weight, "grad_qkv_weight", {3 * C, C}},
      {&out.qkv_bias, "grad_qkv_bias", {3 * C}},       {&out.out_weight, "grad_out_weight", {C, C}},
      {&out.out_bias, "grad_out_bias", {C}},           {&out.edit_region_bias, "grad_edit_region_bias", {H, M, M}},
      {&out.within_edit_bias, "grad_within_edit_bias", {H, 1, 1}},
      {&out.cross_edit_bias, "grad_cross_edit_bias", {H, 1, 1}}};
  for (const auto& [t, name, shape] : expected) {
    check_defined(op, name, *t);
    TG_CHECK(t->shape() == shape, op, ": ", name, " must be ", shape, ", got ", t->shape());
    TG_CHECK(t->is_contiguous(), op, ": ", name, " ", t->shape(), " must be contiguous");
    check_same_dtype_device(op, in.hidden_states, *t);
  }
  if (in.hidden_states.is_cuda()) {
    TG_CHECK(in.hidden_states.dtype() == DType::Float32, op, ": CUDA tensors must be float32");
    TG_CHECK(D == kCudaHeadDim, op, ": the CUDA kernels cover head dim ", kCudaHeadDim, ", got ", D);
    check_cuda_batch_heads(op, B, H);  // before any output is written
  }
  const std::vector<Tensor> inputs = inputs_of(in), outputs = outputs_of(out);
  for (size_t o = 0; o < outputs.size(); ++o) {
    for (size_t i = 0; i < inputs.size(); ++i)
      TG_CHECK(!inputs[i].defined() || !bytes_overlap(outputs[o], inputs[i]), op, ": output ", kOutputNames[o],
               " overlaps input ", kInputNames[i], " (the inputs must not change)");
    for (size_t other = o + 1; other < outputs.size(); ++other)
      TG_CHECK(!bytes_overlap(outputs[o], outputs[other]), op, ": outputs ", kOutputNames[o], " ",
               outputs[o].shape(), " and ", kOutputNames[other], " ", outputs[other].shape(), " share memory");
  }
  return {B, S, C, H, D, M};
}

// The layer's projection GEMMs over three matrices (dy, Wo, o; x, Wqkv,
// dqkv): c = op(m_a) @ op(m_b), op(m) = m^T where transposed. On CUDA
// (float32) on fp16 tensor cores, the matrices converted by convert() into
// one group, at once or in parts: at "high" to_fp16's form (TF32's mantissa
// at twice TF32's rate), at "highest" to_fp16_split's (three fp16 products:
// fp32's accuracy in about 1.5 times a TF32 GEMM's time); else one GEMM each
// at `precision`.
class Projections {
 public:
  Projections(std::vector<Tensor> matrices, MatmulPrecision precision)
      : matrices_(std::move(matrices)), precision_(precision) {
    const Tensor& x = matrices_[0];
    if (x.is_cuda() && x.dtype() == DType::Float32)
      half_ = fp16_group(matrices_, precision == MatmulPrecision::Highest);
  }
  // Matrices first .. last - 1, after any before them; allocates nothing
  // (a cuda::Fork's side work may run it).
  void convert(int first, int last) const {
    if (half_.matrices.empty()) return;
    convert_to_fp16({matrices_.begin() + first, matrices_.begin() + last}, half_, first);
  }
  // c = op(a) op(b); on a cuda::Fork's side work with workspace(...) of the same product, allocated before.
  void into(const Tensor& c, int a, bool transpose_a, int b, bool transpose_b, const Tensor& workspace = {}) const {
    if (!half_.matrices.empty()) return gemm_fp16_into(half_, a, transpose_a, b, transpose_b, c, workspace);
    const auto view = [&](int i, bool transpose) { return transpose ? transposed_view(matrices_[i]) : matrices_[i]; };
    gemm_into("region_attention_backward", view(a, transpose_a), view(b, transpose_b), c, 0.0, precision_);
  }
  // What into(c, ...) needs allocated (undefined: nothing).
  Tensor workspace(const Tensor& c, int a, bool transpose_a, int b, bool transpose_b) const {
    if (half_.matrices.empty()) return Tensor();
    const int64_t floats = gemm_fp16_workspace(half_, a, transpose_a, b, transpose_b, c);
    return floats > 0 ? empty({floats}, {DType::Float32, c.device()}) : Tensor();
  }

 private:
  std::vector<Tensor> matrices_;
  MatmulPrecision precision_;
  Fp16Group half_;
};

}  // namespace

void region_attention_backward_into(const BackwardInputs& in, double scale, double dropout_p,
                                    MatmulPrecision precision_in, const Gradients& out) {
  const LayerDims L = check_backward_args(in, out);
  check_given_mask_dropout_p("region_attention_backward", "dropout_p", dropout_p);
  TG_CHECK(std::isfinite(scale), "region_attention_backward: scale must be finite, got ", scale);
  if (!in.hidden_states.is_cuda())
    check_binary_masks("region_attention_backward",
                       {{"edit_region_mask", in.edit_region_mask}, {"attention_mask", in.attention_mask}});
  for (const Tensor& t : outputs_of(out)) bump_version(t);  // written in place, like copy_ (once the checks pass)
  const MatmulPrecision precision = resolve_precision(precision_in);
  const Tensor& x = in.hidden_states;
  const TensorOptions opts{x.dtype(), x.device()};
  // The backward's kernel reads k and v, and Delta's pass o, in 16-byte
  // vectors (and checks q's rows as it checks theirs): any of the four that
  // starts off a 16-byte boundary (a view into a larger buffer) is copied first.
  const Tensor query = materialize_aligned(in.query), key = materialize_aligned(in.key),
               value = materialize_aligned(in.value), attention_output = materialize_aligned(in.attention_output);
  const Tensor dy = rows_view(in.grad_output, L.C), o = rows_view(attention_output, L.C);

  // The attention core's inputs, reading P and Pd.
  AttentionInputs core;
  core.q = query, core.k = key, core.v = value;
  core.edit_mask = in.edit_region_mask, core.attn_mask = in.attention_mask;
  core.edit_region_bias = in.edit_region_bias;
  core.within = in.within_edit_bias.view({L.H});
  core.cross = in.cross_edit_bias.view({L.H});
  core.d = {L.B, L.H, L.S, L.D, L.M};
  core.scale = scale;
  core.p = dropout_p;  // P and Pd are read, no mask is drawn; p bounds Pd and dS for the fp16 tiles' scales
  AttentionGradTensors g;
  g.probs = in.attention_probs, g.probs_dropped = in.attention_probs_dropped;
  const Tensor dqkv = qkv_gradient(x, core.d, precision, true, g);
  g.dE = out.edit_region_bias, g.dw_in = out.within_edit_bias.view({L.H}), g.dw_x = out.cross_edit_bias.view({L.H});
  // On CUDA dw_in's and dw_x's fp64 sums are zeroed with the other fills and
  // finished beside the qkv projection (below), two kernels off the critical
  // path (H200, C API: the "high" mean -3.5 us, bench/NOTES.md version 33).
  const int64_t edit_sums = TG_DISPATCH_DEVICE(x, FusedAttentionKernels, edit_bias_sums_size, core.d, precision, true);
  if (edit_sums > 0) g.edit_bias_sums = empty({edit_sums}, {DType::Float64, x.device()});
  const Tensor sums = empty({2, L.B, L.H, L.S}, opts);  // one fill for both
  g.colsum_ds = sums.narrow(0, 0, 1).squeeze(0), g.rowsum_pd = sums.narrow(0, 1, 1).squeeze(0);
  // On CUDA the core reads fp16 copies of q (and of dout), at "highest"
  // split as hi + 2^-11 lo; it converts k and v itself, a key tile at a time.
  const int64_t rows = L.B * L.H * L.S;
  const bool split = precision == MatmulPrecision::Highest;
  const Tensor q_rows = query.view({rows, L.D});
  if (x.is_cuda() && rows > 0) core.qkv_half = fp16_group({q_rows}, split);

  // qkv = x Wqkv^T + bqkv:  dWqkv = dqkv^T x, dx = dqkv Wqkv. x and Wqkv are
  // converted on a side stream (below), dqkv once the core has written it.
  enum { kX, kWqkv, kDqkv };
  const Projections qkv_proj({rows_view(x, L.C), in.qkv_weight, rows_view(dqkv, 3 * L.C)}, precision);
  const Tensor bias_scratch = empty({bias_sums_scratch(L.B, L.S, L.C)}, opts);

  // Work that waits for nothing the call computes runs beside the
  // out-projection, on four more CUDA streams (below the critical path's
  // priority in graph replay: core/cuda_context.h), all joined before the
  // core: dE's zeros (up to 64 MiB, bandwidth-bound); the other fills; q's
  // conversion (those two for the core); x's and Wqkv's conversion (for the
  // qkv projection). At small sizes these kernels are short and
  // latency-bound: side by side they end sooner than one after another (H200,
  // C API: three streams against one, 1024/1 -10 us, the "high" mean -0.8%,
  // bench/NOTES.md version 28; q's conversion apart from the fills, the
  // "high" mean -0.5%, version 31). Left to run beside the core instead, they
  // slowed it. (dWo's and dWqkv's forks, below, join later.)
  cuda::Fork dE_zeros(x.is_cuda()), fills(x.is_cuda()), query_half(x.is_cuda()), projection_inputs(x.is_cuda());
  dE_zeros.run([&] { zero_edit_bias_gradient(g.dE, core.d); });
  fills.run([&] {
    zero_qkv_gradient(dqkv, g);
    fill_into(sums, 0.0);
    if (g.edit_bias_sums.defined()) fill_into(g.edit_bias_sums, 0.0);
  });
  query_half.run([&] {
    if (!core.qkv_half.matrices.empty()) convert_to_fp16({q_rows}, core.qkv_half);
  });
  projection_inputs.run([&] { qkv_proj.convert(kX, kDqkv); });

  // y = o Wo^T + bo:  dWo = dy^T o, do = dy Wo (dbo, the column sums of dy, with the other biases below).
  // dy and Wo are converted here, for do; o, whose fp16 copy only dWo reads, last (slot order), on dWo's fork.
  enum { kDy, kWo, kO };
  const Projections out_proj({dy, in.out_weight, o}, precision);
  out_proj.convert(kDy, kWo + 1);
  // Nothing after dWo reads it: o's conversion and dWo run on a side stream
  // (the GEMM's workspace allocated before), so that do, Delta and the core
  // do not wait for them (H200, C API: o's conversion moved there, the "high"
  // mean -1.1%, bench/NOTES.md version 32); joined after the core (which they
  // run beside), which frees the side cuBLAS workspace for dWqkv's fork, made
  // after this join (core/cuda_context.h, cublas_workspace()).
  Tensor out_weight_workspace = out_proj.workspace(out.out_weight, kDy, true, kO, false);
  cuda::Fork out_weight(x.is_cuda());
  out_weight.run([&] {
    out_proj.convert(kO, kO + 1);
    out_proj.into(out.out_weight, kDy, true, kO, false, out_weight_workspace);
  });
  const Tensor dout = empty({L.B, L.S, L.C}, opts);
  out_proj.into(rows_view(dout, L.C), kDy, false, kWo, false);
  g.dout = dout;
  g.delta = empty({L.B, L.H, L.S}, opts);
  g.dout_half = delta_and_half_dout(dout, attention_output, g.delta, core.d, !core.qkv_half.matrices.empty(), split);
  for (cuda::Fork* fork : {&dE_zeros, &fills, &query_half, &projection_inputs}) fork->join();
  TG_DISPATCH_DEVICE(x, FusedAttentionKernels, backward, core, g, precision);
  out_weight.join();
  out_weight_workspace = Tensor();

  // dbqkv from fp32 sums, not from the tensor-core dq, dk, dv: sum_i dq_i =
  // scale sum_j colsum(dS)_j k_j, sum_j dk_j = 0 (dS rows sum to 0), sum_j dv_j = sum_i rowsum(Pd)_i do_i;
  // and dbo = sum_i dy_i: dbq, dbv and dbo as one stacked column sum, which writes dbk's zeros with dbq.
  // It runs beside the qkv projection, and so do dw_in and dw_x from their sums.
  cuda::Fork biases(x.is_cuda());
  biases.run([&] {
    TG_DISPATCH_DEVICE(x, AttentionBiasKernels, bias_sums, g.colsum_ds, g.rowsum_pd, key, dout, dy, scale,
                       out.qkv_bias, out.out_bias, bias_scratch);
    if (g.edit_bias_sums.defined())
      TG_DISPATCH_DEVICE(x, FusedAttentionKernels, finish_edit_bias_sums, core, g, precision, true);
  });
  qkv_proj.convert(kDqkv, kDqkv + 1);
  // dWqkv and dx read the same converted dqkv: dWqkv runs on a side stream
  // beside dx (H200, C API: the "high" mean -2.4 us; with dWo's fork at
  // "highest" too, its mean -17.5 us; bench/NOTES.md version 31).
  const Tensor qkv_weight_workspace = qkv_proj.workspace(out.qkv_weight, kDqkv, true, kX, false);
  cuda::Fork qkv_weight(x.is_cuda());
  qkv_weight.run([&] { qkv_proj.into(out.qkv_weight, kDqkv, true, kX, false, qkv_weight_workspace); });
  qkv_proj.into(rows_view(out.hidden_states, L.C), kDqkv, false, kWqkv, false);
  qkv_weight.join();
  biases.join();
}

std::vector<Tensor> inputs_of(const BackwardInputs& in) {
  return {in.grad_output, in.hidden_states, in.edit_region_mask, in.qkv_weight, in.qkv_bias, in.out_weight,
          in.out_bias, in.edit_region_bias, in.within_edit_bias, in.cross_edit_bias, in.attention_mask, in.query,
          in.key, in.value, in.attention_scores, in.attention_probs, in.attention_probs_dropped, in.attention_output,
          in.dropout_mask};
}
const char* const kInputNames[19] = {
    "grad_output", "hidden_states", "edit_region_mask", "qkv_weight", "qkv_bias", "out_weight", "out_bias",
    "edit_region_bias", "within_edit_bias", "cross_edit_bias", "attention_mask", "query", "key", "value",
    "attention_scores", "attention_probs", "attention_probs_dropped", "attention_output", "dropout_mask"};
const char* const kOutputNames[8] = {"grad_hidden_states", "grad_qkv_weight", "grad_qkv_bias",
                                     "grad_out_weight", "grad_out_bias", "grad_edit_region_bias",
                                     "grad_within_edit_bias", "grad_cross_edit_bias"};
std::vector<Tensor> outputs_of(const Gradients& g) {
  return {g.hidden_states, g.qkv_weight, g.qkv_bias, g.out_weight, g.out_bias, g.edit_region_bias, g.within_edit_bias,
          g.cross_edit_bias};
}

Gradients region_attention_backward(const BackwardInputs& in, double scale, double dropout_p, MatmulPrecision precision) {
  check_defined("region_attention_backward", "hidden_states", in.hidden_states);
  check_defined("region_attention_backward", "edit_region_bias", in.edit_region_bias);
  const TensorOptions opts{in.hidden_states.dtype(), in.hidden_states.device()};
  Gradients out;
  out.hidden_states = empty(in.hidden_states.shape(), opts);
  out.qkv_weight = empty(in.qkv_weight.defined() ? in.qkv_weight.shape() : Shape{}, opts);
  out.qkv_bias = empty(in.qkv_bias.defined() ? in.qkv_bias.shape() : Shape{}, opts);
  out.out_weight = empty(in.out_weight.defined() ? in.out_weight.shape() : Shape{}, opts);
  out.out_bias = empty(in.out_bias.defined() ? in.out_bias.shape() : Shape{}, opts);
  out.edit_region_bias = empty(in.edit_region_bias.shape(), opts);
  out.within_edit_bias = empty(in.within_edit_bias.defined() ? in.within_edit_bias.shape() : Shape{}, opts);
  out.cross_edit_bias = empty(in.cross_edit_bias.defined() ? in.cross_edit_bias.shape() : Shape{}, opts);
  region_attention_backward_into(in, scale, dropout_p, precision, out);
  return out;
}

}  // namespace fused

}  // namespace tg
