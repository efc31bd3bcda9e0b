// The fused attention kernels' shared device code: operand rows, score
// terms, tile copies (cp.async), dropout draws, fp16 operand scales and the
// operand tiles' shared-memory layout, and the host helpers both launchers
// use. Included by ops/fused_attention.cu (sm_90) and, through
// ops/fused_attention_backward.cuh, by ops/fused_attention_warpgroup.cu
// (sm_90a); everything is internal to each translation unit.
#pragma once
#include <algorithm>
#include <cmath>
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
// elements col() .. col() + 16 / sizeof(T) - 1 of rows first_row(),
// first_row() + kRowStep, ... A warp's 32 chunks cover kRows consecutive
// rows: whole rows (kWarpRows 0), or kWarpRows rows of part of each. A
// placement that puts all of a row's chunks in one bank group
// (CoreMatrixRows) wants 8 rows of 4 chunks: rows placed in order (SameRow)
// then fall in all 8 bank groups (row % 8), the fewest shared-memory
// wavefronts for stores from registers; V's FragmentOrder pairs them (rows
// 0, 8, 1, 9, ...: 4 groups, twice the wavefronts, half as many as whole
// rows take; V is copied once per CTA). A cp.async writes a 32-byte sector,
// two chunks of one row, at a time, which such a placement puts in one bank
// group whatever the map: with the warpgroup products the tiles copied
// every query tile use SwizzledRowsAt (TileLayout::place_queries).
template <int kThreads, class T, int kWarpRows>
struct HeadChunks {
  static constexpr int kPerChunk = 16 / sizeof(T), kPerRow = kD / kPerChunk, kWarps = kThreads / 32;
  static constexpr int kRows = kWarpRows ? kWarpRows : 32 / kPerRow;
  static constexpr int kRowLanes = 32 / kRows;  // a warp's lanes per row
  static constexpr int kColumnGroups = kPerRow / kRowLanes;  // warps that share rows, each its own chunks of them
  static constexpr int kRowStep = kRows * kWarps / kColumnGroups;
  static_assert(kThreads % 32 == 0 && kRows * kRowLanes == 32 && kPerRow % kRowLanes == 0 &&
                    kWarps % kColumnGroups == 0,
                "each group of kColumnGroups warps covers whole rows, every thread the same number of them");
  // With one column group the map reduces to a division, written so: the general form compiles to other code
  // (six sm_90 kernels' cubins differ) for the same map.
  static constexpr int first_row_of(unsigned tid) {
    if constexpr (kColumnGroups == 1) return tid / kRowLanes;
    else return kRows * (tid / 32 / kColumnGroups) + tid % 32 / kRowLanes;
  }
  static constexpr int col_of(unsigned tid) {
    if constexpr (kColumnGroups == 1) return kPerChunk * (tid % kRowLanes);
    else return kPerChunk * (kRowLanes * (tid / 32 % kColumnGroups) + tid % kRowLanes);
  }
  static __device__ int first_row() { return first_row_of(threadIdx.x); }
  static __device__ int col() { return col_of(threadIdx.x); }
  // Every chunk of kRowStep rows is one thread's (so every row of a tile, walked kRowStep at a time).
  static constexpr bool covers_each_chunk_once() {
    int copies[kRowStep * kPerRow] = {};
    for (unsigned tid = 0; tid < kThreads; ++tid) {
      const int r = first_row_of(tid), c = col_of(tid);
      if (r < 0 || r >= kRowStep || c % kPerChunk != 0 || c < 0 || c >= kD) return false;
      ++copies[r * kPerRow + c / kPerChunk];
    }
    for (const int n : copies)
      if (n != 1) return false;
    return true;
  }
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

// Where element (r, col) of a [row][d] tile lands in shared memory, in
// elements from the tile's start: row row_of(r) of stride `stride`
// (RowsAt), or of core matrices (CoreMatrixRows, core/mma.cuh's
// core_matrix_offset: the warpgroup policies' tiles, 16-byte chunks of a row
// stay contiguous).
template <class RowMap>
struct RowsAt {
  static constexpr int kWarpRows = 0;  // a warp copies whole rows
  int stride;
  RowMap row_of;
  __device__ int operator()(int r, int col) const { return row_of(r) * stride + col; }
};
template <class RowMap>
struct CoreMatrixRows {
  static constexpr int kWarpRows = 8;  // a row's 16-byte chunks share a bank group (row % 8): a warp copies 8 rows
  int cols;                            // halves in a staged row (kD, or 2 kD for hi and lo)
  RowMap row_of;
  __device__ int operator()(int r, int col) const { return mma::core_matrix_offset(row_of(r), col, cols); }
};

// Rows of 64 halves with the 128-byte swizzle (core/mma.cuh's
// swizzled_row_offset): a row's 128 bytes together, so a warp copies whole
// rows, 512 contiguous bytes.
struct SwizzledRowsAt {
  static constexpr int kWarpRows = 0;
  __device__ int operator()(int r, int col) const { return mma::swizzled_row_offset(r, col); }
};

// Queues the copy of rows row0 .. row0 + n - 1 of one head (zeros past S)
// into shared memory as [row][d], element (r, col) at dst + at(r, col).
template <int kThreads, class T, class Place>
__device__ void copy_head_rows(const HeadRows<const T>& x, int64_t b, int64_t h, int64_t row0, int n, int64_t S,
                               T* dst, const Place& at) {
  using Chunks = HeadChunks<kThreads, T, Place::kWarpRows>;
  static_assert(Chunks::covers_each_chunk_once(), "the threads copy every chunk of kRowStep rows exactly once");
  const int col = Chunks::col();
  const T* from = x.row(b, h, row0 + Chunks::first_row()) + col;
  if (row0 + n <= S) {  // every row exists: no per-row test (the common case, and most of the copies' instructions)
#pragma unroll
    for (int r = Chunks::first_row(); r < n; r += Chunks::kRowStep, from += Chunks::kRowStep * x.ss)
      async::copy16(dst + at(r, col), from);
    return;
  }
  for (int r = Chunks::first_row(); r < n; r += Chunks::kRowStep, from += Chunks::kRowStep * x.ss) {
    const bool valid = row0 + r < S;
    async::copy16(dst + at(r, col), valid ? from : x.ptr, valid);
  }
}

// kRows rows of one head of a float operand on their way into an fp16 tile
// that the kernel scales itself (the benchmark interface's K and V: a CTA
// stages its keys once, so reading the float rows here replaces a
// conversion pass before the kernel; bench/NOTES.md, version 30). Each
// thread holds the 16-byte chunks copy_head_rows would copy (HeadChunks) as
// floats: load; the caller takes the block's largest amax (tile_amax, the
// tile's largest finite |x|: block_max, or block_max3 with other maxima),
// then every thread calls store(tile_amax, ...), which scales the tile by
// 2^e (tile_amax put in [2^13, 2^14) as to_fp16's bound scale puts a
// matrix's max) and returns 2^-e.
template <int kThreads, int kRows, int kWarpRows>
struct ScaledHeadRows {
  using Chunks = HeadChunks<kThreads, __half, kWarpRows>;
  static_assert(Chunks::covers_each_chunk_once() && kRows % Chunks::kRowStep == 0,
                "the threads hold every chunk of the tile exactly once");
  static constexpr int kChunks = kRows / Chunks::kRowStep, kPerChunk = Chunks::kPerChunk;
  static_assert(kPerChunk == 8, "a chunk is four fp16 pairs");
  float x[kChunks][kPerChunk];
  float amax = 0.f;  // of this thread's finite elements

  // Rows row0 .. row0 + kRows - 1 (zeros past S), 16-byte aligned (check_rows).
  __device__ void load(const HeadRows<const float>& rows, int64_t b, int64_t h, int64_t row0, int64_t S) {
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t s = row0 + Chunks::first_row() + k * Chunks::kRowStep;
      const float4* from = reinterpret_cast<const float4*>(rows.row(b, h, s < S ? s : 0) + Chunks::col());
#pragma unroll
      for (int i = 0; i < kPerChunk; i += 4) {
        const float4 v = s < S ? from[i / 4] : float4{};
        x[k][i] = v.x, x[k][i + 1] = v.y, x[k][i + 2] = v.z, x[k][i + 3] = v.w;
        amax = fmaxf(amax, finite_abs_max(v));
      }
    }
  }

  // Element (r, col) to dst + at(r, col), with kLow its low part low_offset
  // further, at the scale of tile_amax (the block's largest amax); returns 1 / that scale.
  template <bool kLow, class Place>
  __device__ float store(float tile_amax, __half* dst, int low_offset, const Place& at) {
    static_assert(Place::kWarpRows == kWarpRows, "the placement the chunks were chosen for");
    const int e = scale_exponent(tile_amax, 14);
    const float scale = ldexpf(1.f, e);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      Half2Split pairs[kPerChunk / 2];
#pragma unroll
      for (int i = 0; i < kPerChunk / 2; ++i) pairs[i] = half_pair<kLow>(scale * x[k][2 * i], scale * x[k][2 * i + 1]);
      const int offset = at(Chunks::first_row() + k * Chunks::kRowStep, Chunks::col());
      const auto chunk = [&](bool low) {
        const auto word = [&](int i) { return reinterpret_cast<const uint32_t&>(low ? pairs[i].lo : pairs[i].hi); };
        return make_uint4(word(0), word(1), word(2), word(3));
      };
      *reinterpret_cast<uint4*>(dst + offset) = chunk(false);
      if constexpr (kLow) *reinterpret_cast<uint4*>(dst + offset + low_offset) = chunk(true);
    }
    return ldexpf(1.f, -e);
  }
};

// This thread's share of the largest finite |x[i]|, i < n (the block's
// threads take every blockDim.x-th element), eight loads in flight at a time.
__device__ __forceinline__ float thread_abs_max(const float* x, int n) {
  constexpr int kInFlight = 8;
  float m = 0.f;
  for (int i0 = threadIdx.x; i0 < n; i0 += kInFlight * blockDim.x) {
    float v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int i = i0 + u * blockDim.x;
      v[u] = i < n ? x[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) m = fmaxf(m, finite_abs(v[u]));
  }
  return m;
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
// a kernel adds one of these two per score instead of evaluating the sum.
// They are evaluated as products, as the decomposed graph does, so that a
// NaN or infinite w_in or w_x spoils the same scores there and here (0 w is NaN).
__device__ __forceinline__ float2 edit_terms(bool key_ok, float e_j, float w_in, float w_x) {
  if (!key_ok) return {-INFINITY, -INFINITY};
  return {edit_term(w_in, w_x, 0.f, e_j), edit_term(w_in, w_x, 1.f, e_j)};
}

// edit_terms of keys k0 .. k0 + n - 1 into shared memory, for queries with
// e_i = 0 (terms[j]) and e_i = 1 (terms[n + j]); thread j (`key`:
// threadIdx.x, or the thread's place in its warpgroup) takes key k0 + j, in
// two steps: KeyFlags::load issues the loads of a_j and e_j together (e_j
// whether or not the key takes part, which edit_terms then ignores), store
// writes the terms once they are in. The forward issues the loads first and
// its tile's copies between the two: one memory latency under the copies'
// issue, where a load of e_j after the copies waited on a_j's (bench/NOTES.md
// version 43).
struct KeyFlags {
  float a = 0.f, e = 0.f;
  bool inside = false;  // the key exists (j < S)
  __device__ static KeyFlags load(const ScoreArgs& sc, int64_t b, int64_t k0, int n, int key = threadIdx.x) {
    KeyFlags f;
    if (key >= n) return f;
    const int64_t j = k0 + key;
    f.inside = j < sc.S;
    const int64_t at = b * sc.S + (f.inside ? j : 0);  // past S a valid place, read and then ignored
    f.a = sc.a[at], f.e = sc.e[at];
    return f;
  }
  __device__ void store(int n, float w_in, float w_x, float* terms, int key = threadIdx.x) const {
    if (key >= n) return;
    const float2 t = edit_terms(inside && a != 0.f, e, w_in, w_x);
    terms[key] = t.x;
    terms[n + key] = t.y;
  }
};

// Queues the copies of e_j and a_j for keys k0 .. k0 + n - 1 into shared
// memory, zeros past S: key j takes part (it exists and is not masked) where its a_j != 0.
// Thread j takes key k0 + j.
__device__ __forceinline__ void copy_key_flags(const ScoreArgs& sc, int64_t b, int64_t k0, int n, float* key_e,
                                               float* key_a) {
  if (threadIdx.x >= n) return;
  const int64_t j = k0 + threadIdx.x;
  const bool inside = j < sc.S;
  const int64_t at = b * sc.S + (inside ? j : 0);
  async::copy4(key_e + threadIdx.x, sc.e + at, inside);
  async::copy4(key_a + threadIdx.x, sc.a + at, inside);
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

// Whether column 2u + c (c = 0, 1) of quad_draws' lane `bits` is kept.
__device__ __forceinline__ bool keeps(const ScoreArgs& sc, uint32_t bits, int c) {
  const KeepPair k = dropout_keep_pair(bits, sc.keep_high_threshold);
  return c ? k.odd : k.even;
}

// fp16 operand tiles: where each of q, k, v, dO lives, its fp16 copy and
// its group's scalars (Fp16Group::scalars) with its matrix there, which give
// its storage scale s_x (x is stored as s_x x, and the group's alpha of (x,
// x) is 1 / s_x^2) and its bound scale b_x (max |b_x x| < 2^14); and the
// backward's Pd scale 2^-e_keep, keep_scale = 1 / (1 - p) < 2^e_keep, so that
// the fp16 Pd is under 1 for any p (the forward takes the kept P unscaled and
// 1 / (1 - p) on o). The backward reading P (the benchmark interface) has no
// copies of k and v (k, v and their scalars null): it converts their float
// rows a key tile at a time, at the tile's own scales (ScaledHeadRows).
constexpr int kHalfQ = 0, kHalfK = 1, kHalfV = 2, kHalfDO = 3;
constexpr int kHalfStride = 72;  // fp16 tiles: 144-byte rows, so ldmatrix's 8 rows hit distinct banks
static_assert(kHalfStride >= kD && kHalfStride % 8 == 0 && (kHalfStride / 2) % 32 == 4, "kHalfStride: see above");
// Fp16x3 tiles: a row's 64 hi values, its 64 lo values, 8 of padding:
// 272-byte rows, so ldmatrix's 8 rows hit distinct banks.
constexpr int kSplitStride = 136;
static_assert(Fp16x3::kLowOffset == kD && kSplitStride >= 2 * kD && kSplitStride % 8 == 0 && (kSplitStride / 2) % 32 == 4,
              "kSplitStride: see above");
struct HalfOperands {
  HeadRows<const __half> q, k, v;
  const __half* dout;        // [B,S,H*D] (the backward's)
  const float* scalars[4];   // of q, k, v, dO
  int matrix[4];             // of q, k, v, dO in its group
  float pd_scale;
  // With the Fp16x3 policy: the low parts of q and dO (to_fp16_split), at the same scales.
  HeadRows<const __half> q_low{};
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
  // The warpgroup policies' tiles are core matrices, 64 halves a row per part without padding (kTileStride: the
  // row length), but for the query tiles (place_queries).
  static constexpr int kTileStride =
      Mma::kWarpgroup ? kD * (kSplit ? 2 : 1) : kSplit ? kSplitStride : kHalf ? kHalfStride : kStride;
  static constexpr size_t kTile = size_t(64) * kTileStride * sizeof(Staged), kFloatTile = 64 * kStride * sizeof(float);
  static_assert(kTile % 16 == 0 && kFloatTile % 16 == 0, "tiles start on 16-byte boundaries");
  // Where copy_head_rows puts an operand tile's elements, row r at row row_of(r).
  template <class RowMap = SameRow>
  __device__ static auto place(RowMap row_of = {}) {
    if constexpr (Mma::kWarpgroup) return CoreMatrixRows<RowMap>{kTileStride, row_of};
    else return RowsAt<RowMap>{kTileStride, row_of};
  }
  // The query tiles (Q and dO, copied anew every tile by cp.async): with the
  // warpgroup products as rows with the 128-byte swizzle, whose sectors land
  // in two bank groups (as core matrices a warp's copy took 32 shared-memory
  // wavefronts where 4 carry its bytes: ncu, bench/NOTES.md version 35), the
  // lo parts (Fp16x3Warpgroup) in a block of their own (query_low_offset).
  // Such a tile starts on a 1024-byte boundary (kAlign), and the products
  // take it as SwizzledRows.
  static constexpr bool kSwizzledQueries = Mma::kWarpgroup;
  static_assert(kD == 64, "swizzled rows are 64 halves (128 bytes)");
  static constexpr size_t kAlign = kSwizzledQueries ? 1024 : 16;
  static constexpr int query_low_offset() {
    if constexpr (kSwizzledQueries) return mma::kSwizzledPart;
    else if constexpr (kSplit) return Mma::kLowOffset;
    else return 0;  // no low parts
  }
  __device__ static auto place_queries() {
    if constexpr (kSwizzledQueries) return SwizzledRowsAt{};
    else return place(SameRow{});
  }
  __device__ static auto query_tile(const Staged* tile) {
    if constexpr (kSwizzledQueries) return mma::SwizzledRows{tile};
    else return tile;
  }
};

// Pd's scale 2^-e_keep for the fp16 tiles: keep_scale = 1 / (1 - p) < 2^e_keep.
float pd_scale(double p) { return std::ldexp(1.f, -keep_scale_exponent(p)); }

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

}  // namespace

}  // namespace tg::cuda
