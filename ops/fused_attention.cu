// The fused attention kernels: the forward (one pass over the keys with an
// online softmax) and the backward (one pass per key tile over the queries),
// on fp16 tensor cores (at "high"; at "highest" the benchmark interface's
// backward on split fp16 operands) or 3xTF32 (at "highest") (core/mma.cuh),
// tiles loaded with cp.async (core/async_copy.cuh). docs/derivations.md derives the math;
// the CPU kernels in fused_attention.cpp run the same algorithm as loops.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <type_traits>

#include "core/async_copy.cuh"
#include "core/cuda_context.h"
#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "core/fp16_scale.cuh"
#include "core/mma.cuh"
#include "ops/fused_attention_kernels.h"
#include "ops/matmul_kernels.h"
#include "ops/untracked.h"

namespace tg::cuda {

namespace {

using mma::Fp16;
using mma::Fp16x3;
using mma::Tf32x3;

constexpr int kD = 64;        // the head dim the kernels cover
constexpr int kStride = 68;   // shared row stride of 64-wide tiles: distinct banks for ldmatrix rows and for
                              // mma::accumulator_product's k-major loads (4 more than a multiple of 16)
static_assert(kStride >= kD && kStride % 16 == 4, "kStride: see above");
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// 2^x as one MUFU.EX2. The ftz form flushes results under 2^-126 to zero;
// exp2f's exact subnormals cost three more instructions per score, for
// probabilities that no sum can see.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// e^(x - shift), given shift log2(e): one FFMA and one MUFU.EX2.
__device__ __forceinline__ float exp_shifted(float x, float shift_log2e) {
  return ex2_ftz(fmaf(x, kLog2e, -shift_log2e));
}

// Rows of a [B,H,S,D] operand with a unit d stride (a view of qkv, or contiguous).
template <class T>
struct HeadRows {
  T* ptr;
  int64_t sb, sh, ss;
  __device__ T* row(int64_t b, int64_t h, int64_t s) const { return ptr + b * sb + h * sh + s * ss; }
};

template <class T>
HeadRows<T> head_rows(const Tensor& t) {  // none for an undefined t (not read)
  if (!t.defined()) return {};
  return {static_cast<T*>(t.raw_data()), t.strides()[0], t.strides()[1], t.strides()[2]};
}

// What a score s_ij needs beyond q . k, and the dropout draw.
struct ScoreArgs {
  const float *e, *a, *E, *w_in, *w_x;
  int64_t B, H, S, M;
  float scale, keep_scale;  // keep_scale = 1/(1-p)
  uint32_t keep_high_threshold;  // dropout_keep_threshold(p) << 16 (dropout_keep_pair)
  PhiloxDraw rng;                // in.rng's round keys and offset
  bool dropout;
};

ScoreArgs score_args(const AttentionInputs& in) {
  return {in.edit_mask.data<float>(), in.attn_mask.data<float>(), in.edit_region_bias.data<float>(),
          in.within.data<float>(),    in.cross.data<float>(),     in.d.B,
          in.d.H,                     in.d.S,                     in.d.M,
          static_cast<float>(in.scale), static_cast<float>(1.0 / (1.0 - in.p)),
          dropout_keep_threshold(static_cast<float>(in.p)) << 16,
          philox_draw(in.rng),        in.p > 0};
}

// The 16-byte chunks of a [row][d] tile of T that this thread copies: the
// elements col .. col + 16 / sizeof(T) - 1 of rows first_row(), first_row() +
// kRowStep, ...
template <int kThreads, class T>
struct HeadChunks {
  static constexpr int kPerChunk = 16 / sizeof(T), kPerRow = kD / kPerChunk, kRowStep = kThreads / kPerRow;
  static_assert(kThreads % kPerRow == 0, "a thread keeps one column");
  static __device__ int first_row() { return threadIdx.x / kPerRow; }
  static __device__ int col() { return kPerChunk * (threadIdx.x % kPerRow); }
};

// Where row r of a tile lands in shared memory: row r, or (FragmentOrder, for
// a 64-key tile whose rows are read as the backward's A fragments) the
// fragment row of key r within its warp's 16 (the inverse of key_of_row), so
// that a fragment's rows are consecutive in shared memory.
struct SameRow {
  __device__ int operator()(int r) const { return r; }
};
struct FragmentOrder {
  __device__ int operator()(int k) const { return 16 * (k / 16) + 8 * (k & 1) + (k % 16) / 2; }
};

// Queues the copy of rows row0 .. row0 + n - 1 of one head (zeros past S)
// into shared memory as [row][d], row stride `stride`, row r at dst_row(r).
template <int kThreads, class T, class RowMap = SameRow>
__device__ void copy_head_rows(const HeadRows<const T>& x, int64_t b, int64_t h, int64_t row0, int n, int64_t S,
                               T* dst, int stride = kStride, RowMap dst_row = {}) {
  using Chunks = HeadChunks<kThreads, T>;
  const int col = Chunks::col();
  const T* from = x.row(b, h, row0 + Chunks::first_row()) + col;
  if (row0 + n <= S) {  // every row exists: no per-row test (the common case, and most of the copies' instructions)
#pragma unroll
    for (int r = Chunks::first_row(); r < n; r += Chunks::kRowStep, from += Chunks::kRowStep * x.ss)
      async::copy16(dst + dst_row(r) * stride + col, from);
    return;
  }
  for (int r = Chunks::first_row(); r < n; r += Chunks::kRowStep, from += Chunks::kRowStep * x.ss) {
    const bool valid = row0 + r < S;
    async::copy16(dst + dst_row(r) * stride + col, valid ? from : x.ptr, valid);
  }
}

// Queues the copy of a kRows x kCols tile of a row-major global matrix (row
// stride ld) into shared memory (row stride dst_stride); elements at row >=
// rows or column >= cols become zeros. A thread keeps one column (or quad of
// columns) and walks every kRowStep-th row, so its addresses advance by a
// constant. 16-byte copies where the matrix allows them (ld and the tile's
// start multiples of 4 floats), else 4-byte copies of consecutive elements by
// consecutive lanes (one 128-byte span per warp); a whole tile of such rows
// goes a warp per row, without per-element checks.
template <int kThreads, int kRows, int kCols>
__device__ void copy_tile(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst, int dst_stride) {
  const int n_rows = static_cast<int>(rows < kRows ? rows : kRows);
  const int n_cols = static_cast<int>(cols < kCols ? cols : kCols);
  if (ld % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    constexpr int kPerRow = kCols / 4, kRowStep = kThreads / kPerRow;
    static_assert(kThreads % kPerRow == 0 && kRows % kRowStep == 0, "every thread walks the same number of rows");
    const int r0 = threadIdx.x / kPerRow, c = 4 * (threadIdx.x % kPerRow), inside = n_cols - c;  // of its 4 columns
    const float* from = src + r0 * ld + c;
    if (n_rows == kRows && n_cols == kCols) {  // a whole tile: no per-row test
#pragma unroll
      for (int k = 0; k < kRows / kRowStep; ++k, from += kRowStep * ld)
        async::copy16(dst + (r0 + k * kRowStep) * dst_stride + c, from);
      return;
    }
#pragma unroll
    for (int k = 0; k < kRows / kRowStep; ++k, from += kRowStep * ld) {
      const int r = r0 + k * kRowStep;
      float* to = dst + r * dst_stride + c;
      if (inside >= 4 || inside <= 0 || r >= n_rows) {
        const bool ok = r < n_rows && inside > 0;
        async::copy16(to, ok ? from : src, ok);
      } else {  // the quad that straddles column `cols`
        for (int x = 0; x < 4; ++x) async::copy4(to + x, x < inside ? from + x : src, x < inside);
      }
    }
  } else if (n_rows == kRows && n_cols == kCols) {  // a whole tile: a warp per row, no per-element checks
    constexpr int kWarps = kThreads / 32;
    static_assert(kThreads % 32 == 0 && kCols % 32 == 0 && kRows % kWarps == 0, "every warp copies whole rows");
    const int lane = threadIdx.x % 32, r0 = threadIdx.x / 32;
    const float* from = src + r0 * ld + lane;
    float* to = dst + r0 * dst_stride + lane;
#pragma unroll
    for (int k = 0; k < kRows / kWarps; ++k, from += kWarps * ld, to += kWarps * dst_stride)
#pragma unroll
      for (int c = 0; c < kCols; c += 32) async::copy4(to + c, from + c, true);
  } else {
    constexpr int kRowStep = kThreads / kCols;
    static_assert(kThreads % kCols == 0 && kRows % kRowStep == 0, "every thread walks the same number of rows");
    const int r0 = threadIdx.x / kCols, c = threadIdx.x % kCols;
    const float* from = src + r0 * ld + c;
#pragma unroll
    for (int k = 0; k < kRows / kRowStep; ++k, from += kRowStep * ld) {
      const int r = r0 + k * kRowStep;
      const bool ok = r < n_rows && c < n_cols;
      async::copy4(dst + r * dst_stride + c, ok ? from : src, ok);
    }
  }
}

// [d][row] from a [row][d] shared tile of n rows (stride kStride). Lane l
// takes row l, so the scalar stores hit distinct banks.
template <int kThreads>
__device__ void transpose_rows(const float* natural, int n, float* transposed, int transposed_stride) {
  for (int idx = threadIdx.x; idx < n * (kD / 4); idx += kThreads) {
    const int r = idx % n, c4 = idx / n;
    const float4 v = *reinterpret_cast<const float4*>(natural + r * kStride + 4 * c4);
    transposed[(4 * c4 + 0) * transposed_stride + r] = v.x;
    transposed[(4 * c4 + 1) * transposed_stride + r] = v.y;
    transposed[(4 * c4 + 2) * transposed_stride + r] = v.z;
    transposed[(4 * c4 + 3) * transposed_stride + r] = v.w;
  }
}

// The terms of a score beside q . k and E for one key: w_in e_i e_j + w_x
// cross(e_i, e_j) for a query with e_i = 0 (.x) and e_i = 1 (.y), or -inf for
// a key that is masked or past S. The masks are 0/1 (check_binary_mask), so
// these four values are attention_score's last two terms, and a kernel adds
// one of them per score instead of evaluating the sum.
__device__ __forceinline__ float2 edit_terms(bool key_ok, float e_j, float w_in, float w_x) {
  if (!key_ok) return {-INFINITY, -INFINITY};
  return e_j != 0.f ? float2{w_x, w_in} : float2{0.f, w_x};
}

// Whether key j of batch b takes part: it exists and is not masked.
__device__ __forceinline__ bool key_takes_part(const ScoreArgs& sc, int64_t b, int64_t j) {
  return j < sc.S && sc.a[b * sc.S + j] != 0.f;
}

// edit_terms of keys k0 .. k0 + n - 1 into shared memory, for queries with
// e_i = 0 (terms[j]) and e_i = 1 (terms[n + j]); thread j takes key k0 + j.
__device__ __forceinline__ void load_key_terms(const ScoreArgs& sc, int64_t b, int64_t k0, int n, float w_in,
                                               float w_x, float* terms) {
  if (threadIdx.x >= n) return;
  const int64_t j = k0 + threadIdx.x;
  const bool ok = key_takes_part(sc, b, j);
  const float2 t = edit_terms(ok, ok ? sc.e[b * sc.S + j] : 0.f, w_in, w_x);
  terms[threadIdx.x] = t.x;
  terms[n + threadIdx.x] = t.y;
}

// e_j and whether key j takes part (exists and is not masked) for keys k0 ..
// k0 + n - 1, into shared memory; thread j takes key k0 + j.
__device__ __forceinline__ void load_key_flags(const ScoreArgs& sc, int64_t b, int64_t k0, int n, float* key_e,
                                               float* key_ok) {
  if (threadIdx.x >= n) return;
  const int64_t j = k0 + threadIdx.x;
  key_e[threadIdx.x] = j < sc.S ? sc.e[b * sc.S + j] : 0.f;
  key_ok[threadIdx.x] = key_takes_part(sc, b, j) ? 1.f : 0.f;
}

// x[k] <- x[k ^ u] for a u in 0 .. 3 known only at run time (two rounds of selects).
__device__ __forceinline__ void xor_permute(uint32_t (&x)[4], int u) {
  uint32_t y[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) y[k] = u & 1 ? x[k ^ 1] : x[k];
#pragma unroll
  for (int k = 0; k < 4; ++k) x[k] = u & 2 ? y[k ^ 2] : y[k];
}

// The dropout draws of the four Philox blocks of a quad of lanes: the lanes
// lane ^ (k << shift), k = 0 .. 3, the lane with quad index u (0 .. 3) at k
// = u ^ (this lane's u). The quad holds four 8-column pieces of rows of the
// [B,H,S,S] mask, one Philox block each (core/philox.h), indexed (a, n), a,
// n = 0, 1 (the forward: row a of key tile n; the backward: query a of query
// tile n), and lane u holds columns 2u and 2u + 1 of each, that is lane u of
// every block. Lane u draws the block of (a, n) = (u & 1, u >> 1), `block`,
// and sends the lane u ^ k the lane of it that one needs, so each block is
// drawn once. bits[a + 2n]: lane u of the block of (a, n). Without dropout
// every element is kept (all ones).
__device__ __forceinline__ void quad_draws(const ScoreArgs& sc, uint64_t block, int u, int shift,
                                           uint32_t (&bits)[4]) {
  if (!sc.dropout) {
    bits[0] = bits[1] = bits[2] = bits[3] = ~0u;
    return;
  }
  const Philox4 r = philox_block(sc.rng, block);
#pragma unroll
  for (int k = 0; k < 4; ++k) bits[k] = r.v[k];
  xor_permute(bits, u);  // bits[k]: the lane that lane u ^ k needs
#pragma unroll
  for (int k = 1; k < 4; ++k) bits[k] = __shfl_xor_sync(0xffffffffu, bits[k], k << shift);
  xor_permute(bits, u);  // bits[k]: lane u of block k (it came from lane u ^ k)
}

// Pd's factor of P for column 2u + c (c = 0, 1) of quad_draws' lane `bits`:
// `kept` (1 / (1 - p), times a tile scale) for a kept element, else 0.
__device__ __forceinline__ float keep_factor(const ScoreArgs& sc, uint32_t bits, int c, float kept) {
  const KeepPair k = dropout_keep_pair(bits, sc.keep_high_threshold);
  return (c ? k.odd : k.even) ? kept : 0.f;
}

// fp16 operand tiles: where each of q, k, v, dO lives, its fp16 copy and
// its group's scalars (Fp16Group::scalars) with its matrix there, which give
// its storage scale s_x (x is stored as s_x x, and the group's alpha of (x,
// x) is 1 / s_x^2) and its bound scale b_x (max |b_x x| < 2^14); and Pd's
// scale 2^-e_keep, keep_scale = 1 / (1 - p) < 2^e_keep, so that the fp16 Pd is
// under 1 for any p.
constexpr int kHalfQ = 0, kHalfK = 1, kHalfV = 2, kHalfDO = 3;
constexpr int kHalfStride = 72;  // fp16 tiles: 144-byte rows, so ldmatrix's 8 rows hit distinct banks
static_assert(kHalfStride >= kD && kHalfStride % 8 == 0 && (kHalfStride / 2) % 32 == 4, "kHalfStride: see above");
// Fp16x3 tiles: a row's 64 hi values, its 64 lo values, 8 of padding:
// 272-byte rows, so ldmatrix's 8 rows hit distinct banks.
constexpr int kSplitStride = 136;
static_assert(mma::kLowOffset == kD && kSplitStride >= 2 * kD && kSplitStride % 8 == 0 && (kSplitStride / 2) % 32 == 4,
              "kSplitStride: see above");
struct HalfOperands {
  HeadRows<const __half> q, k, v;
  const __half* dout;        // [B,S,H*D] (the backward's)
  const float* scalars[4];   // of q, k, v, dO
  int matrix[4];             // of q, k, v, dO in its group
  float pd_scale;
  // With the Fp16x3 policy: the low parts of q, k, v and dO (to_fp16_split), at the same scales.
  HeadRows<const __half> q_low{}, k_low{}, v_low{};
  const __half* dout_low = nullptr;
  __device__ float inverse_scale(int x) const { return fp16_inverse_scale(scalars[x], matrix[x]); }  // 1 / s_x
  __device__ float bound_scale(int x) const { return scalars[x][kFp16BoundScales + matrix[x]]; }
};

// The operand rows a kernel reads: the fp16 copy's with fp16 tiles, else the float tensor's.
template <bool kHalf>
__device__ auto operand_rows(const HeadRows<const float>& f, const HeadRows<const __half>& half) {
  if constexpr (kHalf) return half;
  else return f;
}

// The operand tiles of both kernels, 64 rows of Mma::Staged (fp16 rows of
// kHalfStride, Fp16x3's hi and lo rows of kSplitStride, or float rows of
// kStride), and the float tiles of 64 rows of kStride.
template <class Mma>
struct TileLayout {
  using Staged = typename Mma::Staged;
  static constexpr bool kHalf = sizeof(Staged) == 2, kSplit = kHalf && Mma::kHighest;
  static constexpr int kTileStride = kSplit ? kSplitStride : kHalf ? kHalfStride : kStride;
  static constexpr size_t kTile = size_t(64) * kTileStride * sizeof(Staged), kFloatTile = 64 * kStride * sizeof(float);
  static_assert(kTile % 16 == 0 && kFloatTile % 16 == 0, "tiles start on 16-byte boundaries");
};

// ---------------------------------------------------------------- forward
// One CTA per (64 queries, b, h), 4 warps of 16 query rows each; key tiles of
// 64. Per warp and tile: S = Q K^T (8 n-tiles), the online softmax, dropout,
// then O += Pd V with Pd's accumulator used directly as the A operand. K, V
// and the tile's corner of edit_region_bias arrive together through cp.async.
// With fp16 tiles ("high") q, k, v come from qkv's fp16 copy: the score
// unscales Q K^T with the softmax scale, and Pd goes in as 2^-e_keep Pd.

constexpr int kFwdRows = 64, kFwdKeys = 64, kFwdThreads = 128;

// The forward's shared memory, in bytes: Q, K, V (Mma::Staged), the float
// corner of edit_region_bias, then the keys' edit_terms. kMinCtasPerSm, the
// launch bound: with fp16 tiles four CTAs per SM (45 KB each; ptxas fits the
// kernel in 128 registers without spills, where unbounded it takes a few
// more, which allows three); with 3xTF32 none (0: about 140 registers, three
// per SM; a bound of one or three made ptxas spill).
template <class Mma>
struct ForwardLayout : TileLayout<Mma> {
  using T = TileLayout<Mma>;
  static constexpr int kMinCtasPerSm = T::kHalf ? 4 : 0;
  static constexpr size_t kQ = 0, kK = T::kTile, kV = 2 * T::kTile, kE = 3 * T::kTile,
                          kKeys = kE + T::kFloatTile, kBytes = kKeys + 2 * kFwdKeys * sizeof(float);
};

struct ForwardArgs {
  HeadRows<const float> q, k, v;
  float* o;    // [B,S,H*D]
  float* lse;  // [B,H,S]
  HalfOperands half;  // with the Fp16 policy (q, k, v)
  ScoreArgs sc;
};

template <class Mma>
__global__ void __launch_bounds__(kFwdThreads, ForwardLayout<Mma>::kMinCtasPerSm) attention_forward_kernel(ForwardArgs p) {
  using Layout = ForwardLayout<Mma>;
  using Staged = typename Layout::Staged;
  constexpr bool kHalf = Layout::kHalf;
  constexpr int kTs = Layout::kTileStride;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  Staged* Qs = reinterpret_cast<Staged*>(smem_bytes + Layout::kQ);  // [query][d]
  Staged* Ks = reinterpret_cast<Staged*>(smem_bytes + Layout::kK);  // [key][d]
  Staged* Vs = reinterpret_cast<Staged*>(smem_bytes + Layout::kV);  // [key][d]
  float* Es = reinterpret_cast<float*>(smem_bytes + Layout::kE);    // [query][key]: edit_region_bias[h, i, j]
  float* key_terms = reinterpret_cast<float*>(smem_bytes + Layout::kKeys);  // load_key_terms
  const ScoreArgs& sc = p.sc;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // b varies fastest in blockIdx.y: the B CTAs of one (h, query tile) run side by side and read each
  // edit_region_bias tile from the L2, not B times from memory.
  const int64_t h = blockIdx.y / sc.B, b = blockIdx.y % sc.B, q0 = int64_t(blockIdx.x) * kFwdRows;
  const int64_t rows[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
  // Per row: the max so far; its log2(e) multiple, rounded once (0 while every
  // key so far is masked): every P and every correction use this one value, so
  // its rounding cancels in o and in the log-sum-exp; and the sum of P.
  float m_run[2] = {-INFINITY, -INFINITY}, shift_log2e[2] = {0.f, 0.f}, l_run[2] = {0.f, 0.f};
  int terms_of[2];  // where the row's edit terms are in key_terms: by its e_i
  for (int r = 0; r < 2; ++r) terms_of[r] = rows[r] < sc.S && sc.e[b * sc.S + rows[r]] != 0.f ? kFwdKeys : 0;
  const int64_t row_id[2] = {(b * sc.H + h) * sc.S + rows[0], (b * sc.H + h) * sc.S + rows[1]};
  const float w_in = sc.w_in[h], w_x = sc.w_x[h];
  // The score's factor of the Q K^T product, Pd's scale going into P V, and o's of the P V product.
  float qk_scale = sc.scale, pd_scale = 1.f, o_scale = 1.f;
  if constexpr (kHalf) {
    qk_scale *= p.half.inverse_scale(kHalfQ) * p.half.inverse_scale(kHalfK);
    pd_scale = p.half.pd_scale;
    o_scale = p.half.inverse_scale(kHalfV) / pd_scale;
  }
  const float kept = sc.keep_scale * pd_scale;  // Pd's factor of P for a kept element (1 / (1 - p) times its scale)
  const auto q_rows = operand_rows<kHalf>(p.q, p.half.q), k_rows = operand_rows<kHalf>(p.k, p.half.k);
  const auto v_rows = operand_rows<kHalf>(p.v, p.half.v);
  float acc[8][4] = {};
  // quad_draws' block at key 0: row t & 1 of key tile t >> 1 (the quad: the 4 lanes of one g)
  const uint64_t row_block = dropout_block(t & 1 ? row_id[1] : row_id[0], 8 * (t >> 1), sc.S);
  copy_head_rows<kFwdThreads>(q_rows, b, h, q0, kFwdRows, sc.S, Qs, kTs);  // waited for with the first key tile
  const auto warp_row = [&](int r) { return 16 * warp + r; };

  for (int64_t k0 = 0; k0 < sc.S; k0 += kFwdKeys) {
    __syncthreads();  // the previous tile is no longer read
    copy_head_rows<kFwdThreads>(k_rows, b, h, k0, kFwdKeys, sc.S, Ks, kTs);
    copy_head_rows<kFwdThreads>(v_rows, b, h, k0, kFwdKeys, sc.S, Vs, kTs);
    copy_tile<kFwdThreads, kFwdRows, kFwdKeys>(sc.E + (h * sc.M + q0) * sc.M + k0, sc.M, sc.S - q0, sc.S - k0, Es,
                                               kStride);
    async::commit();
    load_key_terms(sc, b, k0, kFwdKeys, w_in, w_x, key_terms);
    async::wait<0>();
    __syncthreads();

    float s[8][4] = {};
    mma::tile_product<Mma, 8, 8>(s, Qs, kTs, warp_row, Ks, kTs, 0, lane);

    // Scores (attention_score, -inf for a masked key; rows past S, never
    // stored, score the zero tiles), then the online softmax: rescale what is
    // accumulated to the new row max.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // row r's two columns: E and the terms as float2
        const int col = 8 * nt + 2 * t;
        const float2 e = *reinterpret_cast<const float2*>(Es + warp_row(g + 8 * r) * kStride + col);
        const float2 term = *reinterpret_cast<const float2*>(key_terms + terms_of[r] + col);
        float &x0 = s[nt][2 * r], &x1 = s[nt][2 * r + 1];
        x0 = fmaf(x0, qk_scale, e.x) + term.x;
        x1 = fmaf(x1, qk_scale, e.y) + term.y;
        tile_max[r] = fmaxf(tile_max[r], fmaxf(x0, x1));
      }
    float correction[2];  // e^(old max - new max), through the shifts; 0 while nothing is accumulated
    bool moved = false;   // a row max of this thread moved
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
    if (__any_sync(0xffffffffu, moved))  // most tiles keep the warp's maxima: no rescale
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[nt][c] *= correction[c >> 1];
    uint32_t draws[4];  // quad_draws of tiles nt and nt + 1 (nt even)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (nt % 2 == 0) quad_draws(sc, row_block + (k0 + 8 * nt) / kDropoutBlockCols, t, 0, draws);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int r = c >> 1;
        const float pr = exp_shifted(s[nt][c], shift_log2e[r]);
        l_run[r] += pr;
        s[nt][c] = pr * keep_factor(sc, draws[r + 2 * (nt % 2)], c & 1, kept);
      }
    }

    mma::accumulator_product<Mma, 8, 8>(acc, s, Vs, kTs, lane);  // O += Pd V
  }

  const int64_t C = sc.H * kD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    if (rows[r] >= sc.S) continue;
    const float inv = l_run[r] > 0.f ? o_scale / l_run[r] : 0.f;
    float* o_row = p.o + (b * sc.S + rows[r]) * C + h * kD;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      *reinterpret_cast<float2*>(o_row + 8 * nt + 2 * t) = make_float2(acc[nt][2 * r] * inv, acc[nt][2 * r + 1] * inv);
    if (t == 0) p.lse[row_id[r]] = l_run[r] > 0.f ? (shift_log2e[r] + log2f(l_run[r])) * kLn2 : -INFINITY;
  }
}

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
// read, during dQ and dE.
//
// With the Fp16 policy ("high") Q, K, V and dO arrive as fp16 copies scaled
// by powers of two (to_fp16), K Q^T (recomputed) is unscaled, dS is scaled by
// a power of two from a bound on |dS| before it is rounded to fp16, and every
// product is unscaled where it is used (BackwardScales). The Fp16x3 policy
// ("highest" reading P) is the same with every operand as fp16 hi + 2^-11 lo:
// Q, K, V and dO from to_fp16_split's copies (both parts staged, two CTAs per
// SM), Pd and dS split in registers.

constexpr int kBwdKeys = 64, kBwdRows = 64, kBwdThreads = 128;
static_assert(kBwdRows <= kBwdKeys && kBwdKeys <= kStride, "float tiles ([query][key] or [key][d]) fit stride kStride");
static_assert(kBwdKeys == 16 * (kBwdThreads / 32) && kBwdRows == kBwdKeys,
              "a warp holds 16 keys (key_of_row) and computes dQ for 16 queries");

// The backward's shared memory, in bytes: the operand tiles K, V, Q and dO
// (Mma::Staged), then float tiles: dS (P or E in, dS out) and a second one,
// K^T for the 3xTF32 dQ product or, with kRead, the Pd tile (fp16 tiles in
// training have none); then per-query vectors (at "highest" with kRead each
// warp's four row sums) and per-key vectors.
template <class Mma, bool kRead>
struct BackwardLayout : TileLayout<Mma> {
  using T = TileLayout<Mma>;
  static constexpr int kCtasPerSm = T::kHalf && !T::kSplit ? 3 : 2;  // Fp16x3: 111 KB
  static constexpr bool kSecondTile = !T::kHalf || kRead;
  static constexpr size_t kRowSumBytes = kRead && Mma::kHighest ? kBwdThreads / 32 * 4 * kBwdRows * sizeof(double) : 0;
  static constexpr size_t kK = 0, kV = T::kTile, kQ = 2 * T::kTile, kDO = 3 * T::kTile, kDS = 4 * T::kTile,
                          kSecond = kDS + T::kFloatTile,
                          kSums = kSecond + (kSecondTile ? T::kFloatTile : 0),  // q_sums: doubles first
      kRows = kSums + kRowSumBytes, kKeys = kRows + 3 * kBwdRows * sizeof(float),
                          kBytes = kKeys + 2 * kBwdKeys * sizeof(float);
};

// HalfKeyGradients as the kernel writes them (dk.ptr null: float dK and dV).
struct KeyHalves {
  HeadRows<__half> dk, dv;  // rows of [B S, 2C]
  int* exponents;           // [B H groups]
  int* min_exponent;
  float* dbv;               // [C]
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
};

// The factors between the kernel's scaled products and the true values (all
// 1 for float tiles). With fp16 tiles x is stored as s_x x, s_x = 2^e_x; the
// bound scale b_x (Fp16Group::scalars) has max |b_x x| < 2^14, so |dPd| <= D
// max|dO| max|v| < 2^34 / (b_dO b_v); |dP| is at most keep_scale times that,
// |Delta| <= max |dP| (a convex combination), and |dS| = P |dP - Delta| <
// 2^(35 + e_keep) / (b_dO b_v). dS is stored as s_dS dS with s_dS = 2^-(20 +
// e_keep) b_dO b_v, under 2^15 < 65504; Pd, at most keep_scale, as 2^-e_keep
// Pd, under 1, for any p.
struct BackwardScales {
  float qk = 1.f;   // q . k = qk * (the K Q^T product)
  float dpd = 1.f;  // dPd = dpd * (the V dO^T product)
  float ds = 1.f;   // the fp16 dS is ds * dS (and Pd is HalfOperands::pd_scale * Pd)
  float dv = 1.f, dk = 1.f, dq = 1.f;  // dV, dK, dQ = these * their products (the softmax scale included)
};

template <class Mma>
__device__ BackwardScales backward_scales(const BackwardArgs& p) {
  BackwardScales f;
  f.dk = f.dq = p.sc.scale;
  if constexpr (TileLayout<Mma>::kHalf) {
    const HalfOperands& h = p.half;
    f.qk = h.inverse_scale(kHalfQ) * h.inverse_scale(kHalfK);
    f.dpd = h.inverse_scale(kHalfV) * h.inverse_scale(kHalfDO);
    f.ds = fmaxf(0x1p-20f * h.pd_scale * h.bound_scale(kHalfV) * h.bound_scale(kHalfDO), 0x1p-126f);
    f.dv = h.inverse_scale(kHalfDO) / h.pd_scale;
    f.dk *= h.inverse_scale(kHalfQ) / f.ds;
    f.dq *= h.inverse_scale(kHalfK) / f.ds;
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
// a nonzero kept; the v bias gradient added from the float dV (the k bias
// gradient is 0: the rows of dS sum to 0).
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
  using Layout = BackwardLayout<Mma, kRead>;
  using Staged = typename Layout::Staged;
  constexpr bool kHalf = Layout::kHalf, kRowSums = kRead && Mma::kHighest;
  static_assert(kHalf || !kRead, "reading P and Pd: fp16 tiles (Fp16 or Fp16x3)");
  constexpr int kTs = Layout::kTileStride;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  const auto at = [&](size_t offset) { return smem_bytes + offset; };
  Staged* Ks = reinterpret_cast<Staged*>(at(Layout::kK));     // [key][d]
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
  float* key_ok = key_e + kBwdKeys;
  const ScoreArgs& sc = p.sc;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // With kRead (the benchmark interface) blockIdx.y is h B + b: the CTAs resident at once cover most batches of one
  // head, so the dE corner they all add to stays in the L2 (at 773/32 DRAM writes 1.49 -> 0.65 GB, measured with the
  // query walk rotated too: bench/NOTES.md version 19). In training, b H + h.
  const int64_t b = kRead ? blockIdx.y % sc.B : blockIdx.y / sc.H, h = kRead ? blockIdx.y / sc.B : blockIdx.y % sc.H;
  const int64_t bh = b * sc.H + h;
  const int64_t k0 = int64_t(blockIdx.x / p.splits) * kBwdKeys;
  const int split = blockIdx.x % p.splits;
  const int64_t C = sc.H * kD;
  const float w_in = sc.w_in[h], w_x = sc.w_x[h];
  constexpr bool recompute = !kRead;
  const int64_t query_tiles = (sc.S + kBwdRows - 1) / kBwdRows;
  const BackwardScales factor = backward_scales<Mma>(p);
  // Pd's factor going into the dV product (its fp16 scale with fp16 tiles).
  // In training the keep factors carry it (kept), and dP's factor divides it out again.
  const float pd_factor = kHalf ? p.half.pd_scale : 1.f, kept = sc.keep_scale * pd_factor;
  const float dpd_over_pd = factor.dpd / pd_factor;
  const float qk_scale = sc.scale * factor.qk;  // the score's factor of the K Q^T product, as in the forward
  const auto q_rows = operand_rows<kHalf>(p.q, p.half.q), k_rows = operand_rows<kHalf>(p.k, p.half.k);
  const auto v_rows = operand_rows<kHalf>(p.v, p.half.v);
  const auto dout = operand_rows<kHalf>({p.dout, sc.S * C, kD, C}, {p.half.dout, sc.S * C, kD, C});
  const HeadRows<const __half> dout_low{p.half.dout_low, sc.S * C, kD, C};
  // Rows row0 .. row0 + 63 of an operand into its tile (row r at order(r)), with Fp16x3 the low parts beside them.
  const auto copy_operand = [&](const auto& rows, const auto& lows, int64_t row0, Staged* dst, auto order) {
    copy_head_rows<kBwdThreads>(rows, b, h, row0, kBwdRows, sc.S, dst, kTs, order);
    if constexpr (Layout::kSplit)
      copy_head_rows<kBwdThreads>(lows, b, h, row0, kBwdRows, sc.S, dst + mma::kLowOffset, kTs, order);
  };
  // The tile's [query][key] corner of a [.., S or M, S or M] matrix.
  const auto copy_scores = [&](const float* m, int64_t ld, int64_t q0, float* dst) {
    copy_tile<kBwdThreads, kBwdRows, kBwdKeys>(m + q0 * ld + k0, ld, sc.S - q0, sc.S - k0, dst, kStride);
  };
  const auto probs = [&](const float* m) { return m + bh * sc.S * sc.S; };
  const auto copy_queries = [&](int64_t qt) {
    copy_operand(q_rows, p.half.q_low, qt * kBwdRows, Qs, SameRow{});
    copy_operand(dout, dout_low, qt * kBwdRows, dOs, SameRow{});
    if (threadIdx.x < kBwdRows) {  // the per-query values, zeros past S (where recompute's P is 0)
      const int i = static_cast<int>(qt) * kBwdRows + threadIdx.x;
      const bool ok = i < sc.S;
      const int src = ok ? i : 0;
      async::copy4(q_e + threadIdx.x, sc.e + b * sc.S + src, ok);
      async::copy4(q_delta + threadIdx.x, p.delta + bh * sc.S + src, ok);
      if constexpr (recompute) async::copy4(q_lse + threadIdx.x, p.lse + bh * sc.S + src, ok);
    }
  };

  copy_operand(k_rows, p.half.k_low, k0, Ks, SameRow{});
  copy_operand(v_rows, p.half.v_low, k0, Vs, FragmentOrder{});
  copy_queries(split);
  async::commit();
  load_key_flags(sc, b, k0, kBwdKeys, key_e, key_ok);
  async::wait<0>();
  __syncthreads();
  if constexpr (!kHalf) transpose_rows<kBwdThreads>(Ks, kBwdKeys, KTs, kStride);
  if constexpr (kRead) {
    copy_scores(probs(p.Pd), sc.S, split * kBwdRows, Pds);
    async::commit();
  }

  const int jl[2] = {key_of_row(warp, g), key_of_row(warp, g + 8)};  // this thread's two keys, side by side
  const float ej[2] = {key_e[jl[0]], key_e[jl[1]]};
  const float2 terms[2] = {edit_terms(key_ok[jl[0]] != 0.f, ej[0], w_in, w_x),
                           edit_terms(key_ok[jl[1]] != 0.f, ej[1], w_in, w_x)};
  const auto key_rows = [&](int r) { return key_of_row(warp, r); };
  const auto warp_rows = [&](int r) { return 16 * warp + r; };  // V's keys (stored in fragment order), dQ's queries
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
    __syncthreads();

    // dPd^T = V dO^T
    float ds[8][4] = {};
    mma::tile_product<Mma, 8, 8>(ds, Vs, kTs, warp_rows, dOs, kTs, 0, lane);

    // P^T and Pd^T, read or recomputed from S^T = K Q^T; then in place:
    // pd <- Pd^T and ds <- dS^T = P^T (dP^T - Delta) = Pd^T dPd^T - P^T Delta.
    float pd[8][4] = {};
    if constexpr (recompute) mma::tile_product<Mma, 8, 8>(pd, Ks, kTs, key_rows, Qs, kTs, 0, lane);
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
            const float keep = keep_factor(sc, draws[cq + 2 * (nt % 2)], r, kept);  // times pd_factor
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

    mma::accumulator_product<Mma, 8, 8>(dV, pd, dOs, kTs, lane);  // dV += Pd^T dO
    mma::accumulator_product<Mma, 8, 8>(dK, ds, Qs, kTs, lane);   // dK += dS^T Q

    if constexpr (kRead)  // rowsum(Pd) for the v bias, over this CTA's keys
      add_warp_row_sums(Pds, kStride, warp, lane, [&](int il) {
        return q0 + il < sc.S ? p.rowsum_pd + bh * sc.S + q0 + il : nullptr;
      });
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

    // dE[h, i, j] += dS: the batch sum, four keys per atomic (stored when
    // B = 1: then this CTA is the only one at (h, i, j)). A thread keeps one
    // quad of keys and walks every kRowStep-th query row.
    if (p.dE) {
      const bool add = sc.B > 1;
      constexpr int kQuads = kBwdKeys / 4, kRowStep = kBwdThreads / kQuads;
      const int c = 4 * (threadIdx.x % kQuads), r0 = threadIdx.x / kQuads;
      const int inside = static_cast<int>(std::min<int64_t>(sc.S - k0 - c, 4));  // of the quad's 4 keys
      const int rows = static_cast<int>(std::min<int64_t>(sc.S - q0, kBwdRows));
      float* to = p.dE + (h * sc.M + q0 + r0) * sc.M + k0 + c;
      const float* from = dSs + r0 * kStride + c;
      if (inside == 4 && sc.M % 4 == 0 && reinterpret_cast<uintptr_t>(p.dE) % 16 == 0) {
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
    if (kRowSums && threadIdx.x < kBwdRows && q0 + threadIdx.x < sc.S) {
      const int64_t row = bh * sc.S + q0 + threadIdx.x, rows = sc.B * sc.H * sc.S;
      for (int f = 0; f < 4; ++f) {
        double sum = 0;
        for (int w = 0; w < kBwdThreads / 32; ++w) sum += q_sums[(4 * w + f) * kBwdRows + threadIdx.x];
        atomicAdd(p.row_sums + f * rows + row, sum);
      }
    }
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
  if (p.dw_sums) {  // fp64 across CTAs too: the partial sums are much larger than the total
    const double win = block_sum(dw_in_part), wx = block_sum(dw_x_part);
    if (threadIdx.x == 0) {
      atomicAdd(p.dw_sums + h, win);
      atomicAdd(p.dw_sums + sc.H + h, wx);
    }
  }
}

// delta[b, h, i] = dout_row . o_row over the 64 columns of head h: blockIdx.x
// is (b, h), blockIdx.y a block of queries, a warp per query (no division
// of a row index per row).
__global__ void row_dot_kernel(const float* dout, const float* o, float* delta, int64_t S, int64_t H) {
  const int64_t bh = blockIdx.x, b = bh / H, h = bh - b * H;
  const int64_t i = int64_t(blockIdx.y) * kRowsPerBlock + threadIdx.x / 32;
  if (i >= S) return;
  const int64_t at = (b * S + i) * H * kD + h * kD + 2 * (threadIdx.x % 32);
  const float2 x = *reinterpret_cast<const float2*>(dout + at), y = *reinterpret_cast<const float2*>(o + at);
  const float v = warp_sum(x.x * y.x + x.y * y.y);
  if (threadIdx.x % 32 == 0) delta[bh * S + i] = v;
}

// dw_in[h] and dw_x[h] = their sums, one block per head: the kernel's fp64
// sums, or with row_sums (kRowSums) the sums over rows (b, i) of
//   e_i (A - R m)   and   e_i (B - R n) + (1 - e_i)(A - R m),   R = A + B,
// which are sum_j dS e_j and sum_j dS (1 - e_j) with dS = P (dP - R).
__global__ void finish_edit_bias_sums_kernel(const double* dw_sums, const double* row_sums, const float* e,
                                             float* dw_in, float* dw_x, int64_t B, int64_t H, int64_t S) {
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

// ---- qkv's gradient as one fp16 matrix from the float dq and the fp16 dk,
// dv (HalfKeyGradients), for the fp16 GEMMs of the qkv projection's backward.

static_assert(kHalfKeyGroup == kBwdKeys / (kBwdThreads / 32), "a key group is one warp's keys");
constexpr int kNoExponent = 63;  // the largest scale_exponent: a group of zeros sets no bound

// scratch: [0] the smallest exponent (int), [1] dq's largest finite |x|.
__global__ void reset_key_halves_kernel(float* scratch) {
  reinterpret_cast<int*>(scratch)[0] = kNoExponent;
  scratch[1] = 0.f;
}

// scratch[1] = max(scratch[1], the largest finite |x| of x's quads).
__global__ void abs_max_kernel(const float4* x, int64_t quads, float* scratch) {
  float m = 0.f;
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < quads; q += int64_t(gridDim.x) * blockDim.x) {
    m = fmaxf(m, finite_abs_max(x[q]));
  }
  block_max_into(m, reinterpret_cast<unsigned*>(scratch + 1));
}

// The exponent every part of qkv's gradient is stored at: the smallest of
// the key groups' and dq's own.
__device__ int common_exponent(const float* scratch) {
  const int keys = reinterpret_cast<const int*>(scratch)[0];
  return scratch[1] == 0.f ? keys : min(keys, scale_exponent(scratch[1], 14));
}

struct HalfJoin {
  const float* dq;       // [rows, C]
  const __half* kv;      // [rows, 2C]
  const int* exponents;  // [B H groups]
  float* scratch;
  __half* out;           // [rows, 3C]
  int64_t rows, S, H, groups;
};

// out = 2^e [dq | dk | dv] with e = common_exponent: dq converted, each key
// group's fp16 values (2^e_g dk) multiplied by 2^(e - e_g) <= 1 (exact
// unless they fall into fp16's subnormals). Eight columns (16 bytes) per
// step; e goes back to scratch[0] (every thread computes the same e).
__global__ void join_half_qkv_kernel(const HalfJoin j) {
  const int64_t C = j.H * kD, chunks = 3 * C / 8;
  const int e = common_exponent(j.scratch);
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < j.rows * chunks;
       q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = q / chunks, c = 8 * (q - row * chunks);
    float v[8];
    float f;
    if (c < C) {
      const float4* from = reinterpret_cast<const float4*>(j.dq + row * C + c);
      const float4 lo = from[0], hi = from[1];
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
      f = ldexpf(1.f, e);
    } else {
      const int64_t kc = c - C, h = (kc % C) / kD, b = row / j.S, s = row - b * j.S;
      const uint4 raw = *reinterpret_cast<const uint4*>(j.kv + row * 2 * C + kc);
      const __half2* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 x = __half22float2(pairs[k]);
        v[2 * k] = x.x, v[2 * k + 1] = x.y;
      }
      f = ldexpf(1.f, e - j.exponents[(b * j.H + h) * j.groups + s / kHalfKeyGroup]);
    }
    uint4 out;
    __half2* pairs = reinterpret_cast<__half2*>(&out);
#pragma unroll
    for (int k = 0; k < 4; ++k) pairs[k] = __floats2half2_rn(f * v[2 * k], f * v[2 * k + 1]);
    *reinterpret_cast<uint4*>(j.out + row * 3 * C + c) = out;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) reinterpret_cast<int*>(j.scratch)[0] = e;  // min(e, dq's) is e again
}

// The scalars of the group {dqkv (at 2^e), then xw's matrices}, count in all.
__global__ void half_qkv_scalars_kernel(const float* scratch, const float* xw, int count, float* out) {
  const int e = reinterpret_cast<const int*>(scratch)[0];
  write_fp16_group_scalars(
      out, count, threadIdx.x, [&](int i) { return i == 0 ? ldexpf(1.f, -e) : fp16_inverse_scale(xw, i - 1); },
      [&](int i) { return i == 0 ? ldexpf(1.f, e) : xw[kFp16BoundScales + i - 1]; });
}

KeyHalves key_halves_args(const HalfKeyGradients& kv, const AttentionDims& d) {
  const int64_t C = d.H * kD;
  __half* values = reinterpret_cast<__half*>(kv.values.data<float>());
  const auto rows = [&](int t) { return HeadRows<__half>{values + t * C, d.S * 2 * C, kD, 2 * C}; };
  return {rows(0), rows(1), reinterpret_cast<int*>(kv.exponents.data<float>()),
          reinterpret_cast<int*>(kv.scratch.data<float>()), kv.dbv.data<float>(),
          (d.S + kHalfKeyGroup - 1) / kHalfKeyGroup};
}

// Raises kKernel's dynamic shared memory limit, once per kernel (not again
// inside a CUDA graph capture of a later call).
template <auto kKernel>
void allow_shared_memory(size_t bytes) {
  static std::once_flag once;
  std::call_once(once, [&] {
    TG_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                  "fused_attention");
  });
}

// A tensor the kernels read or write in vectors of `bytes`.
void check_aligned(const char* what, const Tensor& t, size_t bytes) {
  TG_CHECK(reinterpret_cast<uintptr_t>(t.raw_data()) % bytes == 0, "fused_attention: ", what, " ", t.shape(),
           " must start on a ", bytes, "-byte boundary");
}

// q, k, v (and the gradient views) must allow 16-byte loads of a head row.
void check_rows(const char* what, const Tensor& t) {
  const auto& st = t.strides();
  TG_CHECK(aligned16(t.raw_data()) && st[3] == 1 && st[0] % 4 == 0 && st[1] % 4 == 0 && st[2] % 4 == 0,
           "fused_attention: ", what, " ", t.shape(), " with strides ", st,
           " must have 16-byte aligned rows with a unit last stride");
}

// Pd's scale 2^-e_keep for the fp16 tiles: keep_scale = 1 / (1 - p) < 2^e_keep.
float pd_scale(double p) {
  int e_keep = 0;
  std::frexp(1.0 / (1.0 - p), &e_keep);
  return std::ldexp(1.f, -e_keep);
}

const __half* half_values(const Fp16Matrix& m) { return reinterpret_cast<const __half*>(m.values.data<float>()); }

// q, k, v from qkv's fp16 copy (training): a contiguous [B S, 3C] matrix,
// head h of part t at column t C + h D.
HalfOperands qkv_half_operands(const AttentionInputs& in) {
  const AttentionDims d = in.d;
  TG_CHECK(in.qkv_half.matrices.size() == 1, "fused_attention: fp16 tiles in training need qkv's fp16 copy");
  const int64_t C = d.H * kD;
  const __half* qkv = half_values(in.qkv_half.matrices[0]);
  const auto heads = [&](int t) { return HeadRows<const __half>{qkv + t * C, d.S * 3 * C, kD, 3 * C}; };
  const float* s = in.qkv_half.scalars.data<float>();
  return {heads(kHalfQ), heads(kHalfK), heads(kHalfV), nullptr, {s, s, s, nullptr}, {0, 0, 0, 0}, pd_scale(in.p)};
}

template <class Mma>
void launch_forward(const AttentionInputs& in, const Tensor& o, const Tensor& lse) {
  using Layout = ForwardLayout<Mma>;
  ForwardArgs args{head_rows<const float>(in.q), head_rows<const float>(in.k), head_rows<const float>(in.v),
                   o.data<float>(), lse.data<float>(), HalfOperands{}, score_args(in)};
  if constexpr (Layout::kHalf) args.half = qkv_half_operands(in);
  allow_shared_memory<attention_forward_kernel<Mma>>(Layout::kBytes);
  const dim3 grid(static_cast<unsigned>((in.d.S + kFwdRows - 1) / kFwdRows), static_cast<unsigned>(in.d.B * in.d.H));
  attention_forward_kernel<Mma><<<grid, kFwdThreads, Layout::kBytes, stream()>>>(args);
  check_launch("fused_attention");
}

// The backward's fp16 operands: q, k, v from in.qkv_half (in training the
// forward's copy of qkv; for the benchmark interface the caller's copies of
// q, k and v), dout from g.dout_half; with `split` (Fp16x3) their low parts
// too (to_fp16_split's groups).
HalfOperands half_operands(const AttentionInputs& in, const AttentionGradTensors& g, bool read, bool split) {
  const AttentionDims d = in.d;
  TG_CHECK(g.dout_half.matrices.size() == 1, "fused_attention_backward: fp16 tiles need dout's fp16 copy");
  TG_CHECK(!split || (read && in.qkv_half.lows.size() == 3 && g.dout_half.lows.size() == 1),
           "fused_attention_backward: split fp16 tiles read P and need the low parts of q, k, v and dout "
           "(to_fp16_split); got ", in.qkv_half.lows.size(), " and ", g.dout_half.lows.size());
  HalfOperands h;
  if (read) {
    TG_CHECK(in.qkv_half.matrices.size() == 3, "fused_attention_backward: fp16 tiles reading P need q, k, v's "
             "fp16 copies (three matrices), got ", in.qkv_half.matrices.size());
    const auto heads = [&](const Fp16Matrix& m) {
      return HeadRows<const __half>{half_values(m), d.H * d.S * kD, d.S * kD, kD};
    };
    const auto& hi = in.qkv_half.matrices;
    const float* s = in.qkv_half.scalars.data<float>();
    h = {heads(hi[kHalfQ]), heads(hi[kHalfK]), heads(hi[kHalfV]), nullptr, {s, s, s, nullptr}, {0, 1, 2, 0},
         pd_scale(in.p)};
    if (split) {
      const auto& lo = in.qkv_half.lows;
      h.q_low = heads(lo[kHalfQ]), h.k_low = heads(lo[kHalfK]), h.v_low = heads(lo[kHalfV]);
      h.dout_low = half_values(g.dout_half.lows[0]);
    }
  } else {
    h = qkv_half_operands(in);
  }
  h.dout = half_values(g.dout_half.matrices[0]);
  h.scalars[kHalfDO] = g.dout_half.scalars.data<float>();
  return h;
}

// The backward's policy: fp16 tiles at "high"; at "highest" split fp16
// tiles reading P (the benchmark interface, whose caller converts q, k, v
// and dout by to_fp16_split), 3xTF32 in training; f(policy, kRead) with
// kRead: P read, else recomputed (training).
template <class F>
decltype(auto) with_backward_policy(MatmulPrecision precision, bool read, F&& f) {
  const bool high = precision == MatmulPrecision::High;
  if (high && read) return f(Fp16{}, std::true_type{});
  if (high) return f(Fp16{}, std::false_type{});
  if (read) return f(Fp16x3{}, std::true_type{});
  return f(Tf32x3{}, std::false_type{});
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
  // The edit-bias scalar sums (dw_in, dw_x wanted): the kernel's fp64 sums, or with kRowSums its row sums.
  constexpr bool row_sums = kRead && Mma::kHighest;
  const bool sums = g.dw_in.defined();
  const TensorOptions f64{DType::Float64, Device::CUDA};
  const Tensor dw_sums = sums && !row_sums ? zeros({2, d.H}, f64) : Tensor();
  const Tensor rows = sums && row_sums ? zeros({4, d.B, d.H, d.S}, f64) : Tensor();
  BackwardArgs args{head_rows<const float>(in.q), head_rows<const float>(in.k), head_rows<const float>(in.v),
                    data_or_null<float>(g.dout), data_or_null<float>(g.lse), g.delta.data<float>(),
                    data_or_null<float>(g.probs), data_or_null<float>(g.probs_dropped),
                    head_rows<float>(g.dq), head_rows<float>(g.dk), head_rows<float>(g.dv),
                    data_or_null<float>(g.dE), data_or_null<double>(dw_sums),
                    data_or_null<float>(g.colsum_ds), data_or_null<float>(g.rowsum_pd),
                    data_or_null<double>(rows), HalfOperands{}, score_args(in), splits,
                    halves ? key_halves_args(g.key_halves, d) : KeyHalves{}};
  if constexpr (Layout::kHalf) args.half = half_operands(in, g, kRead, Layout::kSplit);
  allow_shared_memory<attention_backward_kernel<Mma, kRead>>(Layout::kBytes);
  const dim3 grid(static_cast<unsigned>(key_tiles * splits), static_cast<unsigned>(d.B * d.H));
  attention_backward_kernel<Mma, kRead><<<grid, kBwdThreads, Layout::kBytes, stream()>>>(args);
  check_launch("fused_attention_backward");
  if (sums) {
    finish_edit_bias_sums_kernel<<<static_cast<unsigned>(d.H), 256, 0, stream()>>>(
        args.dw_sums, args.row_sums, in.edit_mask.data<float>(), g.dw_in.data<float>(), g.dw_x.data<float>(),
        d.B, d.H, d.S);
    check_launch("fused_attention_backward (edit-bias sums)");
  }
}

}  // namespace

}  // namespace tg::cuda

namespace tg {

template <>
void FusedAttentionKernels<Device::CUDA>::forward(const AttentionInputs& in, const Tensor& o, const Tensor& lse,
                                                  MatmulPrecision precision) {
  using namespace cuda;
  if (in.d.B * in.d.H * in.d.S == 0) return;
  check_cuda_batch_heads("fused_attention", in.d.B, in.d.H);
  for (const auto& [t, name] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}}) check_rows(name, *t);
  if (precision == MatmulPrecision::High) launch_forward<Fp16>(in, o, lse);
  else launch_forward<Tf32x3>(in, o, lse);
}

template <>
void FusedAttentionKernels<Device::CUDA>::row_dot(const Tensor& dout, const Tensor& o, const Tensor& delta,
                                                  AttentionDims d) {
  using namespace cuda;
  const int64_t rows = d.B * d.H * d.S;
  if (rows == 0) return;
  check_aligned("dout", dout, 8);
  check_aligned("o", o, 8);
  const dim3 grid(static_cast<unsigned>(d.B * d.H), row_blocks(d.S));
  row_dot_kernel<<<grid, 32 * kRowsPerBlock, 0, stream()>>>(dout.data<float>(), o.data<float>(),
                                                           delta.data<float>(), d.S, d.H);
  check_launch("fused_attention (row dot)");
}

template <>
void FusedAttentionKernels<Device::CUDA>::backward(const AttentionInputs& in, const AttentionGradTensors& g,
                                                   MatmulPrecision precision) {
  using namespace cuda;
  if (in.d.B * in.d.H * in.d.S == 0) {  // no kernel runs: the written outputs are sums of nothing
    for (const Tensor* t : {&g.dw_in, &g.dw_x})
      if (t->defined()) fill_into(*t, 0.0);
    return;
  }
  check_cuda_batch_heads("fused_attention_backward", in.d.B, in.d.H);
  const bool half_qkv = !in.qkv_half.matrices.empty();  // q, k, v read from fp16 copies
  for (const auto& [t, name] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}, {&g.dq, "dq"}, {&g.dk, "dk"},
                                {&g.dv, "dv"}})
    if (!half_qkv || t->defined()) check_rows(name, *t);
  if (g.dout_half.matrices.empty()) check_aligned("dout", g.dout, 16);  // read as float tiles
  TG_CHECK(!g.probs.defined() || (g.colsum_ds.defined() && g.rowsum_pd.defined()),
           "fused_attention_backward: reading P needs the column and row sum outputs");
  with_backward_policy(precision, g.probs.defined(), [&](auto mma, auto read) {
    launch_backward<decltype(mma), decltype(read)::value>(in, g);
  });
}

template <>
void FusedAttentionKernels<Device::CUDA>::reset_key_halves(const HalfKeyGradients& kv) {
  cuda::reset_key_halves_kernel<<<1, 1, 0, cuda::stream()>>>(kv.scratch.data<float>());
  cuda::check_launch("fused_attention_backward (fp16 keys)");
}

template <>
void FusedAttentionKernels<Device::CUDA>::join_half_qkv(const Tensor& dq, const HalfKeyGradients& kv,
                                                        const AttentionDims& d, const Tensor& dqkv_values) {
  using namespace cuda;
  const int64_t rows = d.B * d.S, C = d.H * kD;
  TG_CHECK(dq.is_contiguous() && dq.numel() == rows * C && aligned16(dq.raw_data()) &&
               dqkv_values.numel() == rows * 3 * C / 2 && kv.values.numel() == rows * C,
           "join_half_qkv: dq ", dq.shape(), ", dk and dv ", kv.values.shape(), " and dqkv ", dqkv_values.shape(),
           " do not hold B S = ", rows, " rows of C = ", C, " columns each (dq contiguous and 16-byte aligned)");
  if (rows == 0) return;
  float* scratch = kv.scratch.data<float>();
  const int64_t quads = rows * C / 4;
  abs_max_kernel<<<grid_for(quads), kThreads, 0, stream()>>>(reinterpret_cast<const float4*>(dq.data<float>()),
                                                                quads, scratch);
  check_launch("join_half_qkv (dq's max)");
  const HalfJoin join{dq.data<float>(), reinterpret_cast<const __half*>(kv.values.data<float>()),
                      reinterpret_cast<const int*>(kv.exponents.data<float>()), scratch,
                      reinterpret_cast<__half*>(dqkv_values.data<float>()), rows, d.S, d.H,
                      (d.S + kHalfKeyGroup - 1) / kHalfKeyGroup};
  join_half_qkv_kernel<<<grid_for(rows * 3 * C / 8), kThreads, 0, stream()>>>(join);
  check_launch("join_half_qkv");
}

template <>
void FusedAttentionKernels<Device::CUDA>::half_qkv_scalars(const HalfKeyGradients& kv, const Fp16Group& xw,
                                                           const Tensor& scalars) {
  const int count = 1 + static_cast<int>(xw.matrices.size());
  TG_CHECK(count <= kMaxFp16Group && scalars.numel() == kFp16Scalars, "half_qkv_scalars: a group of dqkv and ",
           xw.matrices.size(), " more matrices (at most ", kMaxFp16Group, " in all) into ", kFp16Scalars,
           " scalars (got ", scalars.numel(), ")");
  static_assert(kMaxFp16Group * kMaxFp16Group <= 32, "one warp writes the alphas");
  cuda::half_qkv_scalars_kernel<<<1, 32, 0, cuda::stream()>>>(kv.scratch.data<float>(), xw.scalars.data<float>(),
                                                              count, scalars.data<float>());
  cuda::check_launch("half_qkv_scalars");
}

template <>
bool FusedAttentionKernels<Device::CUDA>::writes_key_gradients(const AttentionDims& d, MatmulPrecision precision,
                                                               bool read) {
  using namespace cuda;
  if (d.B * d.H * d.S == 0) return false;  // no kernel runs
  return with_backward_policy(precision, read, [&](auto mma, auto read_p) {
    return backward_grid<decltype(mma), decltype(read_p)::value>(d).splits == 1;
  });
}

}  // namespace tg

namespace tg {
TG_INSTANTIATE_KERNELS(AttentionBiasKernels, Device::CUDA);
}
