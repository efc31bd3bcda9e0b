// What both fused forward kernels share: their arguments and one thread's
// two rows of the online softmax over a 64-key tile (scores, running max,
// dropout, the stored o and lse). The kernels differ in their products and
// loads alone: attention_forward_kernel (ops/fused_attention.cu, mma.sync,
// four warps, cp.async) and the warpgroup kernel
// (ops/fused_attention_warpgroup.cu, wgmma, two warpgroups sharing K and V,
// the TMA). Both hand a thread the rows g and g + 8 of its warp's 16 and, per
// 8-key block nt, the columns 8 nt + 2 t and + 1 (mma.sync's C fragment,
// which is also a warp's share of a wgmma accumulator). docs/derivations.md
// derives the math.
#pragma once
#include "ops/fused_attention_tiles.cuh"

namespace tg::cuda {

namespace {

constexpr int kFwdKeys = 64;  // keys per tile

// o's optional fp16 copy (values null: none), [B S, H D] like o, at
// fp16_scale_from_bound(*bound_scale, shift) (FusedAttentionKernels::forward's o_half).
struct HalfOutputArgs {
  __half* values;
  const float* bound_scale;
  int shift;
};

struct ForwardArgs {
  HeadRows<const float> q, k, v;
  float* o;    // [B,S,H*D]
  float* lse;  // [B,H,S]
  HalfOperands half;  // with the Fp16 policy (q, k, v)
  ScoreArgs sc;
  HalfOutputArgs o_half;
};

// acc *= correction of its row (c >> 1: rows g, g + 8).
__device__ __forceinline__ void rescale_rows(float (&acc)[8][4], const float (&correction)[2]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[nt][c] *= correction[c >> 1];
}

// One thread's two rows (r = 0, 1) of the forward, for a query row(r) with
// [B,H,S] index id(r), and lane t of its quad. Per row: the max so far; its
// log2(e) multiple, rounded once (0 while every key so far is masked):
// every P and every correction use this one value, so its rounding cancels
// in o and in the log-sum-exp; the sum of P; where the row's edit terms
// are in a tile's key terms (by its e_i: KeyFlags::store's layout).
struct SoftmaxRows {
  float m_run[2] = {-INFINITY, -INFINITY}, shift_log2e[2] = {0.f, 0.f}, l_run[2] = {0.f, 0.f};
  int terms_of[2];
  uint64_t row_block;  // quad_draws' block at key 0: row t & 1 of key tile t >> 1 (the quad: the 4 lanes of one g)

  template <class RowOf, class RowId>
  __device__ SoftmaxRows(const ScoreArgs& sc, int64_t b, const RowOf& row, const RowId& id, int t)
      : row_block(dropout_block(id(t & 1), 8 * (t >> 1), sc.S)) {
#pragma unroll
    for (int r = 0; r < 2; ++r) terms_of[r] = row(r) < sc.S && sc.e[b * sc.S + row(r)] != 0.f ? kFwdKeys : 0;
  }

  // s (the tile's q . k products) <- its scores (attention_score: qk_scale
  // s + E + the key's terms, -inf for a masked key; rows past S, never
  // stored, score the zero tiles), e_pair(r, nt) giving E at row r's
  // columns 8 nt + 2 t and + 1; then the running maxima moved to the tile's:
  // correction[r] = e^(old max - new max) through the shifts (0 while
  // nothing is accumulated), l_run rescaled. Returns whether a row max of
  // the warp moved (else the accumulators need no rescale).
  template <class EPair>
  __device__ bool score(float (&s)[8][4], float qk_scale, const EPair& e_pair, const float* key_terms, int t,
                        float (&correction)[2]) {
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // row r's two columns: E and the terms as float2
        const int col = 8 * nt + 2 * t;
        const float2 e = e_pair(r, nt);
        const float2 term = *reinterpret_cast<const float2*>(key_terms + terms_of[r] + col);
        float &x0 = s[nt][2 * r], &x1 = s[nt][2 * r + 1];
        x0 = fmaf(x0, qk_scale, e.x) + term.x;
        x1 = fmaf(x1, qk_scale, e.y) + term.y;
        tile_max[r] = fmaxf(tile_max[r], fmaxf(x0, x1));
      }
    bool moved = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m_run[r], tile_max[r]), shift = m_new == -INFINITY ? 0.f : m_new * kLog2e;
      correction[r] = m_run[r] == -INFINITY ? 0.f : ex2_ftz(shift_log2e[r] - shift);
      moved = moved || m_new != m_run[r];
      m_run[r] = m_new, shift_log2e[r] = shift;
      l_run[r] *= correction[r];
    }
    return __any_sync(0xffffffffu, moved);  // most tiles keep the warp's maxima
  }

  // s (scores of the tile at key k0) <- P = e^(s - max), summed into l_run,
  // then times the kept mask: P where dropout keeps the element, else 0
  // (1 / (1 - p) goes on o once, at the end).
  __device__ void keep(float (&s)[8][4], const ScoreArgs& sc, int64_t k0, int t) {
    uint32_t draws[4];  // quad_draws of tiles nt and nt + 1 (nt even)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (nt % 2 == 0) quad_draws(sc, row_block + (k0 + 8 * nt) / kDropoutBlockCols, t, 0, draws);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int r = c >> 1;
        const float pr = exp_shifted(s[nt][c], shift_log2e[r]);
        l_run[r] += pr;
        s[nt][c] = keeps(sc, draws[r + 2 * (nt % 2)], c & 1) ? pr : 0.f;
      }
    }
  }

  // o's rows (o_offset(r): where row r's 64 values start in p.o) = o_scale
  // acc / l, o's fp16 copy too where p.o_half asks for it, and the lse, for
  // the rows before S. l_run is 0 only where every key is masked (o 0, lse
  // -inf); a NaN (a NaN or +inf score: fmaxf passes over NaN, so it shows in
  // l_run) gives NaN.
  template <class RowOf, class RowId, class OOffset>
  __device__ void store(const float (&acc)[8][4], float o_scale, const ForwardArgs& p, const RowOf& row,
                        const RowId& id, const OOffset& o_offset, int t) {
    const HalfOutputArgs& half = p.o_half;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
      if (row(r) >= p.sc.S) continue;
      const float inv = l_run[r] != 0.f ? o_scale / l_run[r] : 0.f;
      const int64_t at = o_offset(r) + 2 * t;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
        *reinterpret_cast<float2*>(p.o + at + 8 * nt) = make_float2(acc[nt][2 * r] * inv, acc[nt][2 * r + 1] * inv);
      if (half.values) {
        const float h = inv * fp16_scale_from_bound(*half.bound_scale, half.shift);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *reinterpret_cast<__half2*>(half.values + at + 8 * nt) =
              __floats2half2_rn(acc[nt][2 * r] * h, acc[nt][2 * r + 1] * h);
      }
      if (t == 0) p.lse[id(r)] = l_run[r] != 0.f ? (shift_log2e[r] + log2f(l_run[r])) * kLn2 : -INFINITY;
    }
  }
};

// ForwardArgs::o_half for FusedAttentionKernels::forward's o_half (undefined: none).
inline HalfOutputArgs half_output_args(const AttentionInputs& in, const Tensor& o_half) {
  if (!o_half.defined()) return {nullptr, nullptr, 0};
  const AttentionDims& d = in.d;
  TG_CHECK(in.qkv_half.matrices.size() == 1 && o_half.dtype() == DType::Float32 && o_half.is_contiguous() &&
               o_half.numel() == (d.B * d.S * d.H * kD + 1) / 2,
           "fused_attention: o's fp16 copy needs qkv's and the fp16 pairs of [", d.B * d.S, ", ", d.H * kD,
           "] (contiguous float32 storage of ", (d.B * d.S * d.H * kD + 1) / 2, "), got ", o_half.shape());
  return {reinterpret_cast<__half*>(o_half.data<float>()), in.qkv_half.scalars.data<float>() + kFp16BoundScales,
          keep_scale_exponent(in.p)};
}

}  // namespace

}  // namespace tg::cuda

namespace tg::cuda {

// The fp16 training forward on Hopper's warpgroup MMA (ops/fused_attention_warpgroup.cu,
// built for sm_90a; run where ops/fused_attention.cu's warpgroup_kernels_run):
// whether its loads take these inputs, and its launch.
bool forward_warpgroup_takes(const AttentionInputs& in);
void launch_forward_warpgroup(const AttentionInputs& in, const Tensor& o, const Tensor& lse, const Tensor& o_half);

}  // namespace tg::cuda
