// Tensor-core primitives, written once: TF32 rounding, the m16n8k8 TF32
// mma.sync, ldmatrix for 32-bit fragments, vector reductions; and the m16n8k16
// fp16 mma.sync with its 16-bit fragments (the section "fp16 operands" below).
//
// Fragments of one m16n8k8 product (PTX ISA, "mma.m16n8k8 .tf32"), for lane
// l with g = l / 4 and t = l % 4:
//   A (16 x 8, row-major):  a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)
//   B (8 x 8, k x n):       b0 (k=t, n=g)  b1 (k=t+4, n=g)
//   C (16 x 8):             c0 (g, 2t)  c1 (g, 2t+1)  c2 (g+8, 2t)  c3 (g+8, 2t+1)
// The precisions share the kernels' code through a policy: Tf32x3
// ("highest": each operand split as big + small, both TF32, and a b ~ a_big
// b_big + a_big b_small + a_small b_big, which carries fp32-level accuracy),
// Fp16 ("high": fp16 operands, TF32's 10-bit mantissa, scaled by their
// callers into fp16's range) and Fp16x3 ("highest" on fp16 operands, each
// split as hi + 2^-11 lo: the section "fp16 operands" below).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "core/fp16_scale.cuh"

namespace tg::cuda::mma {

// x rounded to TF32 (10 mantissa bits), to nearest, ties away from zero.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// d += a b on one 16 x 8 x 8 tile of TF32 operands, fp32 accumulation.
__device__ __forceinline__ void mma_16x8x8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// "highest": three TF32 products per tile (the small terms first); staged
// operands keep their full value, which the split needs. The tensor cores
// round each sum toward zero at the scale of the accumulator, a bias that
// grows with the number of products added into it and that cancelling sums of
// the results (the edit-bias gradients) amplify; so a tile's three products go
// into a fresh accumulator, added to the running one by one rounded FADD.
struct Tf32x3 {
  using Staged = float;  // the element type of operand tiles in shared memory
  static constexpr bool kHighest = true;
  static constexpr bool kWarpgroup = false;  // per-warp products (core/wgmma.cuh has the warpgroup's)
  template <int N>
  struct Frag {
    uint32_t big[N], small[N];
  };
  template <int N>
  __device__ __forceinline__ static Frag<N> make(const float (&v)[N]) {
    Frag<N> f;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      f.big[i] = to_tf32(v[i]);
      f.small[i] = to_tf32(v[i] - __uint_as_float(f.big[i]));
    }
    return f;
  }
  __device__ __forceinline__ static void mma(float (&d)[4], const Frag<4>& a, const Frag<2>& b) {
    float step[4] = {};
    mma_16x8x8(step, a.small, b.big);
    mma_16x8x8(step, a.big, b.small);
    mma_16x8x8(step, a.big, b.big);
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] += step[i];
  }
};

// Four 8 x 8 blocks of 16-bit values (8 x 4 of 32-bit ones) from shared
// memory: lane l gives the address of row l % 8 of block l / 8 (16 bytes,
// 16-byte aligned); register i receives block i's 32-bit element (row l / 4,
// column l % 4), or with kTrans the 16-bit pair (rows 2 (l % 4) and
// 2 (l % 4) + 1, column l / 4), the lower row in the lower half.
template <bool kTrans = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4(float (&v)[4], const float* row) {
  uint32_t r[4];
  ldmatrix_x4(r, row);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = __uint_as_float(r[i]);
}

// The A fragment (16 rows x 8 k) of a row-major shared tile: tile row
// row_of(r) for fragment row r in [0, 16), columns k0 .. k0 + 7.
template <class RowOf>
__device__ __forceinline__ void load_a(float (&a)[4], const float* tile, int stride, const RowOf& row_of, int k0,
                                       int lane) {
  const int block = lane >> 3, r = (lane & 7) + 8 * (block & 1), c = k0 + 4 * (block >> 1);
  ldmatrix_x4(a, tile + row_of(r) * stride + c);
}

// The B fragments of two n-tiles (n0 .. n0 + 15) from a shared tile stored
// n-major ([n][k], k contiguous): b[j] is n-tile j's {b0, b1} at k0 .. k0 + 7.
__device__ __forceinline__ void load_b_pair(float (&b)[2][2], const float* tile, int stride, int n0, int k0, int lane) {
  const int block = lane >> 3, n = n0 + (lane & 7) + 8 * (block >> 1), c = k0 + 4 * (block & 1);
  float v[4];
  ldmatrix_x4(v, tile + n * stride + c);
  b[0][0] = v[0];
  b[0][1] = v[1];
  b[1][0] = v[2];
  b[1][1] = v[3];
}

// The A fragment of k-step s of a 16 x 8s accumulator tile, used as the left
// operand of the next product (k index t <-> accumulator column 2t, k index
// t + 4 <-> column 2t + 1: the right operand's rows must follow that order).
__device__ __forceinline__ void accumulator_as_a(float (&a)[4], const float (&c)[4]) {
  a[0] = c[0];
  a[1] = c[2];
  a[2] = c[1];
  a[3] = c[3];
}

// acc (16 x 8N) += A (16 x 8K) B (8K x 8N) for one warp: A is rows
// a_row(r), r in [0, 16), of a row-major shared tile; B is n-tiles n0 ..
// n0 + 8N - 1 of an n-major shared tile ([n][k]).
template <class Mma, int K, int N, class RowOf>
__device__ __forceinline__ void tile_product(float (&acc)[N][4], const float* a_tile, int a_stride, const RowOf& a_row,
                                             const float* b_tile, int b_stride, int n0, int lane) {
  static_assert(N % 2 == 0, "tile_product: n-tiles go in pairs");
#pragma unroll
  for (int ks = 0; ks < K; ++ks) {
    float a[4];
    load_a(a, a_tile, a_stride, a_row, 8 * ks, lane);
    const auto A = Mma::make(a);
#pragma unroll
    for (int np = 0; np < N / 2; ++np) {
      float b[2][2];
      load_b_pair(b, b_tile, b_stride, n0 + 16 * np, 8 * ks, lane);
      Mma::mma(acc[2 * np], A, Mma::make(b[0]));
      Mma::mma(acc[2 * np + 1], A, Mma::make(b[1]));
    }
  }
}

// The same with A an earlier product's accumulators (16 x 8K, k-step s in
// a_acc[s], see accumulator_as_a) and B a k-major shared tile ([k][n],
// the natural layout of the rows being summed over). In accumulator_as_a's k
// order, k index t of step s is tile row 8s + 2t and k index t + 4 is row
// 8s + 2t + 1, so lane (g, t) reads rows 8s + 2t, 8s + 2t + 1 at column
// 8n + g: distinct banks when the stride is 4 more than a multiple of 16.
template <class Mma, int K, int N>
__device__ __forceinline__ void accumulator_product(float (&acc)[N][4], const float (&a_acc)[K][4], const float* b_tile,
                                                    int b_stride, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int ks = 0; ks < K; ++ks) {
    float a[4];
    accumulator_as_a(a, a_acc[ks]);
    const auto A = Mma::make(a);
    const float* rows = b_tile + (8 * ks + 2 * t) * b_stride + g;
#pragma unroll
    for (int nt = 0; nt < N; ++nt) {
      const float b[2] = {rows[8 * nt], rows[b_stride + 8 * nt]};
      Mma::mma(acc[nt], A, Mma::make(b));
    }
  }
}

// ------------------------------------------------------- fp16 operands
// Fragments of one m16n8k16 product with fp16 operands (PTX ISA, "mma.m16n8k16
// .f16"), two elements per 32-bit register, the lower index in the lower half:
//   A (16 x 16, row-major): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16 x 8, k x n):      b0 (k=2t..2t+1, n=g)  b1 (k=2t+8.., n=g)
//   C (16 x 8):             as for m16n8k8
// So the accumulators of n-tiles 2s and 2s + 1, packed pairwise, are the A
// fragment of k-step s as they stand: no reordering of the right operand.
// fp16 has TF32's 10-bit mantissa but a range of 2^-24 .. 65504: operands are
// scaled by powers of two that their callers choose (the Fp16 policy holds
// no scale).

// d += a b on one 16 x 8 x 16 tile of fp16 operands, fp32 accumulation.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (x, y) rounded to nearest fp16, x in the lower half.
__device__ __forceinline__ uint32_t pack_half2(float x, float y) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
  return r;
}

// "high" on fp16 tensor cores: operand tiles are staged in shared memory as
// fp16 (converted, with their scales, before the kernel reads them).
struct Fp16 {
  using Staged = __half;
  static constexpr bool kHighest = false, kWarpgroup = false;
  static constexpr int kParts = 1;      // fp16 values per operand element
  static constexpr int kLowOffset = 0;  // from a staged hi value to its lo value, in elements (none here)
};

// "highest" on fp16 tensor cores: each operand x (scaled into fp16's range)
// as hi + 2^-11 lo, both fp16, lo = 2^11 (x - hi) (to_fp16_split's form: 22
// bits of x), and a b ~ hi hi + 2^-11 (hi lo + lo hi), 3xTF32's accuracy
// in half its tensor-core instructions. As in Tf32x3, a product's terms go
// into a fresh accumulator, the small ones first, added to the running one
// by one rounded FADD. A staged tile row holds its 64 hi values, then its 64
// lo values (kLowOffset).
struct Fp16x3 {
  using Staged = __half;
  static constexpr bool kHighest = true, kWarpgroup = false;
  static constexpr int kParts = 2;
  static constexpr int kLowOffset = 64;
};

// Where element (r, k) of a tile of rows of `cols` halves lies, in halves,
// when it is stored as core matrices of 8 rows x 8 halves (128 contiguous
// bytes), those next along k 128 bytes on and the next 8 rows cols / 8 x
// 128 bytes on: wgmma's K-major layout without swizzle (core/wgmma.cuh),
// in which the warpgroup policies stage their operand tiles.
__host__ __device__ constexpr int core_matrix_offset(int r, int k, int cols) {
  return (r / 8) * cols * 8 + (k / 8) * 64 + (r % 8) * 8 + k % 8;
}

// Where element (r, k) of a tile of rows of 64 halves lies, in halves, with
// the 128-byte swizzle: each row's 128 bytes together, its 16-byte chunk c
// at chunk c ^ (r % 8): wgmma's KMajor<k128B> layout, which read the other
// way round is MnMajor128B's (core/wgmma.cuh). A cp.async's 32-byte sector,
// two neighbouring chunks of a row, lands in two bank groups; as core
// matrices they lie 128 bytes apart, in one.
__host__ __device__ constexpr int swizzled_row_offset(int r, int k) {
  return r * 64 + ((k / 8) ^ (r % 8)) * 8 + k % 8;
}

// A 64 x 64 fp16 tile staged at swizzled_row_offset (1024-byte aligned), as
// the warpgroup products take it for B (core/wgmma.cuh); with two parts (hi
// and lo) the lo block kSwizzledPart halves on.
constexpr int kSwizzledPart = 64 * 64;
struct SwizzledRows {
  const __half* tile;
};

// Warp w's rows of a staged tile in staged order, 16 w .. 16 w + 15: an A
// row map (a_row) of the products here, and the only one the warpgroup
// products take (wgmma reads a warp's A rows as they are staged).
struct WarpRows {
  int warp;
  __host__ __device__ constexpr int operator()(int r) const { return 16 * warp + r; }
};

// "high" on Hopper's warpgroup MMA (its products in core/wgmma.cuh, sm_90a
// alone): the Fp16 policy's operands (fp16, scaled by the kernel), staged
// as core matrices (core_matrix_offset, above: no padding) or as
// SwizzledRows (the attention backward's Q and dO tiles), and each
// product of the per-warp interface here computed for the whole warpgroup
// at once: 64 x 64 x 64, four wgmma instructions, every warp receiving its
// 16 rows of the result in mma.sync's C fragment. A kernel written for the
// per-warp products runs with these as it stands, provided it calls them
// with all four warps of its CTA, each warp's A rows are its own 16 in
// staged order (a_row: WarpRows), and it calls the hooks
// (operand_tiles_written, products_done) where the asynchrony needs them.
struct Fp16Warpgroup {
  using Staged = __half;
  static constexpr bool kHighest = false, kWarpgroup = true;
  static constexpr int kParts = 1;
  static constexpr int kLowOffset = 0;
};

// "highest" on Hopper's warpgroup MMA: Fp16x3's split operands (hi + 2^-11
// lo) with Fp16Warpgroup's products. A staged tile row holds 128 halves, its
// 64 hi values then its 64 lo values, as core matrices (kLowOffset: lo's core
// matrices 8 on from hi's; as SwizzledRows, lo a block of its own). Each
// product's hi lo + lo hi terms and its hi hi term go into two fresh
// accumulators, 64 long along k, waited for and added to the running one by
// one FFMA and one FADD per element: one rounding of the running sum per
// 64 x 64 x 64 product, where Fp16x3 rounds it once per 16-long step (four
// times the fix-ups). The tensor cores' accumulation may not carry the
// running sum itself (it drifts: docs/derivations.md, "highest" on fp16
// tensor cores).
struct Fp16x3Warpgroup {
  using Staged = __half;
  static constexpr bool kHighest = true, kWarpgroup = true;
  static constexpr int kParts = 2;
  static constexpr int kLowOffset = core_matrix_offset(0, 64, 128);
};

// The hooks of a policy whose products run asynchronously, read by the
// tensor cores from shared memory (core/wgmma.cuh's warpgroup policies); nothing
// to do for the per-warp ones here. operand_tiles_written: after a thread's
// writes of operand tiles (its cp.async groups waited for), before the
// barrier that precedes the products. products_done: before the results of
// an issued product are read, or what it reads (its registers, its shared
// tiles) is written again.
template <class Mma>
  requires(!Mma::kWarpgroup)
__device__ __forceinline__ void operand_tiles_written() {}
template <class Mma>
  requires(!Mma::kWarpgroup)
__device__ __forceinline__ void products_done() {}

// Every part's four registers (ldmatrix_x4) from `row`, a lane's address of
// its hi values (the lo values Mma::kLowOffset further).
template <class Mma, bool kTrans = false>
__device__ __forceinline__ void ldmatrix_parts(uint32_t (&r)[Mma::kParts][4], const __half* row) {
#pragma unroll
  for (int part = 0; part < Mma::kParts; ++part) ldmatrix_x4<kTrans>(r[part], row + part * Mma::kLowOffset);
}

// Register i of every part of the scaled pair (x, y): hi rounded to
// nearest, and with Fp16x3 its low parts (split_half2, core/fp16_scale.cuh).
template <class Mma>
__device__ __forceinline__ void pack_parts(uint32_t (&r)[Mma::kParts][4], int i, float x, float y) {
  if constexpr (Mma::kParts == 1) {
    r[0][i] = pack_half2(x, y);
  } else {
    const Half2Split s = split_half2(x, y);
    memcpy(&r[0][i], &s.hi, sizeof s.hi);
    memcpy(&r[1][i], &s.lo, sizeof s.lo);
  }
}

// d += a b on one 16 x 8 x 16 tile from every part of a and of b (b's
// registers j and j + 1: ldmatrix's n-tile j / 2).
template <class Mma>
__device__ __forceinline__ void mma_parts(float (&d)[4], const uint32_t (&a)[Mma::kParts][4],
                                          const uint32_t (&b)[Mma::kParts][4], int j) {
  if constexpr (Mma::kParts == 1) {
    mma_16x8x16(d, a[0], b[0][j], b[0][j + 1]);
  } else {
    float step[4] = {};
    mma_16x8x16(step, a[0], b[1][j], b[1][j + 1]);  // hi lo
    mma_16x8x16(step, a[1], b[0][j], b[0][j + 1]);  // lo hi
#pragma unroll
    for (int i = 0; i < 4; ++i) step[i] *= 1.f / kLowPartFactor;
    mma_16x8x16(step, a[0], b[0][j], b[0][j + 1]);  // hi hi
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] += step[i];
  }
}

// A's fragment of k-step ks (16 wide): rows a_row(r), r in [0, 16), of a
// row-major fp16 shared tile.
template <class Mma, class RowOf>
__device__ __forceinline__ void load_a_step(uint32_t (&a)[Mma::kParts][4], const __half* a_tile, int a_stride,
                                            const RowOf& a_row, int ks, int lane) {
  const int block = lane >> 3;
  ldmatrix_parts<Mma>(a, a_tile + a_row((lane & 7) + 8 * (block & 1)) * a_stride + 16 * ks + 8 * (block >> 1));
}

// acc (16 x 8N) += a (A's k-step ks) times k-step ks of n-tiles n0 .. n0 +
// 8N - 1 of an n-major fp16 shared tile ([n][k]).
template <class Mma, int N>
__device__ __forceinline__ void step_product(float (&acc)[N][4], const uint32_t (&a)[Mma::kParts][4],
                                             const __half* b_tile, int b_stride, int n0, int ks, int lane) {
  static_assert(N % 2 == 0, "step_product: n-tiles go in pairs");
  const int block = lane >> 3;
#pragma unroll
  for (int np = 0; np < N / 2; ++np) {
    uint32_t b[Mma::kParts][4];  // n-tile 2 np: registers 0, 1; n-tile 2 np + 1: 2, 3
    ldmatrix_parts<Mma>(b, b_tile + (n0 + 16 * np + (lane & 7) + 8 * (block >> 1)) * b_stride + 16 * ks +
                               8 * (block & 1));
    mma_parts<Mma>(acc[2 * np], a, b, 0);
    mma_parts<Mma>(acc[2 * np + 1], a, b, 2);
  }
}

// acc (16 x 8N) += A (16 x 8K) B (8K x 8N) for one warp, fp16 tiles (Fp16 or
// Fp16x3): A is rows a_row(r), r in [0, 16), of a row-major shared tile; B is
// n-tiles n0 .. n0 + 8N - 1 of an n-major shared tile ([n][k]). The template
// parameters are the TF32 version's, so that a kernel calls both alike: K
// counts 8-wide k blocks (a step takes two).
template <class Mma, int K, int N, class RowOf>
  requires(!Mma::kWarpgroup)
__device__ __forceinline__ void tile_product(float (&acc)[N][4], const __half* a_tile, int a_stride, const RowOf& a_row,
                                             const __half* b_tile, int b_stride, int n0, int lane) {
  static_assert(K % 2 == 0, "tile_product (fp16): k blocks go in pairs");
#pragma unroll
  for (int ks = 0; ks < K / 2; ++ks) {
    uint32_t a[Mma::kParts][4];
    load_a_step<Mma>(a, a_tile, a_stride, a_row, ks, lane);
    step_product<Mma>(acc, a, b_tile, b_stride, n0, ks, lane);
  }
}

// A's fragments of every k-step, held in registers by a warp that multiplies
// the same rows by many B tiles (the forward's Q rows by every key tile).
template <class Mma, int K>
struct HeldA {
  static_assert(K % 2 == 0, "HeldA: k blocks go in pairs");
  uint32_t step[K / 2][Mma::kParts][4];
  template <class RowOf>
  __device__ __forceinline__ void load(const __half* a_tile, int a_stride, const RowOf& a_row, int lane) {
#pragma unroll
    for (int ks = 0; ks < K / 2; ++ks) load_a_step<Mma>(step[ks], a_tile, a_stride, a_row, ks, lane);
  }
};

// tile_product with A's fragments held.
template <class Mma, int K, int N>
  requires(!Mma::kWarpgroup)
__device__ __forceinline__ void held_product(float (&acc)[N][4], const HeldA<Mma, K>& a, const __half* b_tile,
                                             int b_stride, int n0, int lane) {
#pragma unroll
  for (int ks = 0; ks < K / 2; ++ks) step_product<Mma>(acc, a.step[ks], b_tile, b_stride, n0, ks, lane);
}

// acc (16 x 8N) += a (k-step ks's A fragment, every part) times rows 16 ks ..
// 16 ks + 15 of a k-major fp16 shared tile ([k][n], read transposed).
template <class Mma, int N>
__device__ __forceinline__ void mma_times_k_major(float (&acc)[N][4], const uint32_t (&a)[Mma::kParts][4],
                                                  const __half* b_tile, int b_stride, int ks, int lane) {
  const int block = lane >> 3;
  const __half* rows = b_tile + (16 * ks + (lane & 7) + 8 * (block & 1)) * b_stride + 8 * (block >> 1);
#pragma unroll
  for (int np = 0; np < N / 2; ++np) {
    uint32_t b[Mma::kParts][4];
    ldmatrix_parts<Mma, true>(b, rows + 16 * np);
    mma_parts<Mma>(acc[2 * np], a, b, 0);
    mma_parts<Mma>(acc[2 * np + 1], a, b, 2);
  }
}

// acc (16 x 8N) += A B with A an earlier product's accumulators (16 x 8K,
// rounded to fp16 as they are, split with Fp16x3) and B a k-major fp16 shared
// tile.
template <class Mma, int K, int N>
  requires(!Mma::kWarpgroup)
__device__ __forceinline__ void accumulator_product(float (&acc)[N][4], const float (&a_acc)[K][4],
                                                    const __half* b_tile, int b_stride, int lane) {
  static_assert(N % 2 == 0 && K % 2 == 0, "accumulator_product (fp16): pairs of n-tiles");
#pragma unroll
  for (int ks = 0; ks < K / 2; ++ks) {
    const float(&first)[4] = a_acc[2 * ks];  // k block 2 ks: the step's k indices 0 .. 7
    const float(&second)[4] = a_acc[2 * ks + 1];
    uint32_t a[Mma::kParts][4];
    pack_parts<Mma>(a, 0, first[0], first[1]);
    pack_parts<Mma>(a, 1, first[2], first[3]);
    pack_parts<Mma>(a, 2, second[0], second[1]);
    pack_parts<Mma>(a, 3, second[2], second[3]);
    mma_times_k_major<Mma>(acc, a, b_tile, b_stride, ks, lane);
  }
}

// acc (16 x 8N) += (a_scale A) B with A rows a_row(r) of a row-major float32
// shared tile (16 x 8K, rounded to fp16 as loaded, split with Fp16x3) and B a
// k-major fp16 shared tile.
template <class Mma, int K, int N, class RowOf>
  requires(!Mma::kWarpgroup)
__device__ __forceinline__ void scaled_float_product(float (&acc)[N][4], const float* a_tile, int a_stride,
                                                     const RowOf& a_row, float a_scale, const __half* b_tile,
                                                     int b_stride, int lane) {
  static_assert(N % 2 == 0 && K % 2 == 0, "scaled_float_product: pairs of n-tiles and k blocks");
  const int g = lane >> 2, t = lane & 3;
  const float* row0 = a_tile + a_row(g) * a_stride + 2 * t;
  const float* row1 = a_tile + a_row(g + 8) * a_stride + 2 * t;
#pragma unroll
  for (int ks = 0; ks < K / 2; ++ks) {
    uint32_t a[Mma::kParts][4];
    const float* at[4] = {row0 + 16 * ks, row1 + 16 * ks, row0 + 16 * ks + 8, row1 + 16 * ks + 8};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = *reinterpret_cast<const float2*>(at[i]);
      pack_parts<Mma>(a, i, a_scale * v.x, a_scale * v.y);
    }
    mma_times_k_major<Mma>(acc, a, b_tile, b_stride, ks, lane);
  }
}

// Sums each of the eight values v[0 .. 7] over the eight lanes that share
// t = lane % 4 (a fragment's rows g = lane / 4) and returns sum g to lane g:
// three halving exchanges (over g's bits 2, 1, 0) in which a lane keeps the
// half its bit selects and sends the other, 7 shuffles where a whole
// reduction of each value takes 24.
template <class T>
__device__ __forceinline__ T sum_over_fragment_rows(T (&v)[8], int g) {
#pragma unroll
  for (int bit = 2; bit >= 0; --bit) {
    const int half = 1 << bit;
    const bool upper = (g >> bit) & 1;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const T keep = upper ? v[i + half] : v[i], send = upper ? v[i] : v[i + half];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 4 << bit);
    }
  }
  return v[0];
}

// Atomic add without a return value: four consecutive floats (16-byte
// aligned) in one instruction.
__device__ __forceinline__ void red_add4(float* p, float x, float y, float z, float w) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}

// Atomic add without a return value: two consecutive floats (8-byte
// aligned) in one instruction.
__device__ __forceinline__ void red_add2(float* p, float x, float y) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
}

// Calls store(at, x, y) for each lane's pairs (c0, c1) and (c2, c3) of f
// times a 16 x 8N accumulator tile as they stand: row(0) is where fragment
// row g goes, row(1) row g + 8 (null: not written), `at` the pair's first
// element there. A warp's instruction covers whole 32-byte sectors (four
// lanes per row), so the lanes need no shuffles to pair rows first.
template <int N, class RowOf, class Store>
__device__ __forceinline__ void store_pairs(const float (&acc)[N][4], float f, const RowOf& row, int lane,
                                            const Store& store) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const auto dst = row(r);
    if (!dst) continue;
#pragma unroll
    for (int nt = 0; nt < N; ++nt) store(dst + 8 * nt + 2 * (lane & 3), f * acc[nt][2 * r], f * acc[nt][2 * r + 1]);
  }
}

// Adds (add) or stores the tile to float rows, 8 bytes at a time (8-byte
// aligned rows): the L2 sees as many sector updates as with 16-byte atomics.
template <int N, class RowOf>
__device__ __forceinline__ void write_tile(const float (&acc)[N][4], float f, const RowOf& row, int lane, bool add) {
  store_pairs(acc, f, row, lane, [add](float* at, float x, float y) {
    if (add) red_add2(at, x, y);
    else *reinterpret_cast<float2*>(at) = make_float2(x, y);
  });
}

// Stores the tile to fp16 rows (4-byte aligned), rounded to nearest.
template <int N, class RowOf>
__device__ __forceinline__ void write_tile_half(const float (&acc)[N][4], float f, const RowOf& row, int lane) {
  store_pairs(acc, f, row, lane,
              [](__half* at, float x, float y) { *reinterpret_cast<__half2*>(at) = __floats2half2_rn(x, y); });
}

// The largest finite |x| of the lane's accumulator elements.
template <int N>
__device__ __forceinline__ float lane_abs_max(const float (&acc)[N][4]) {
  float m = 0.f;
#pragma unroll
  for (int nt = 0; nt < N; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) m = fmaxf(m, finite_abs(acc[nt][c]));
  return m;
}

// One step of add_column_sums' reduce-scatter: v[0 .. 2N) becomes v[0 .. N),
// the half this lane keeps (the upper one where lane & 2N is set) plus the
// same half from lane ^ 2N.
template <int N>
__device__ __forceinline__ void keep_half_of_sums(float (&v)[16], int lane) {
  const bool upper = lane & (2 * N);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const float keep = upper ? v[k + N] : v[k], give = upper ? v[k] : v[k + N];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, give, 2 * N);
  }
}

// Adds f times the 16 x 64 tile's column sums (over its 16 rows) to
// col[0 .. 64) (8-byte aligned). The eight lanes of each t (lane bits 2..4)
// reduce-scatter the lane's 16 column values in three steps, so lane L ends
// with the sums of columns 2L and 2L + 1 and adds them in one vector atomic,
// skipped when both are 0 (a sum of rounded adds that starts at +0 never
// becomes -0, so adding a zero to it changes nothing).
__device__ __forceinline__ void add_column_sums(const float (&acc)[8][4], float f, float* col, int lane) {
  float v[16];  // v[2 nt + c]: the lane's rows g and g + 8 in column 8 nt + 2 t + c
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) v[2 * nt] = acc[nt][0] + acc[nt][2], v[2 * nt + 1] = acc[nt][1] + acc[nt][3];
  keep_half_of_sums<8>(v, lane);  // lane bit 4 picks n-tiles 4..7 or 0..3
  keep_half_of_sums<4>(v, lane);  // bit 3: two of those
  keep_half_of_sums<2>(v, lane);  // bit 2: one, nt = lane / 4, columns 8 nt + 2 t + c = 2 lane + c
  const float x = f * v[0], y = f * v[1];
  if (x != 0.f || y != 0.f) red_add2(col + 2 * lane, x, y);
}

}  // namespace tg::cuda::mma
