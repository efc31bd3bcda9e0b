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
#include "ops/matmul_kernels.h"
#include "ops/reduce_kernels.h"
#include "ops/untracked.h"

namespace tg {

struct AttentionDims {
  int64_t B, H, S, D, M;
};

// The CUDA kernels' grids hold the (b, h) pairs in blockIdx.y, at most 65535.
// Checked by the ops' argument checks (check_core_args, check_backward_args),
// before anything runs, so the kernels' launchers do not check it again.
inline void check_cuda_batch_heads(const char* op, int64_t B, int64_t H) {
  TG_CHECK(B * H <= 65535, op, ": batch ", B, " x heads ", H, " = ", B * H,
           " exceeds the CUDA kernels' limit of 65535 (b, h) pairs");
}

// The forward's inputs. q, k, v: [B,H,S,D] tensors with a unit d stride
// (views of the projection qkv [B,S,3C], or contiguous tensors).
struct AttentionInputs {
  Tensor q, k, v;                            // undefined in a training backward that reads qkv_half
  Tensor qkv;                                // optional: the contiguous [B,S,3C] tensor q, k, v are views of
  Fp16Group qkv_half;                        // on CUDA at "high": in training qkv's fp16 copy (to_fp16, one
                                             // matrix), made for the forward, kept for the backward; in the
                                             // benchmark interface q's ([B H S, D], one matrix; the kernel
                                             // converts the float k and v a key tile at a time)
  Tensor edit_mask, attn_mask;               // [B,S], 0/1, contiguous
  Tensor edit_region_bias, within, cross;    // [H,M,M], [H], [H], contiguous
  AttentionDims d;
  double scale = 1, p = 0;                   // dropout only when p > 0
  PhiloxState rng;
};

// The backward's extra inputs and its outputs. P comes from the log-sum-exp
// (training: recomputed, the dropout mask regenerated) or, when probs is
// defined, is read from probs and probs_dropped [B,H,S,S] (the benchmark
// interface). Outputs, zeroed by the caller and accumulated atomically: dq,
// and dk and dv unless writes_key_gradients ([B,H,S,D] views with a unit d
// stride); when defined (wanted), dE [H,M,M] (its [S,S] corner written, not
// added to, when B = 1), the per-key column sums of dS and the per-query row
// sums of Pd [B,H,S] (for the careful bias gradient of the benchmark). dw_in
// and dw_x [H], when defined, are written (zeros for an empty problem).
// In training at "high" on CUDA (fused_qkv_attention, fused_attention_layer): the kernel writes dk
// and dv as fp16, each group of 16 keys of one (b, h) scaled by its own
// power of two, and adds the v bias gradient (the column sums of the float
// dv; the k bias gradient, 0 in exact arithmetic, as 0 times dk's: 0 unless
// dk holds a NaN or an Inf); join_half_qkv then makes qkv's whole
// gradient one fp16 matrix at one scale. values undefined: dk and dv are
// float (dk, dv).
constexpr int64_t kHalfKeyGroup = 16;
struct HalfKeyGradients {
  Tensor values;     // [B S, 2C] fp16 in float32 storage: dk in columns h D + d, dv in C + h D + d
  Tensor exponents;  // [B, H, ceil(S / kHalfKeyGroup)] int32 in float32 storage: a group's values are 2^e dk
  Tensor scratch;    // [2]: the smallest e (int32), dq's largest finite |x| (float)
  Tensor db;         // [3C], qkv's bias gradient: dbq added by reduce_dq, dbk (0) and dbv by backward
};

struct AttentionGradTensors {
  Tensor dout;                  // dL/do [B,S,C], contiguous (undefined where the kernel reads dout_half)
  Fp16Group dout_half;          // on CUDA at "high": dout's fp16 copy (to_fp16 of its [B S, C] rows), which the kernel reads
  Tensor lse, delta;            // [B,H,S]
  Tensor probs, probs_dropped;  // optional [B,H,S,S]
  Tensor dq, dk, dv, dE, dw_in, dw_x;
  bool keys_zeroed = true;      // false: dk and dv left unzeroed, as writes_key_gradients allowed
  Tensor colsum_ds, rowsum_pd;  // optional
  HalfKeyGradients key_halves;  // optional (CUDA, "high", recomputed P): dk and dv as fp16, not dk and dv
  // optional (CUDA, dw_in wanted): the fp64 scratch of dw_in's and dw_x's
  // sums, edit_bias_sums_size elements, zeroed by the caller, who then
  // writes dw_in and dw_x with finish_edit_bias_sums after backward (both
  // off backward's stream: a cuda::Fork's side work); undefined: backward
  // zeroes its own and finishes.
  Tensor edit_bias_sums;
};

// The edit terms of a score: w_in e_i e_j + w_x cross(e_i, e_j).
template <class T>
TG_HD T edit_term(T w_in, T w_x, T ei, T ej) {
  return w_in * ei * ej + w_x * cross_term(ei, ej);
}

// The score of query i against key j of head h before masking.
template <class T>
TG_HD T attention_score(T qk, T scale, T E_hij, T w_in, T w_x, T ei, T ej) {
  return scale * qk + E_hij + edit_term(w_in, w_x, ei, ej);
}

// CTAs of a kernel resident per SM on this device (the occupancy
// calculator's count) against the count its layout plans for.
struct KernelResidency {
  int resident = 0, planned = 0;
};

// e with 1 / (1 - p) < 2^e: a power of two above dropout's keep scale.
inline int keep_scale_exponent(double p) {
  int e = 0;
  std::frexp(1.0 / (1.0 - p), &e);
  return e;
}

template <Device Dev>
struct FusedAttentionKernels {
  // o [B,S,C] (head h in columns h*D ..) and the log-sum-exp lse [B,H,S]
  // (-inf for a row whose keys are all masked; its o is 0). o_half
  // (optional; CUDA at "high", reading qkv's fp16 copy): o's fp16 copy too,
  // the values of an Fp16Matrix [B S, C], at the storage scale
  // fp16_scale_from_bound(qkv_half's bound scale, keep_scale_exponent(p)),
  // known before o exists: o's rows are averages of v's rows, the kept
  // ones times 1 / (1 - p), so |o| <= max |v| / (1 - p) and |o| s < 2^14
  // (fp16's range ends past 2^15; P's fp16 rounding adds ~2^-10).
  static void forward(const AttentionInputs& in, const Tensor& o, const Tensor& lse, MatmulPrecision precision,
                      const Tensor& o_half = Tensor());
  // delta[b,h,i] = sum_d dout[b,i,h*D+d] o[b,i,h*D+d].
  static void row_dot(const Tensor& dout, const Tensor& o, const Tensor& delta, AttentionDims d);
  static void backward(const AttentionInputs& in, const AttentionGradTensors& g, MatmulPrecision precision);
  // Whether backward writes dk and dv rather than adding to them (on CUDA,
  // when one CTA per key tile walks every query tile), so that the caller
  // zeroes only dq. read: probs given (the benchmark interface).
  static bool writes_key_gradients(const AttentionDims& d, MatmulPrecision precision, bool read);
  // AttentionGradTensors::edit_bias_sums's size for backward (0: none taken,
  // on CPU); CUDA only: dw_in and dw_x from those sums, once backward has run.
  static int64_t edit_bias_sums_size(const AttentionDims& d, MatmulPrecision precision, bool read);
  static void finish_edit_bias_sums(const AttentionInputs& in, const AttentionGradTensors& g,
                                    MatmulPrecision precision, bool read);
  // CUDA only: sets key_halves' scratch and zeroes its db for a backward that writes them.
  static void reset_key_halves(const HalfKeyGradients& kv);
  // CUDA only, after that backward, in one pass over dq [B,S,C] (float):
  // its largest finite |x| into kv.scratch and its column sums (dbq) added
  // to kv.db's first C.
  static void reduce_dq(const Tensor& dq, const HalfKeyGradients& kv, const AttentionDims& d);
  // CUDA only, after reduce_dq: qkv's gradient [B S, 3C] as fp16 into
  // dqkv_values at one scale 2^e (dq [B,S,C] float, dk and dv from kv), e
  // the smallest of kv's exponents and dq's, so that nothing overflows; e
  // goes to kv.scratch (int32, its first value: regroup_fp16's kExponent).
  static void join_half_qkv(const Tensor& dq, const HalfKeyGradients& kv, const AttentionDims& d,
                            const Tensor& dqkv_values);
  // CUDA only: the backward kernel that backward would run here (backward_grid
  // counts its waves with the planned CTAs per SM).
  static KernelResidency backward_residency(MatmulPrecision precision, bool read);
};

// The benchmark interface's bias gradients, all column sums over the B*S
// token rows (docs/derivations.md, "The qkv bias, carefully"), stacked as 3C
// columns [dbq | dbv | dbo] so that one pass per reduction level makes all
// of them (written once for both devices):
//   dbq[h*D + d] = scale sum_(b,s) colsum(dS)[b,h,s] k[b,h,s,d]
//   dbv[h*D + d] = sum_(b,s) rowsum(Pd)[b,h,s] do[b,s,h*D + d]
//   dbo[c] = sum_(b,s) dy[b,s,c]
// and dbk = 0 (the rows of dS sum to 0), written with dbq (BiasOutputs):
// exactly 0 even where the inputs hold a NaN or an Inf (the training path at
// "high" lets those show in dbk, as the decomposed graph does).
// One column of one batch: (a + f w[s]) x[s * step] for its rows s.
template <class T>
struct WeightedColumn {
  const T *w, *x;
  int64_t step;
  T a, f;
  TG_HD T operator()(int64_t s) const { return (a + f * w[s]) * x[s * step]; }
};

template <class T>
struct BiasSums {
  const T *colsum_ds, *rowsum_pd;  // [B,H,S]
  const T *k, *dout, *dy;          // k [B,H,S,D] (unit d stride); do and dy [B,S,C]
  int64_t S, H, D, sb, sh, ss;     // k's strides
  T scale;
  // Column c of batch b, set up once for a chunk's rows, so the row loop has
  // no branch: a, f pick the weight (scale colsum(dS), rowsum(Pd), or 1;
  // dbo's f = 0 multiplies the small rowsum row, finite, not a [B,S,C] tensor).
  TG_HD WeightedColumn<T> column(int64_t b, int64_t c) const {
    const int64_t C = H * D, part = c / C, col = c - part * C, h = col / D, d = col - h * D;
    const T* rowsum = rowsum_pd + (b * H + h) * S;
    if (part == 0) return {colsum_ds + (b * H + h) * S, k + b * sb + h * sh + d, ss, T(0), scale};
    const T* tokens = (part == 1 ? dout : dy) + b * S * C + col;  // row s at tokens[s * C]
    return {rowsum, tokens, C, part == 1 ? T(0) : T(1), part == 1 ? T(1) : T(0)};
  }
};

// Where BiasSums' column c goes: dbq and dbv into qkv_bias [3C] (the q and v
// blocks), dbo into out_bias [C]; writing dbq[c] also writes dbk[c] = 0.
template <class T>
struct BiasOutputs {
  T *qkv_bias, *out_bias;
  int64_t C;
  struct Slot {
    T *at, *zero;
    TG_HD void operator=(T v) const {
      *at = v;
      if (zero) *zero = T(0);
    }
  };
  TG_HD Slot operator[](int64_t c) const {
    if (c < C) return {qkv_bias + c, qkv_bias + C + c};
    if (c < 2 * C) return {qkv_bias + C + c, nullptr};
    return {out_bias + c - 2 * C, nullptr};
  }
};

// The scratch bias_sums takes (elements of k's dtype), so that it can be
// queued where nothing may be allocated (a cuda::Fork's side work).
inline int64_t bias_sums_scratch(int64_t B, int64_t S, int64_t C) { return batch_column_sums_scratch(B, S, 3 * C); }

template <Device Dev>
struct AttentionBiasKernels {
  // colsum_ds, rowsum_pd [B,H,S]; k [B,H,S,D] (unit d stride); dout, dy [B,S,C]; qkv_bias [3C], out_bias [C];
  // scratch [bias_sums_scratch(B, S, C)].
  static void bias_sums(const Tensor& colsum_ds, const Tensor& rowsum_pd, const Tensor& k, const Tensor& dout,
                        const Tensor& dy, double scale, const Tensor& qkv_bias, const Tensor& out_bias,
                        const Tensor& scratch);
};
TG_EXTERN_CUDA_KERNELS(AttentionBiasKernels);

template <Device Dev>
void AttentionBiasKernels<Dev>::bias_sums(const Tensor& colsum_ds, const Tensor& rowsum_pd, const Tensor& k,
                                          const Tensor& dout, const Tensor& dy, double scale, const Tensor& qkv_bias,
                                          const Tensor& out_bias, const Tensor& scratch) {
  const int64_t B = k.size(0), H = k.size(1), S = k.size(2), D = k.size(3);
  if (B * S == 0) {  // sums of no rows
    for (const Tensor* t : {&qkv_bias, &out_bias}) fill_into(*t, 0.0);
    return;
  }
  if (H * D == 0) return;
  TG_DISPATCH_FLOAT(k.dtype(), T, [&] {
    const BiasSums<T> value{colsum_ds.data<T>(), rowsum_pd.data<T>(), k.data<T>(), dout.data<T>(), dy.data<T>(),
                            S, H, D, k.strides()[0], k.strides()[1], k.strides()[2], static_cast<T>(scale)};
    const BiasOutputs<T> out{qkv_bias.data<T>(), out_bias.data<T>(), H * D};
    TG_CHECK(scratch.dtype() == k.dtype() && scratch.numel() >= bias_sums_scratch(B, S, H * D),
             "fused_attention (biases): scratch of ", scratch.numel(), " ", dtype_name(scratch.dtype()), " for ",
             bias_sums_scratch(B, S, H * D), " ", dtype_name(k.dtype()), " partial sums");
    batch_column_sums_with<T>(Loop<Dev>{"fused_attention (biases)"}, value, B, S, 3 * H * D, out, scratch.data<T>());
  });
}

}  // namespace tg
