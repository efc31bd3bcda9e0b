// The fused attention backward kernel (one pass per key tile over the
// queries) and its launcher, a template over the product policy: built for
// sm_90 with the mma.sync policies (ops/fused_attention.cu) and for sm_90a
// with Hopper's warpgroup MMA (ops/fused_attention_warpgroup.cu, which
// includes core/wgmma.cuh first, so that its products are the ones found).
#pragma once
#include "ops/fused_attention_tiles.cuh"

namespace tg::cuda {

namespace {

// --------------------------------------------------------------- backward
// One CTA per (64 keys, b, h, split of the query tiles), 4 warps of 16 keys,
// two or three CTAs per SM (BackwardLayout). The CTA keeps its keys' V and K (and K^T for the
// 3xTF32 products of dQ) and walks query tiles of 64. Per warp and tile, in the
// transposed orientation (rows = keys):
//   S^T = K Q^T (recompute)  ->  P^T, Pd^T;   dPd^T = V dO^T;   dS^T
//   dV += Pd^T dO;   dK += dS^T Q                   (accumulators used as A)
// then dS goes through shared memory for dQ = dS K and the batch sum of dE,
// both added atomically. A warp's 16 rows are keys 2r and 2r+1 at fragment
// rows r and r + 8, so a thread's two rows are neighbouring columns of one Philox block.
//
// Loads are cp.async groups, issued ahead of their use: this tile's S x S
// input (P, or the edit_region_bias corner) while dPd^T is computed; the next
// tile's Q, dO, per-query e, Delta (lse) and Pd as soon as this tile's are
// read, during dQ and dE; the first tile's with the key flags at the start.
// (Reading P, the CTA's K and V are plain loads, converted to fp16 once, at
// the start, while those copies are in flight.)
//
// With the Fp16 policy ("high") Q, K, V and dO arrive as fp16 copies scaled
// by powers of two (to_fp16; reading P, K and V come as floats, and the CTA
// scales and converts its 64 keys' rows itself: ScaledHeadRows), K Q^T
// (recomputed) is unscaled, dS is scaled by a power of two from a bound on
// |dS| before it is rounded to fp16, and every product is unscaled where it
// is used (BackwardScales). The Fp16x3 policy ("highest" reading P) is the
// same with every operand as fp16 hi + 2^-11 lo: Q and dO from
// to_fp16_split's copies, K and V split by the CTA (both parts staged, two
// CTAs per SM), Pd and dS split in registers.

constexpr int kBwdKeys = 64, kBwdRows = 64, kBwdThreads = 128;
static_assert(kBwdRows <= kBwdKeys && kBwdKeys <= kStride, "float tiles ([query][key] or [key][d]) fit stride kStride");
static_assert(kBwdKeys == 16 * (kBwdThreads / 32) && kBwdRows == kBwdKeys,
              "a warp holds 16 keys (key_of_row) and computes dQ for 16 queries");

// The backward's shared memory, in bytes: the operand tiles K, V, Q and dO
// (Mma::Staged), then float tiles: dS (P or E in, dS out) and a second one,
// K^T for the 3xTF32 dQ product or, with kRead, the Pd tile (fp16 tiles in
// training have none); then per-query vectors (at "highest" with kRead each
// warp's four row sums) and per-key vectors; then (kFragmentOrderK) K again.
template <class Mma, bool kRead>
struct BackwardLayout : TileLayout<Mma> {
  using T = TileLayout<Mma>;
  // Fp16x3: 111 KB. The kernel's static shared memory (block_reduce's
  // partials, 896 bytes) counts against the same budget: two Fp16x3 CTAs of
  // the mma.sync kernel leave under 1 KB of an H200's SM free.
  static constexpr int kCtasPerSm = T::kHalf && !T::kSplit ? 3 : 2;
  static constexpr bool kSecondTile = !T::kHalf || kRead;
  // Recomputing P with the warpgroup products: K a second time, its keys in
  // fragment order, as S^T = K Q^T's A rows (wgmma takes a warp's A rows in
  // staged order; mma.sync reads K's rows through key_of_row).
  static constexpr bool kFragmentOrderK = Mma::kWarpgroup && !kRead;
  static constexpr size_t kRowSumBytes = kRead && Mma::kHighest ? kBwdThreads / 32 * 4 * kBwdRows * sizeof(double) : 0;
  static constexpr size_t kK = 0, kV = T::kTile, kQ = 2 * T::kTile, kDO = 3 * T::kTile, kDS = 4 * T::kTile,
                          kSecond = kDS + T::kFloatTile,
                          kSums = kSecond + (kSecondTile ? T::kFloatTile : 0),  // q_sums: doubles first
      kRows = kSums + kRowSumBytes, kKeys = kRows + 3 * kBwdRows * sizeof(float),
                          kFragmentKeys = kKeys + 2 * kBwdKeys * sizeof(float),
                          kUsed = kFragmentKeys + (kFragmentOrderK ? T::kTile : 0),
                          kBytes = kUsed + (T::kAlign - 16);  // room to reach a kAlign boundary from a 16-byte one
  static_assert(kQ % T::kAlign == 0 && kDO % T::kAlign == 0, "the query tiles start on kAlign boundaries");
};

// HalfKeyGradients as the kernel writes them (dk.ptr null: float dK and dV).
struct KeyHalves {
  HeadRows<__half> dk, dv;  // rows of [B S, 2C]
  int* exponents;           // [B H groups]
  int* min_exponent;
  float *dbk, *dbv;         // [C] each: HalfKeyGradients::db's second and last C
  int64_t groups;           // key groups of kHalfKeyGroup per (b, h)
};

struct BackwardArgs {
  HeadRows<const float> q, k, v;
  const float* dout;          // [B,S,H*D]
  const float *lse, *delta;   // [B,H,S]
  const float *P, *Pd;        // [B,H,S,S], or null: recompute
  HeadRows<float> dq, dk, dv;
  float* dE;                      // optional (null: not wanted)
  double* dw_sums;                // [2,H]: sum dS e_i e_j, sum dS cross(e_i, e_j); null: not wanted or kRowSums
  float *colsum_ds, *rowsum_pd;   // with kRead
  double* row_sums;               // [4,B,H,S] with kRowSums: A, B, m, n of each query row
  HalfOperands half;              // with the Fp16 and Fp16x3 policies
  ScoreArgs sc;
  int splits;  // CTAs per key tile, each walking every splits-th query tile; 1: dK and dV are stored, not added
  KeyHalves kv;  // in training with fp16 tiles, optional (then splits is 1)
  bool head_major;  // blockIdx.y is h B + b, else b H + h (head_major_grid)
};

// The factors between the kernel's scaled products and the true values (all
// 1 for float tiles). With fp16 tiles x is stored as s_x x, s_x = 2^e_x; the
// bound scale b_x (Fp16Group::scalars) has max |b_x x| < 2^14, so |dPd| <= D
// max|dO| max|v| < 2^34 / (b_dO b_v); |dP| is at most keep_scale times that,
// |Delta| <= max |dP| (a convex combination), and |dS| = P |dP - Delta| <
// 2^(35 + e_keep) / (b_dO b_v). dS is stored as s_dS dS with s_dS = 2^-(20 +
// e_keep) b_dO b_v, under 2^15 < 65504 (with a key tile's own b_v, capped by
// Delta's bound: KeyTileScales); Pd, at most keep_scale, as 2^-e_keep Pd,
// under 1, for any p.
struct BackwardScales {
  float qk = 1.f;   // q . k = qk * (the K Q^T product)
  float dpd = 1.f;  // dPd = dpd * (the V dO^T product)
  float ds = 1.f;   // the fp16 dS is ds * dS (and Pd is HalfOperands::pd_scale * Pd)
  float dv = 1.f, dk = 1.f, dq = 1.f;  // dV, dK, dQ = these * their products (the softmax scale included)
};

// The fp16 K and V tiles' scales: 1 / s_k, 1 / s_v and b_v (above), from
// their group's scalars (training: qkv's fp16 copy), or the CTA's own
// (ScaledHeadRows, the benchmark interface: s = b, and b_v infinite for a
// tile of zeros). A tile's b_v bounds dPd at its own keys but not Delta,
// which sums over every key of a row: then bound_delta, 2^e with max |Delta|
// 2^e in [2^13, 2^14) over the CTA's (b, h) (infinite for all zeros), caps
// s_dS too, so that s_dS |dS| <= s_dS (|dP| + |Delta|) < 2^14 + 2^14.
struct KeyTileScales {
  float inverse_k = 1.f, inverse_v = 1.f, bound_v = 1.f, bound_delta = INFINITY;
};

// 2^e with amax 2^e in [2^13, 2^14), or infinity (no bound) for amax = 0.
__device__ __forceinline__ float bound_scale_of(float amax) {
  return amax > 0.f ? ldexpf(1.f, scale_exponent(amax, 14)) : INFINITY;
}

template <class Mma>
__device__ BackwardScales backward_scales(const BackwardArgs& p, const KeyTileScales& keys) {
  BackwardScales f;
  f.dk = f.dq = p.sc.scale;
  if constexpr (TileLayout<Mma>::kHalf) {
    const HalfOperands& h = p.half;
    f.qk = h.inverse_scale(kHalfQ) * keys.inverse_k;
    f.dpd = keys.inverse_v * h.inverse_scale(kHalfDO);
    const float ds = fminf(0x1p-20f * h.pd_scale * keys.bound_v * h.bound_scale(kHalfDO), keys.bound_delta);
    f.ds = isinf(ds) ? 1.f : fmaxf(ds, 0x1p-126f);  // infinite: no finite bound (no dPd, no finite Delta)
    f.dv = h.inverse_scale(kHalfDO) / h.pd_scale;
    f.dk *= h.inverse_scale(kHalfQ) / f.ds;
    f.dq *= keys.inverse_k / f.ds;
  }
  return f;
}

__device__ __forceinline__ int key_of_row(int warp, int r) { return 16 * warp + (r < 8 ? 2 * r : 2 * (r - 8) + 1); }

// Adds the sums of rows 16 warp .. 16 warp + 15 of a float tile 64 wide to
// *out(row) (null: not added): two lanes per row, 32 columns each, read as
// 16-byte quads. The second lane of a row starts half-way through its quads,
// so a quarter warp (4 rows) reads 8 distinct 4-bank groups when stride / 4 is
// odd (kStride: 4 more than a multiple of 16).
template <class RowOut>
__device__ __forceinline__ void add_warp_row_sums(const float* tile, int stride, int warp, int lane,
                                                  const RowOut& out) {
  const int row = 16 * warp + (lane >> 1), half = lane & 1;
  const float4* quads = reinterpret_cast<const float4*>(tile + row * stride) + 8 * half;
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float4 x = quads[(k + 4 * half) & 7];
    sum += (x.x + x.y) + (x.z + x.w);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  float* dst = out(row);
  if (half == 0 && dst) atomicAdd(dst, sum);
}

// The warp's 16 keys of f_k dK and f_v dV (rows row(r): mma::store_pairs)
// as fp16 at their own scale 2^e, e from the larger of the two maxima
// (max 2^e in [2^13, 2^14)); e recorded, and the smallest e of a group with
// a nonzero kept; the v bias gradient added from the float dV. The k bias
// gradient sum_j dk_j is 0 (the rows of dS sum to 0): 0 times the float dK
// tile's column sums is added, which is nothing unless the tile holds a NaN
// or an Inf, which makes that dbk column NaN: non-finite where the decomposed
// graph's sum is.
template <class RowOf>
__device__ void store_key_halves(const KeyHalves& kv, const float (&dK)[8][4], const float (&dV)[8][4], float fk,
                                 float fv, int64_t bh, int64_t h, int64_t group, int lane, const RowOf& row) {
  const float m = warp_max(fmaxf(fabsf(fk) * mma::lane_abs_max(dK), fabsf(fv) * mma::lane_abs_max(dV)));
  const int e = scale_exponent(m, 14);
  const float s = ldexpf(1.f, e);
  mma::write_tile_half(dK, fk * s, row(&kv.dk), lane);
  mma::write_tile_half(dV, fv * s, row(&kv.dv), lane);
  if (lane == 0) {
    kv.exponents[bh * kv.groups + group] = e;
    if (m != 0.f) atomicMin(kv.min_exponent, e);
  }
  mma::add_column_sums(dV, fv, kv.dbv + h * kD, lane);
  mma::add_column_sums(dK, 0.f, kv.dbk + h * kD, lane);
}

// dE[h, i, j] += dS of the tile ([query][key] at stride kStride): the batch
// sum, four keys per atomic (stored when B = 1: then this CTA is the only one
// at (h, i, j)). A thread keeps one quad of keys and walks every kRowStep-th
// query row.
__device__ __forceinline__ void add_tile_to_dE(float* dE, const float* dSs, const ScoreArgs& sc, int64_t h, int64_t q0,
                                               int64_t k0) {
  const bool add = sc.B > 1;
  constexpr int kQuads = kBwdKeys / 4, kRowStep = kBwdThreads / kQuads;
  const int c = 4 * (threadIdx.x % kQuads), r0 = threadIdx.x / kQuads;
  const int inside = static_cast<int>(std::min<int64_t>(sc.S - k0 - c, 4));  // of the quad's 4 keys
  const int rows = static_cast<int>(std::min<int64_t>(sc.S - q0, kBwdRows));
  float* to = dE + (h * sc.M + q0 + r0) * sc.M + k0 + c;
  const float* from = dSs + r0 * kStride + c;
  if (inside == 4 && sc.M % 4 == 0 && reinterpret_cast<uintptr_t>(dE) % 16 == 0) {
#pragma unroll
    for (int k = 0; k < kBwdRows / kRowStep; ++k)
      if (r0 + k * kRowStep < rows) {
        const float4 v = *reinterpret_cast<const float4*>(from + k * kRowStep * kStride);
        float* at = to + k * kRowStep * sc.M;
        if (add) mma::red_add4(at, v.x, v.y, v.z, v.w);
        else *reinterpret_cast<float4*>(at) = v;
      }
  } else {  // the quad that straddles S (or an unaligned dE)
    for (int r = 0; r0 + r < rows; r += kRowStep)
      for (int x = 0; x < inside; ++x) {
        float* at = to + r * sc.M + x;
        const float v = from[r * kStride + x];
        if (add) atomicAdd(at, v);
        else *at = v;
      }
  }
}

// kRowSums: each of the tile's queries' four row sums (q_sums: [warp][4][query],
// one share per warp) added to row_sums ([4, B, H, S]).
__device__ __forceinline__ void add_query_row_sums(double* row_sums, const double* q_sums, const ScoreArgs& sc,
                                                   int64_t bh, int64_t q0) {
  if (threadIdx.x >= kBwdRows || q0 + threadIdx.x >= sc.S) return;
  const int64_t row = bh * sc.S + q0 + threadIdx.x, rows = sc.B * sc.H * sc.S;
  for (int f = 0; f < 4; ++f) {
    double sum = 0;
    for (int w = 0; w < kBwdThreads / 32; ++w) sum += q_sums[(4 * w + f) * kBwdRows + threadIdx.x];
    atomicAdd(row_sums + f * rows + row, sum);
  }
}

// The CTA's shares of dw_in's and dw_x's sums, summed over its threads, added
// to dw_sums ([2, H]): in fp64 across CTAs too, as the shares are much larger
// than the total.
__device__ __forceinline__ void add_edit_bias_scalar_sums(double* dw_sums, double in_part, double x_part,
                                                          const ScoreArgs& sc, int64_t h) {
  const double2 sums = block_reduce(
      double2{in_part, x_part}, [](double2 a, double2 b) { return double2{a.x + b.x, a.y + b.y}; }, double2{0, 0});
  if (threadIdx.x == 0) {
    atomicAdd(dw_sums + h, sums.x);
    atomicAdd(dw_sums + sc.H + h, sums.y);
  }
}

// kRead: P and Pd are read (the benchmark interface, with the row and column
// sums for the bias gradient); else recomputed from the log-sum-exp (training).
// kRowSums ("highest" with kRead): dw_in and dw_x are sums of dS that cancel
// ~200-fold, so at "highest" they are formed as the fp32 reference forms
// them, from the kernel's own dP with R = rowsum(dP P) rather than Delta =
// do . o of the given o (whose rounding differs from R's), out of four fp64
// row sums
//   A = sum_j P dP e_j,  B = sum_j P dP (1 - e_j),  m = sum_j P e_j,  n = sum_j P (1 - e_j)
// (P dP = Pd dPd), which finish_edit_bias_sums combines (docs/derivations.md).
template <class Mma, bool kRead>
__global__ void __launch_bounds__(kBwdThreads, BackwardLayout<Mma, kRead>::kCtasPerSm)
    attention_backward_kernel(BackwardArgs p) {
  after_previous_kernels();
  using Layout = BackwardLayout<Mma, kRead>;
  using Staged = typename Layout::Staged;
  constexpr bool kHalf = Layout::kHalf, kRowSums = kRead && Mma::kHighest;
  static_assert(kHalf || !kRead, "reading P and Pd: fp16 tiles (Fp16 or Fp16x3)");
  constexpr int kTs = Layout::kTileStride;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  unsigned char* smem = async::align_shared<Layout::kAlign>(smem_bytes);  // the layout's offsets count from here
  const auto at = [&](size_t offset) { return smem + offset; };
  Staged* Ks = reinterpret_cast<Staged*>(at(Layout::kK));     // [key][d]
  Staged* fragment_Ks = reinterpret_cast<Staged*>(at(Layout::kFragmentKeys));  // kFragmentOrderK: K in fragment order
  Staged* Vs = reinterpret_cast<Staged*>(at(Layout::kV));     // [key][d], keys in fragment order
  Staged* Qs = reinterpret_cast<Staged*>(at(Layout::kQ));     // [query][d]
  Staged* dOs = reinterpret_cast<Staged*>(at(Layout::kDO));   // [query][d]
  float* dSs = reinterpret_cast<float*>(at(Layout::kDS));     // [query][key]: P (kRead) or E, then dS
  float* second = Layout::kSecondTile ? reinterpret_cast<float*>(at(Layout::kSecond)) : nullptr;
  float* KTs = second;  // [d][key] with float tiles
  float* Pds = second;  // [query][key] with kRead
  double* q_sums = reinterpret_cast<double*>(at(Layout::kSums));  // [warp][4][query]: see kRowSums
  float* q_lse = reinterpret_cast<float*>(at(Layout::kRows));
  float* q_delta = q_lse + kBwdRows;
  float* q_e = q_delta + kBwdRows;
  float* key_e = reinterpret_cast<float*>(at(Layout::kKeys));
  float* key_a = key_e + kBwdKeys;  // a_j: key j takes part where it is not 0
  const ScoreArgs& sc = p.sc;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t b = p.head_major ? blockIdx.y % sc.B : blockIdx.y / sc.H;
  const int64_t h = p.head_major ? blockIdx.y / sc.B : blockIdx.y % sc.H;
  const int64_t bh = b * sc.H + h;
  const int64_t k0 = int64_t(blockIdx.x / p.splits) * kBwdKeys;
  const int split = blockIdx.x % p.splits;
  const int64_t C = sc.H * kD;
  const float w_in = sc.w_in[h], w_x = sc.w_x[h];
  constexpr bool recompute = !kRead;
  const int64_t query_tiles = (sc.S + kBwdRows - 1) / kBwdRows;
  const auto q_rows = operand_rows<kHalf>(p.q, p.half.q);
  const auto dout = operand_rows<kHalf>({p.dout, sc.S * C, kD, C}, {p.half.dout, sc.S * C, kD, C});
  const HeadRows<const __half> dout_low{p.half.dout_low, sc.S * C, kD, C};
  // Rows row0 .. row0 + 63 of an operand into its tile (placed by `place`), with Fp16x3 the low parts low_offset on.
  const auto copy_operand = [&](const auto& rows, const auto& lows, int64_t row0, Staged* dst, auto place,
                                int low_offset) {
    copy_head_rows<kBwdThreads>(rows, b, h, row0, kBwdRows, sc.S, dst, place);
    if constexpr (Layout::kSplit)
      copy_head_rows<kBwdThreads>(lows, b, h, row0, kBwdRows, sc.S, dst + low_offset, place);
  };
  // The tile's [query][key] corner of a [.., S or M, S or M] matrix.
  const auto copy_scores = [&](const float* m, int64_t ld, int64_t q0, float* dst) {
    copy_tile<kBwdThreads, kBwdRows, kBwdKeys>(m + q0 * ld + k0, ld, sc.S - q0, sc.S - k0, dst, kStride);
  };
  const auto probs = [&](const float* m) { return m + bh * sc.S * sc.S; };
  const auto copy_queries = [&](int64_t qt) {
    copy_operand(q_rows, p.half.q_low, qt * kBwdRows, Qs, Layout::place_queries(), Layout::query_low_offset());
    copy_operand(dout, dout_low, qt * kBwdRows, dOs, Layout::place_queries(), Layout::query_low_offset());
    if (threadIdx.x < kBwdRows) {  // the per-query values, zeros past S (where recompute's P is 0)
      const int i = static_cast<int>(qt) * kBwdRows + threadIdx.x;
      const bool ok = i < sc.S;
      const int src = ok ? i : 0;
      async::copy4(q_e + threadIdx.x, sc.e + b * sc.S + src, ok);
      async::copy4(q_delta + threadIdx.x, p.delta + bh * sc.S + src, ok);
      if constexpr (recompute) async::copy4(q_lse + threadIdx.x, p.lse + bh * sc.S + src, ok);
    }
  };

  // K and V: with kRead the float k and v, converted here at the CTA's own scales while the first tile's copies are
  // in flight; in training copies of qkv's fp16 copy (or of the float rows), at its group's scales.
  KeyTileScales keys;
  if constexpr (kRead) {
    // Every load of the prologue is issued before the first wait: the query
    // tile and the key flags, then the first tile's Pd (a group of its own,
    // waited for at the first tile), then k and v, then Delta's maximum
    // (over the (b, h)'s rows: Delta sums over every key tile's v); one block
    // reduction takes the three maxima.
    copy_queries(split);
    copy_key_flags(sc, b, k0, kBwdKeys, key_e, key_a);
    async::commit();
    copy_scores(probs(p.Pd), sc.S, split * kBwdRows, Pds);
    async::commit();
    ScaledHeadRows<kBwdThreads, kBwdKeys, decltype(Layout::place())::kWarpRows> k_in, v_in;
    k_in.load(p.k, b, h, k0, sc.S);
    v_in.load(p.v, b, h, k0, sc.S);
    const float3 amax = block_max3({thread_abs_max(p.delta + bh * sc.S, static_cast<int>(sc.S)), k_in.amax, v_in.amax});
    keys.bound_delta = bound_scale_of(amax.x);
    keys.inverse_k = k_in.template store<Layout::kSplit>(amax.y, Ks, Mma::kLowOffset, Layout::place(SameRow{}));
    keys.inverse_v = v_in.template store<Layout::kSplit>(amax.z, Vs, Mma::kLowOffset, Layout::place(FragmentOrder{}));
    keys.bound_v = bound_scale_of(amax.z);
  } else {
    static_assert(!Layout::kSplit, "split tiles read P (the benchmark interface)");
    copy_operand(operand_rows<kHalf>(p.k, p.half.k), HeadRows<const __half>{}, k0, Ks, Layout::place(SameRow{}), 0);
    if constexpr (Layout::kFragmentOrderK)
      copy_operand(operand_rows<kHalf>(p.k, p.half.k), HeadRows<const __half>{}, k0, fragment_Ks,
                   Layout::place(FragmentOrder{}), 0);
    copy_operand(operand_rows<kHalf>(p.v, p.half.v), HeadRows<const __half>{}, k0, Vs, Layout::place(FragmentOrder{}),
                 0);
    copy_queries(split);
    copy_key_flags(sc, b, k0, kBwdKeys, key_e, key_a);
    async::commit();
    if constexpr (kHalf)
      keys = {p.half.inverse_scale(kHalfK), p.half.inverse_scale(kHalfV), p.half.bound_scale(kHalfV)};
  }
  const BackwardScales factor = backward_scales<Mma>(p, keys);
  // Pd's factor going into the dV product (its fp16 scale with fp16 tiles).
  // In training the keep factors carry it (kept), and dP's factor divides it out again.
  const float pd_factor = kHalf ? p.half.pd_scale : 1.f, kept = sc.keep_scale * pd_factor;
  const float dpd_over_pd = factor.dpd / pd_factor;
  const float qk_scale = sc.scale * factor.qk;  // the score's factor of the K Q^T product, as in the forward
  async::wait<kRead ? 1 : 0>();  // the operands and key flags are in (with kRead the first Pd may still be on the way)
  mma::operand_tiles_written<Mma>();
  __syncthreads();
  if constexpr (!kHalf) transpose_rows<kBwdThreads>(Ks, kBwdKeys, KTs, kStride);

  const int jl[2] = {key_of_row(warp, g), key_of_row(warp, g + 8)};  // this thread's two keys, side by side
  const float ej[2] = {key_e[jl[0]], key_e[jl[1]]};
  const float2 terms[2] = {edit_terms(key_a[jl[0]] != 0.f, ej[0], w_in, w_x),
                           edit_terms(key_a[jl[1]] != 0.f, ej[1], w_in, w_x)};
  const auto key_rows = [&](int r) { return key_of_row(warp, r); };
  const mma::WarpRows warp_rows{warp};  // V's keys (stored in fragment order), dQ's queries
  float dK[8][4] = {}, dV[8][4] = {};
  // Per key j, over this thread's queries i: the column sum of dS (for the q
  // bias); and the thread's share of dw_in and dw_x, sums that largely
  // cancel (fp64 across tiles), from a tile's per-key sums of dS_ij e_i and
  // dS_ij (16 terms each, in TilePartial: fp32 at "high"):
  //   sum_i dS_ij e_i e_j = e_j sum_i dS_ij e_i
  //   sum_i dS_ij cross(e_i, e_j) = (1 - e_j) sum_i dS_ij e_i + e_j sum_i dS_ij (1 - e_i)
  using TilePartial = std::conditional_t<Mma::kHighest, double, float>;
  float colsum[2] = {0.f, 0.f};
  const uint64_t tile_step = dropout_block(8, 0, sc.S);  // 8 rows of the mask further: the next nt
  double dw_in_part = 0, dw_x_part = 0;

  for (int64_t qt = split; qt < query_tiles; qt += p.splits) {
    const int64_t q0 = qt * kBwdRows;
    const int queries = static_cast<int>(min(sc.S - q0, int64_t(kBwdRows)));  // in this tile
    // This lane's quad_draws block (the quad: the 4 lanes of one t and g >> 2): its row, query 2t + (g & 1)
    // of query tile (g & 3) >> 1 (of nt 0 and 1), at its keys' 8 columns.
    const uint64_t tile_block =
        dropout_block(bh * sc.S + q0 + 8 * ((g & 3) >> 1) + 2 * t + (g & 1), k0 + 16 * warp + 8 * (g >> 2), sc.S);
    __syncthreads();  // the previous tile's dS and q_sums are no longer read
    copy_scores(kRead ? probs(p.P) : sc.E + h * sc.M * sc.M, kRead ? sc.S : sc.M, q0, dSs);
    async::commit();
    async::wait<1>();  // this tile's Q, dO, e, Delta (lse) and Pd are in; its P or E may still be on the way
    mma::operand_tiles_written<Mma>();
    __syncthreads();

    // dPd^T = V dO^T
    float ds[8][4] = {};
    mma::tile_product<Mma, 8, 8>(ds, Vs, kTs, warp_rows, Layout::query_tile(dOs), kTs, 0, lane);

    // P^T and Pd^T, read or recomputed from S^T = K Q^T; then in place:
    // pd <- Pd^T and ds <- dS^T = P^T (dP^T - Delta) = Pd^T dPd^T - P^T Delta.
    float pd[8][4] = {};
    if constexpr (Layout::kFragmentOrderK)  // the warp's keys as staged
      mma::tile_product<Mma, 8, 8>(pd, fragment_Ks, kTs, warp_rows, Layout::query_tile(Qs), kTs, 0, lane);
    else if constexpr (recompute)
      mma::tile_product<Mma, 8, 8>(pd, Ks, kTs, key_rows, Layout::query_tile(Qs), kTs, 0, lane);
    async::wait<0>();
    __syncthreads();  // P or E is in
    TilePartial tile_e[2] = {}, tile_all[2] = {};
    uint32_t draws[4];  // recompute: quad_draws of tiles nt and nt + 1 (nt even), rows = queries
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int il0 = 8 * nt + 2 * t;
      if (recompute && nt % 2 == 0) quad_draws(sc, tile_block + nt * tile_step, g & 3, 2, draws);
      double sums[8] = {};  // kRowSums: A, B, m, n (f = 0 .. 3) of query column il0 + c at 2 f + c
      // Per query column il, the thread's two keys jl[0] and jl[1] = jl[0] + 1
      // are side by side: P (or E), Pd and dS move as float2, which also
      // keeps the warp's accesses free of bank conflicts at stride kStride.
#pragma unroll
      for (int cq = 0; cq < 2; ++cq) {
        const int il = il0 + cq;
        float2* staged = reinterpret_cast<float2*>(dSs + il * kStride + jl[0]);  // P or E in, dS out (zeros past S)
        const float2 in = *staged;
        const float2 pd_in = kRead ? *reinterpret_cast<const float2*>(Pds + il * kStride + jl[0]) : float2{};
        float lse_log2e = 0.f;  // recompute: lse log2(e), +inf past S and on a row whose keys are all masked: P 0
        bool query_e = false;
        if constexpr (recompute) {
          const float lse = q_lse[il];
          lse_log2e = il < queries && lse != -INFINITY ? lse * kLog2e : INFINITY;
          query_e = q_e[il] != 0.f;
        }
        float out[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int c = cq + 2 * r;  // the accumulator element of key row r, query column il
          const float staged_in = r ? in.y : in.x;
          float prob = 0.f, dropped = 0.f, d = 0.f;  // dropped: Pd, times pd_factor in training
          if constexpr (recompute) {
            // a masked key's score is -inf, so its P 0
            const float score = fmaf(pd[nt][c], qk_scale, staged_in) + (query_e ? terms[r].y : terms[r].x);
            // Pd's factor of P: kept (1 / (1 - p) times pd_factor) for a kept element, else 0
            const float keep = keeps(sc, draws[cq + 2 * (nt % 2)], r) ? kept : 0.f;
            prob = exp_shifted(score, lse_log2e);
            dropped = prob * keep;
            d = prob * (dpd_over_pd * ds[nt][c] * keep - q_delta[il]);
          } else {
            const float dpd = factor.dpd * ds[nt][c];
            prob = staged_in;
            dropped = r ? pd_in.y : pd_in.x;
            d = dropped * dpd - prob * q_delta[il];
            if constexpr (kRowSums) {
              const double pdp = double(dropped) * dpd;
              sums[cq] += pdp * ej[r];
              sums[2 + cq] += pdp * (1.f - ej[r]);
              sums[4 + cq] += double(prob) * ej[r];
              sums[6 + cq] += double(prob) * (1.f - ej[r]);
            }
          }
          pd[nt][c] = recompute ? dropped : pd_factor * dropped;
          ds[nt][c] = factor.ds * d;
          tile_all[r] += d;
          if constexpr (!kRowSums) tile_e[r] += TilePartial(d) * q_e[il];
          out[r] = d;
        }
        *staged = make_float2(out[0], out[1]);
      }
      if constexpr (kRowSums)  // lane g holds sum f = g / 2 of query il0 + g % 2 over the warp's keys
        q_sums[(4 * warp + (g >> 1)) * kBwdRows + il0 + (g & 1)] = mma::sum_over_fragment_rows(sums, g);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      colsum[r] += static_cast<float>(tile_all[r]);
      if constexpr (!kRowSums) {
        dw_in_part += ej[r] * double(tile_e[r]);
        dw_x_part += (1.0 - ej[r]) * double(tile_e[r]) + ej[r] * (double(tile_all[r]) - double(tile_e[r]));
      }
    }

    // dV += Pd^T dO, dK += dS^T Q (with Fp16Warpgroup issued asynchronously: done before Q and dO are replaced,
    // while the row sums of Pd run; Fp16x3Warpgroup waits for each product to fold it)
    mma::accumulator_product<Mma, 8, 8>(dV, pd, Layout::query_tile(dOs), kTs, lane);
    mma::accumulator_product<Mma, 8, 8>(dK, ds, Layout::query_tile(Qs), kTs, lane);

    if constexpr (kRead)  // rowsum(Pd) for the v bias, over this CTA's keys
      add_warp_row_sums(Pds, kStride, warp, lane, [&](int il) {
        return q0 + il < sc.S ? p.rowsum_pd + bh * sc.S + q0 + il : nullptr;
      });
    mma::products_done<Mma>();
    __syncthreads();  // dS and q_sums are complete; Q, dO, Pd, e, Delta (lse) are read: the next tile's may land
    if (qt + p.splits < query_tiles) {
      copy_queries(qt + p.splits);
      if constexpr (kRead) copy_scores(probs(p.Pd), sc.S, q0 + p.splits * kBwdRows, Pds);
    }
    async::commit();

    // dQ (64 queries x 64 d) += scale dS K: warp -> 16 queries, k over the CTA's keys.
    {
      float dq[8][4] = {};
      if constexpr (kHalf)
        mma::scaled_float_product<Mma, kBwdKeys / 8, 8>(dq, dSs, kStride, warp_rows, factor.ds, Ks, kTs, lane);
      else
        mma::tile_product<Mma, kBwdKeys / 8, 8>(dq, dSs, kStride, warp_rows, KTs, kStride, 0, lane);
      mma::write_tile(dq, factor.dq, [&](int r) {
        const int64_t i = q0 + 16 * warp + g + 8 * r;
        return i < sc.S ? p.dq.row(b, h, i) : nullptr;
      }, lane, true);
    }

    if (p.dE) add_tile_to_dE(p.dE, dSs, sc, h, q0, k0);
    if constexpr (kRowSums) add_query_row_sums(p.row_sums, q_sums, sc, bh, q0);
  }

  // The keys' gradients: dK (times scale) and dV, stored when this CTA walked
  // every query tile, else this split's share added; the column sums are
  // reduced over the quad first (every lane takes part).
  const auto key_row = [&](const auto* x) {
    return [&, x](int r) {
      const int64_t j = k0 + (r ? jl[1] : jl[0]);  // not jl[r]: indexed by a variable, jl could go to local memory
      return j < sc.S ? x->row(b, h, j) : nullptr;
    };
  };
  bool halves = false;
  if constexpr (kHalf && recompute) {
    halves = p.kv.dk.ptr != nullptr;
    const int64_t group = k0 / kHalfKeyGroup + warp;  // the warp's keys, 16 warp + (0 .. 15)
    if (halves && group * kHalfKeyGroup < sc.S)
      store_key_halves(p.kv, dK, dV, factor.dk, factor.dv, bh, h, group, lane, key_row);
  }
  if (!halves) {
    mma::write_tile(dK, factor.dk, key_row(&p.dk), lane, p.splits > 1);
    mma::write_tile(dV, factor.dv, key_row(&p.dv), lane, p.splits > 1);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    colsum[r] += __shfl_xor_sync(0xffffffffu, colsum[r], 1);
    colsum[r] += __shfl_xor_sync(0xffffffffu, colsum[r], 2);
    if (kRead && t == 0 && k0 + jl[r] < sc.S) atomicAdd(p.colsum_ds + bh * sc.S + k0 + jl[r], colsum[r]);
  }
  if (p.dw_sums) add_edit_bias_scalar_sums(p.dw_sums, dw_in_part, dw_x_part, sc, h);
}

// dw_in[h] and dw_x[h] = their sums, one block per head: the kernel's fp64
// sums, or with row_sums (kRowSums) the sums over rows (b, i) of
//   e_i (A - R m)   and   e_i (B - R n) + (1 - e_i)(A - R m),   R = A + B,
// which are sum_j dS e_j and sum_j dS (1 - e_j) with dS = P (dP - R).
__global__ void finish_edit_bias_sums_kernel(const double* dw_sums, const double* row_sums, const float* e,
                                             float* dw_in, float* dw_x, int64_t B, int64_t H, int64_t S) {
  after_previous_kernels();
  const int64_t h = blockIdx.x, rows = B * H * S;
  double in = 0, cross = 0;
  for (int64_t idx = threadIdx.x; row_sums && idx < B * S; idx += blockDim.x) {
    const int64_t b = idx / S, i = idx % S, row = (b * H + h) * S + i;
    const double A = row_sums[row], Bs = row_sums[rows + row], m = row_sums[2 * rows + row],
                 n = row_sums[3 * rows + row], ei = e[idx], R = A + Bs;
    in += ei * (A - R * m);
    cross += ei * (Bs - R * n) + (1 - ei) * (A - R * m);
  }
  in = block_sum(in);
  cross = block_sum(cross);
  if (threadIdx.x == 0) {
    dw_in[h] = static_cast<float>(row_sums ? in : dw_sums[h]);
    dw_x[h] = static_cast<float>(row_sums ? cross : dw_sums[H + h]);
  }
}

// The fp64 sums behind dw_in and dw_x: [2, H] of the kernel's, or with
// kRowSums [4, B, H, S] row sums.
int64_t edit_bias_sums_elements(const AttentionDims& d, bool row_sums) {
  return row_sums ? 4 * d.B * d.H * d.S : 2 * d.H;
}

// dw_in and dw_x from those sums (finish_edit_bias_sums_kernel, one block per head).
void launch_finish_edit_bias_sums(const AttentionInputs& in, const AttentionGradTensors& g, const Tensor& sums,
                                  bool row_sums) {
  const AttentionDims d = in.d;
  if (d.H == 0) return;
  const double* values = sums.data<double>();
  launch("fused_attention_backward (edit-bias sums)", finish_edit_bias_sums_kernel, static_cast<unsigned>(d.H), 256, 0,
         row_sums ? nullptr : values, row_sums ? values : nullptr, in.edit_mask.data<float>(), g.dw_in.data<float>(),
         g.dw_x.data<float>(), d.B, d.H, d.S);
}

KeyHalves key_halves_args(const HalfKeyGradients& kv, const AttentionDims& d) {
  const int64_t C = d.H * kD;
  TG_CHECK(kv.db.numel() == 3 * C && aligned16(kv.db.raw_data()), "fused_attention_backward: the fp16 keys' db ",
           kv.db.shape(), " must hold 3C = ", 3 * C,
           " biases, 16-byte aligned (its column sums add 8 bytes at a time)");
  __half* values = reinterpret_cast<__half*>(kv.values.data<float>());
  const auto rows = [&](int t) { return HeadRows<__half>{values + t * C, d.S * 2 * C, kD, 2 * C}; };
  return {rows(0), rows(1), reinterpret_cast<int*>(kv.exponents.data<float>()),
          reinterpret_cast<int*>(kv.scratch.data<float>()), kv.db.data<float>() + C, kv.db.data<float>() + 2 * C,
          (d.S + kHalfKeyGroup - 1) / kHalfKeyGroup};
}

// The backward's fp16 operands: q, k, v from in.qkv_half (in training the
// forward's copy of qkv; for the benchmark interface the caller's copy of
// q alone: the kernel converts k and v itself), dout from g.dout_half; with
// `split` (Fp16x3) the low parts of q and dout too (to_fp16_split's groups).
HalfOperands half_operands(const AttentionInputs& in, const AttentionGradTensors& g, bool read, bool split) {
  const AttentionDims d = in.d;
  TG_CHECK(g.dout_half.matrices.size() == 1, "fused_attention_backward: fp16 tiles need dout's fp16 copy");
  TG_CHECK(!split || (read && in.qkv_half.lows.size() == 1 && g.dout_half.lows.size() == 1),
           "fused_attention_backward: split fp16 tiles read P and need the low parts of q and dout "
           "(to_fp16_split); got ", in.qkv_half.lows.size(), " and ", g.dout_half.lows.size());
  HalfOperands h;
  if (read) {
    TG_CHECK(in.qkv_half.matrices.size() == 1, "fused_attention_backward: fp16 tiles reading P need q's "
             "fp16 copy (one matrix), got ", in.qkv_half.matrices.size());
    const auto heads = [&](const Fp16Matrix& m) {
      return HeadRows<const __half>{half_values(m), d.H * d.S * kD, d.S * kD, kD};
    };
    const float* s = in.qkv_half.scalars.data<float>();
    h = {heads(in.qkv_half.matrices[0]), {}, {}, nullptr, {s, nullptr, nullptr, nullptr}, {0, 0, 0, 0},
         pd_scale(in.p)};
    if (split) {
      h.q_low = heads(in.qkv_half.lows[0]);
      h.dout_low = half_values(g.dout_half.lows[0]);
    }
  } else {
    h = qkv_half_operands(in);
  }
  h.dout = half_values(g.dout_half.matrices[0]);
  h.scalars[kHalfDO] = g.dout_half.scalars.data<float>();
  return h;
}

// The order of the (b, h) pairs in blockIdx.y in training (the benchmark
// interface runs head-major always). Head-major (h B + b): the CTAs resident
// at once cover most batches of a few heads, so the dE corners they all add
// to stay in the L2 where the whole dE would not (the interface at 773/32:
// DRAM writes 1.49 -> 0.65 GB, bench/NOTES.md version 19; training at
// 32 x 773 -4%, at 8 x 1024 DRAM 1.47 -> 0.40 GB in the same time, version
// 40). Batch-major (b H + h) where the corners fit in the L2 anyway: there
// the batches of one head would add to the same dE lines at once (training
// at 64 x 128: +4..+7% head-major, versions 19 and 40).
bool head_major_grid(const AttentionDims& d, bool dE_wanted) {
  const int64_t dE_bytes = d.H * d.S * d.S * int64_t(sizeof(float));
  return dE_wanted && d.B > 1 && 2 * dE_bytes > context().l2_bytes;
}

struct BackwardGrid {
  int64_t key_tiles;
  int splits;
};

// The backward's grid: key tiles, and CTAs per key tile (splits), each
// walking every splits-th query tile (d not empty). A CTA's time is modelled
// as a fixed part worth about one query tile plus its tiles, and the kernel's
// as the CTA's time per wave of kCtasPerSm CTAs on every SM: the splits that
// minimise waves x (1 + tiles per CTA), the fewest on a tie.
template <class Mma, bool kRead>
BackwardGrid backward_grid(const AttentionDims& d) {
  const int64_t key_tiles = (d.S + kBwdKeys - 1) / kBwdKeys, query_tiles = (d.S + kBwdRows - 1) / kBwdRows;
  const int64_t ctas = key_tiles * d.B * d.H;
  const int64_t slots = BackwardLayout<Mma, kRead>::kCtasPerSm * int64_t(context().sm_count);
  const auto cost = [&](int64_t s) { return ((ctas * s + slots - 1) / slots) * (1 + (query_tiles + s - 1) / s); };
  int64_t best = 1;
  for (int64_t s = 2; s <= query_tiles; ++s)
    if (cost(s) < cost(best)) best = s;
  return {key_tiles, static_cast<int>(best)};
}

template <class Mma, bool kRead>
KernelResidency backward_residency() {
  using Layout = BackwardLayout<Mma, kRead>;
  allow_shared_memory<attention_backward_kernel<Mma, kRead>>(Layout::kBytes, "fused_attention");
  int resident = 0;
  TG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, attention_backward_kernel<Mma, kRead>,
                                                              kBwdThreads, Layout::kBytes),
                "fused_attention_backward (CTAs per SM)");
  return {resident, Layout::kCtasPerSm};
}

template <class Mma, bool kRead>
void launch_backward(const AttentionInputs& in, const AttentionGradTensors& g) {
  using Layout = BackwardLayout<Mma, kRead>;
  const AttentionDims d = in.d;
  const bool halves = g.key_halves.values.defined();
  TG_CHECK(!halves || (Layout::kHalf && !kRead), "fused_attention_backward: fp16 key gradients need fp16 tiles and "
           "a recomputed P");
  const auto [key_tiles, grid_splits] = backward_grid<Mma, kRead>(d);
  const int splits = halves ? 1 : grid_splits;  // fp16 dK and dV are stored by their tile's one CTA
  TG_CHECK(g.keys_zeroed || splits == 1, "fused_attention_backward: dk and dv are not zeroed, but ", splits,
           " CTAs per key tile would add to them (writes_key_gradients said they are written)");
  // The edit-bias scalar sums (dw_in, dw_x wanted): the kernel's fp64 sums,
  // or with kRowSums its row sums, in the caller's scratch or zeroed here.
  constexpr bool row_sums = kRead && Mma::kHighest;
  const bool sums = g.dw_in.defined(), given = g.edit_bias_sums.defined();
  const Tensor scratch = !sums ? Tensor()
                         : given ? g.edit_bias_sums
                                 : zeros({edit_bias_sums_elements(d, row_sums)}, {DType::Float64, Device::CUDA});
  const Tensor dw_sums = row_sums ? Tensor() : scratch, rows = row_sums ? scratch : Tensor();
  BackwardArgs args{head_rows<const float>(in.q), head_rows<const float>(in.k), head_rows<const float>(in.v),
                    data_or_null<float>(g.dout), data_or_null<float>(g.lse), g.delta.data<float>(),
                    data_or_null<float>(g.probs), data_or_null<float>(g.probs_dropped),
                    head_rows<float>(g.dq), head_rows<float>(g.dk), head_rows<float>(g.dv),
                    data_or_null<float>(g.dE), data_or_null<double>(dw_sums),
                    data_or_null<float>(g.colsum_ds), data_or_null<float>(g.rowsum_pd),
                    data_or_null<double>(rows), HalfOperands{}, score_args(in), splits,
                    halves ? key_halves_args(g.key_halves, d) : KeyHalves{},
                    kRead || head_major_grid(d, g.dE.defined())};
  if constexpr (Layout::kHalf) args.half = half_operands(in, g, kRead, Layout::kSplit);
  allow_shared_memory<attention_backward_kernel<Mma, kRead>>(Layout::kBytes, "fused_attention");
  const dim3 grid(static_cast<unsigned>(key_tiles * splits), static_cast<unsigned>(d.B * d.H));
  launch("fused_attention_backward", attention_backward_kernel<Mma, kRead>, grid, kBwdThreads, Layout::kBytes, args);
  if (sums && !given) launch_finish_edit_bias_sums(in, g, scratch, row_sums);
}

}  // namespace

}  // namespace tg::cuda

namespace tg::cuda {

// launch_backward with the warpgroup products (core/wgmma.cuh's
// Fp16Warpgroup at "high", Fp16x3Warpgroup at "highest"), reading P and Pd
// (read: the benchmark interface) or recomputing P (training, at "high"
// alone), on a device of compute capability 9.0
// (ops/fused_attention_warpgroup.cu, built for sm_90a).
void launch_backward_warpgroup(const AttentionInputs& in, const AttentionGradTensors& g, MatmulPrecision precision,
                               bool read);
// backward_residency of the kernel launch_backward_warpgroup runs.
KernelResidency backward_warpgroup_residency(MatmulPrecision precision, bool read);

}  // namespace tg::cuda
