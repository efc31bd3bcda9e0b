// Hopper's warpgroup MMA (wgmma.mma_async, sm_90a): the four warps of a
// warpgroup (128 threads) compute one 64 x N x 16 product together, the
// operands read from shared memory through 64-bit descriptors (or A from
// registers), asynchronously: issue, commit, and wait before the
// accumulators are read. Checked on its own by `cuda/wgmma`
// (tests/wgmma_probe.cu), timed by bench/wgmma_rate; the end of this file
// holds the products of the warpgroup policies (core/mma.cuh's
// Fp16Warpgroup and Fp16x3Warpgroup), which the attention backward runs on
// compute capability 9.0 (ops/fused_attention_warpgroup.cu, whose training
// forward issues its wgmma itself; bench/NOTES.md versions 20, 24 and 48).
//
// Operands are K-major fp16 tiles of `rows` rows (a multiple of 8) and `cols`
// halves along K (a staged row may hold more than one operand side by side,
// the split policy's 64 hi and 64 lo halves: `cols` is then the staged row
// length, and an operand's descriptors start at its first column), in one of
// two layouts (KMajor<Swizzle>):
// - kNone: core matrices of 8 rows x 8 halves (16 bytes a row, 128
//   contiguous bytes); element (r, k) sits at byte
//     (r / 8) * (cols / 8 * 128) + (k / 8) * 128 + (r % 8) * 16 + (k % 8) * 2,
//   so the core matrices next along K are 128 bytes on (the descriptor's
//   leading byte offset) and the next 8 rows cols / 8 * 128 (its stride byte
//   offset); product s (k = 16 s ..) starts 256 s bytes in.
// - k128B: rows of 64 halves (128 bytes), 8 of them an atom of 1024 bytes
//   (1024-byte aligned), in which row r's 16-byte chunk c is stored at chunk
//   c ^ (r % 8), the XOR the tensor cores undo from the address bits; K
//   beyond 64 in further blocks of rows x 64. Element (r, k) sits at byte
//     (k / 64) * rows * 128 + (r / 8) * 1024 + (r % 8) * 128 + ((k % 64 / 8) ^ (r % 8)) * 16 + (k % 8) * 2;
//   stride byte offset 1024 (the next atom), leading byte offset unused (set
//   to one unit); product s starts at block s / 4, 32 (s % 4) bytes into the
//   row. The plain layout's core matrices are already conflict-free (128
//   contiguous bytes), but all of a row's 16-byte chunks share a bank group
//   (row % 8), so a warp's copies cover 8 rows at a time
//   (ops/fused_attention_tiles.cuh's HeadChunks: all 8 groups for rows in
//   order); the swizzle keeps each row's 128 bytes together (as a row copy
//   or TMA writes them) without conflicts either. A cp.async, though,
//   writes shared memory one 32-byte global sector at a time, two
//   neighbouring chunks of a row: the plain layout puts them in one bank
//   group (ncu: 32 wavefronts for a warp's 512 bytes), the swizzle in two
//   (the benchmark interface's Q and dO tiles; bench/NOTES.md version 35).
//
// Accumulators of a 64 x N product (f32), for thread l of warp w of the
// warpgroup, g = l / 4, t = l % 4, j < N / 8: d[4j] (16w + g, 8j + 2t),
// d[4j + 1] (16w + g, 8j + 2t + 1), d[4j + 2] (16w + g + 8, 8j + 2t),
// d[4j + 3] (16w + g + 8, 8j + 2t + 1): mma.sync's C fragment, per warp.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/mma.cuh"

// wgmma exists in the architecture-specific target alone: sm_90a, not sm_90.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "core/wgmma.cuh: wgmma needs the sm_90a target (CUDA_ARCHITECTURES 90a), not plain sm_90"
#endif

namespace tg::cuda::wgmma {

constexpr int kCoreBytes = 128;  // one 8 x 8 core matrix of halves

enum class Swizzle { kNone, k128B };

// A shared-memory matrix descriptor of the matrix `offset` bytes (a multiple
// of 16) after `base`: start address, leading and stride byte offsets (each
// in 16-byte units, 14 bits: under 2^18 bytes, unchecked), swizzle mode in
// bits 62-63 (0 none, 1 128-byte). base + offset is a shared address, under
// 2^18 bytes, so the start's field (the address / 16) carries nothing past
// its 14 bits: the low word is the base's field plus one constant (offset
// and leading), a single add per k-step onto a value the steps of one tile
// share.
__device__ __forceinline__ uint64_t descriptor(const void* base, uint32_t offset, uint32_t leading, uint32_t stride,
                                               uint64_t mode) {
  const uint32_t start = static_cast<uint32_t>(__cvta_generic_to_shared(base)) >> 4;
  const uint32_t low = start + ((offset >> 4) + ((leading >> 4) << 16));
  return low | uint64_t(stride >> 4) << 32 | mode << 62;
}

template <Swizzle kSwizzle>
struct KMajor;

template <>
struct KMajor<Swizzle::kNone> {
  static constexpr bool kTransposed = false;  // the instruction's imm-trans for such an operand
  // Where element (r, k) lies, in halves from the tile's start.
  __host__ __device__ static constexpr int offset(int r, int k, int /*rows*/, int cols) {
    return mma::core_matrix_offset(r, k, cols);
  }
  // The descriptor of product s (K columns 16 s .. 16 s + 15); tile 16-byte aligned.
  __device__ static uint64_t product(const __half* tile, int s, int /*rows*/, int cols) {
    return descriptor(tile, 2 * 128 * s, kCoreBytes, cols / 8 * kCoreBytes, 0);
  }
};

template <>
struct KMajor<Swizzle::k128B> {
  static constexpr bool kTransposed = false;
  __host__ __device__ static constexpr int offset(int r, int k, int rows, int /*cols*/) {
    return (k / 64) * rows * 64 + mma::swizzled_row_offset(r, k % 64);
  }
  // Tile 1024-byte aligned; cols a multiple of 64.
  __device__ static uint64_t product(const __half* tile, int s, int rows, int /*cols*/) {
    return descriptor(tile, 2 * ((s / 4) * rows * 64 + (s % 4) * 16), 16, 1024, 1);
  }
};

// MN-major fp16 tiles without swizzle, read transposed by the instruction
// (imm-trans-b): N is the contiguous dimension, 8 halves (16 bytes) of a
// K-row, 8 K-rows a core matrix of 128 contiguous bytes. The descriptor's
// leading byte offset steps along K, its stride byte offset along N (the
// other reading fails cuda/wgmma). Two arrangements of the core matrices:
// - MnMajor: those next along K 128 bytes on, those next along N (K / 8) 128:
//   element (n, k) at byte ((n / 8) (K / 8) + k / 8) 128 + (k % 8) 16 + (n % 8) 2.
// - MnMajorOfRows: a [k][n] tile staged as KMajor<kNone> stages a [row][col]
//   one (rows = K): those next along N 128 bytes on, those next along K
//   (N / 8) 128. So one staged [key][d] tile is the K-major operand of one
//   product (k = d) and the MN-major operand of another (k = key).
// MnMajor places its core matrices as KMajor<kNone> does (so its products'
// descriptors are the same), each holding its 8 x 8 block transposed.
struct MnMajor : KMajor<Swizzle::kNone> {
  static constexpr bool kTransposed = true;
  __host__ __device__ static constexpr int offset(int n, int k, int /*rows*/, int cols) {
    return ((n / 8) * (cols / 8) + k / 8) * 64 + (k % 8) * 8 + n % 8;
  }
};

// MN-major fp16 tiles with the 128-byte swizzle, as the TMA writes boxes of
// 64 MN elements (128 bytes) by K rows of a [k][mn] matrix: 64-wide blocks
// of MN one after another, each K rows of 128 bytes in which row k's 16-byte
// chunk c is stored at chunk c ^ (k % 8) (1024-byte aligned, like
// KMajor<k128B>). Element (n, k) at byte
//   (n / 64) K 128 + k 128 + ((n % 64 / 8) ^ (k % 8)) 16 + (n % 8) 2;
// the descriptor's leading byte offset steps to the next 64-wide block of MN
// (K 128 bytes), its stride byte offset to the next 8 rows of K (1024):
// the roles the plain MN-major layouts give them the other way round.
struct MnMajor128B {
  static constexpr bool kTransposed = true;
  __host__ __device__ static constexpr int offset(int n, int k, int /*rows*/, int cols) {
    return (n / 64) * cols * 64 + mma::swizzled_row_offset(k, n % 64);
  }
  // Product s: K rows 16 s .. 16 s + 15.
  __device__ static uint64_t product(const __half* tile, int s, int /*rows*/, int cols) {
    return descriptor(tile, 2 * 16 * 64 * s, cols * 128, 1024, 1);
  }
};

// As for every layout here, rows is the operand's N and cols its K: for
// MnMajorOfRows, N is the staged tile's row length (d, or 2 d for a split
// tile's hi and lo side by side) and K its row count.
struct MnMajorOfRows {
  static constexpr bool kTransposed = true;
  __host__ __device__ static constexpr int offset(int n, int k, int rows, int cols) {
    return KMajor<Swizzle::kNone>::offset(k, n, cols, rows);
  }
  __device__ static uint64_t product(const __half* tile, int s, int rows, int /*cols*/) {
    return descriptor(tile, 2 * 16 * rows * s, rows / 8 * kCoreBytes, kCoreBytes, 0);
  }
};

// A named barrier (id 1 .. 15; 0 is __syncthreads'): waits until `threads`
// threads (a multiple of 32, this one included) reached it, so that a
// warpgroup synchronises its own warps without stopping the whole CTA.
__device__ __forceinline__ void barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Shared-memory writes made by ordinary stores, made visible to wgmma (which
// reads through the async proxy); then a barrier before the first product.
__device__ __forceinline__ void fence_shared_writes() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Orders the accumulators' earlier register accesses before the products.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the group of products issued since the last commit.
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The accumulators of a 64 x 64 (32 of them) or 64 x 128 (64) product as
// asm operands %0 .. %31 or %0 .. %63: their names in the instruction's
// text, and d[i] .. d[i + 7] as read-write operands.
#define TG_WGMMA_D32_NAMES                    \
  "%0, %1, %2, %3, %4, %5, %6, %7,\n"         \
  " %8, %9, %10, %11, %12, %13, %14, %15,\n"  \
  " %16, %17, %18, %19, %20, %21, %22, %23,\n" \
  " %24, %25, %26, %27, %28, %29, %30, %31"
#define TG_WGMMA_D32_TEXT "{" TG_WGMMA_D32_NAMES "},\n"
#define TG_WGMMA_D64_TEXT                                      \
  "{" TG_WGMMA_D32_NAMES                                       \
  ",\n %32, %33, %34, %35, %36, %37, %38, %39,\n"              \
  " %40, %41, %42, %43, %44, %45, %46, %47,\n"                 \
  " %48, %49, %50, %51, %52, %53, %54, %55,\n"                 \
  " %56, %57, %58, %59, %60, %61, %62, %63},\n"
#define TG_WGMMA_D8_OPERANDS(d, i)                                                                                 \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define TG_WGMMA_D32_OPERANDS(d) \
  TG_WGMMA_D8_OPERANDS(d, 0), TG_WGMMA_D8_OPERANDS(d, 8), TG_WGMMA_D8_OPERANDS(d, 16), TG_WGMMA_D8_OPERANDS(d, 24)
#define TG_WGMMA_D64_OPERANDS(d)                                                                                 \
  TG_WGMMA_D32_OPERANDS(d), TG_WGMMA_D8_OPERANDS(d, 32), TG_WGMMA_D8_OPERANDS(d, 40), TG_WGMMA_D8_OPERANDS(d, 48), \
      TG_WGMMA_D8_OPERANDS(d, 56)

// d = A B^T (+ d where accumulate) for A 64 x 16 and B 64 x 16 (descriptors
// a and b; each K-major, or MN-major with kTransA / kTransB): the
// warpgroup's 64 x 64 x 16 product, issued.
template <bool kTransB = false, bool kTransA = false>
__device__ __forceinline__ void mma_64x64x16(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16\n" TG_WGMMA_D32_TEXT "%32, %33, p, 1, 1, %36, %35;\n}\n"
               : TG_WGMMA_D32_OPERANDS(d)
               : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransB ? 1 : 0), "n"(kTransA ? 1 : 0));
}

// The same 128 wide: A 64 x 16 and B 128 x 16, d the 64 x 128 accumulators
// (d[4j] .. d[4j + 3] as above, j < 16).
template <bool kTransB = false, bool kTransA = false>
__device__ __forceinline__ void mma_64x128x16(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16\n" TG_WGMMA_D64_TEXT "%64, %65, p, 1, 1, %68, %67;\n}\n"
               : TG_WGMMA_D64_OPERANDS(d)
               : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransB ? 1 : 0), "n"(kTransA ? 1 : 0));
}

// The same with A from registers: warp w's rows 16 w .. 16 w + 15 as
// mma.sync's m16n8k16 A fragment (core/mma.cuh: a[0] (g, 2t..2t+1), a[1]
// (g + 8, ..), a[2] (g, 2t + 8..), a[3] (g + 8, 2t + 8..), fp16 pairs), so
// an earlier product's accumulators, packed pairwise, go in as they stand.
// The registers must not change until the product is waited for.
template <bool kTransB = false>
__device__ __forceinline__ void mma_64x64x16(float (&d)[32], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16\n" TG_WGMMA_D32_TEXT
               "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
               : TG_WGMMA_D32_OPERANDS(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),
                 "n"(kTransB ? 1 : 0));
}

#undef TG_WGMMA_D32_NAMES
#undef TG_WGMMA_D32_TEXT
#undef TG_WGMMA_D32_OPERANDS
#undef TG_WGMMA_D64_TEXT
#undef TG_WGMMA_D64_OPERANDS
#undef TG_WGMMA_D8_OPERANDS

}  // namespace tg::cuda::wgmma

namespace tg::cuda::mma {

// The products of the warpgroup policies (core/mma.cuh's Fp16Warpgroup and Fp16x3Warpgroup).
template <class Mma>
  requires(Mma::kWarpgroup)
__device__ __forceinline__ void operand_tiles_written() {
  wgmma::fence_shared_writes();
}
template <class Mma>
  requires(Mma::kWarpgroup)
__device__ __forceinline__ void products_done() {
  wgmma::wait<0>();
}

namespace warpgroup {
using KMajorTile = wgmma::KMajor<wgmma::Swizzle::kNone>;  // a staged 64 x 64 tile, K along its rows
using RowsAsK = wgmma::MnMajorOfRows;                      // the same tile with K down its rows
constexpr int kTile = 64, kSteps = kTile / 16;             // a product's k-steps

// The accumulators of a 64 x 64 product as wgmma's operand list (the same registers).
__device__ __forceinline__ float (&flat(float (&acc)[8][4]))[32] { return reinterpret_cast<float(&)[32]>(acc); }

// The descriptors of k-step s of part `part` (0 hi, 1 lo) of a staged tile,
// whose rows hold kTile halves per part: as the K-major operand (K along its
// rows) and as the MN-major one (K down its rows, read transposed).
template <class Mma>
__device__ __forceinline__ uint64_t k_major(const __half* tile, int part, int s) {
  return KMajorTile::product(tile + part * Mma::kLowOffset, s, kTile, kTile * Mma::kParts);
}
template <class Mma>
__device__ __forceinline__ uint64_t rows_as_k(const __half* tile, int part, int s) {
  return RowsAsK::product(tile + part * Mma::kLowOffset, s, kTile * Mma::kParts, kTile);
}

// B's descriptors for k-step s of part `part`: of a staged tile (rows n0 ..
// as the K-major operand; as the MN-major one, K down its rows), or of a
// SwizzledRows tile, whose rows serve both ways (each part a 64 x 64 block
// of its own: KMajor<k128B>'s and MnMajor128B's next 64 columns; there n0
// is 0, the tile's 64 rows being the product's N). kTile: halves in a row.
template <class Mma>
__device__ __forceinline__ uint64_t b_k_major(const __half* tile, int n0, int part, int s) {
  return k_major<Mma>(tile + core_matrix_offset(n0, 0, kTile * Mma::kParts), part, s);
}
template <class Mma>
__device__ __forceinline__ uint64_t b_k_major(SwizzledRows tile, int n0, int part, int s) {
  return wgmma::KMajor<wgmma::Swizzle::k128B>::product(tile.tile + part * kSwizzledPart + n0 * kTile, s, kTile,
                                                       kTile);
}
template <class Mma>
__device__ __forceinline__ uint64_t b_rows_as_k(const __half* tile, int part, int s) {
  return rows_as_k<Mma>(tile, part, s);
}
template <class Mma>
__device__ __forceinline__ uint64_t b_rows_as_k(SwizzledRows tile, int part, int s) {
  return wgmma::MnMajor128B::product(tile.tile + part * kSwizzledPart, s, kTile, kTile);
}

// Every part of the A fragment of k-step s (16 columns) of the warp's 16 x
// 64 float values (pair(r, k): the lane's pair at column k of row g (r = 0)
// or g + 8 (r = 1)), rounded to fp16 and split with Fp16x3Warpgroup:
// mma.sync's m16n8k16 A fragment.
template <class Mma, class PairAt>
__device__ __forceinline__ void a_fragment(uint32_t (&a)[Mma::kParts][4], int s, const PairAt& pair) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = pair(i & 1, 16 * s + 8 * (i >> 1));  // a0 (g, 2t..), a1 (g + 8, ..), a2 (g, 2t + 8..), a3
    pack_parts<Mma>(a, i, v.x, v.y);
  }
}

// acc += A B over a product's k-steps, issue(d, s, part_a, part_b,
// accumulate) issuing one wgmma (d = or += the parts' step s). One part:
// into acc, committed, and waited for when `wait`. Two parts: hi lo + lo hi
// and hi hi into fresh accumulators, waited for, and added to acc (the
// Fp16x3Warpgroup policy). The fence comes after the caller's writes of A
// registers and before the products.
template <class Mma, class Issue>
__device__ __forceinline__ void run_products(float (&acc)[32], bool wait, const Issue& issue) {
  wgmma::fence();
  if constexpr (Mma::kParts == 1) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) issue(acc, s, 0, 0, true);
    wgmma::commit();
    if (wait) wgmma::wait<0>();
  } else {
    // Not zeroed: the first product into each is issued with accumulate false (wgmma's scale-d 0), which writes
    // them without reading them; zeroing would cost 64 moves a product.
    float small[32], big[32];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      issue(small, s, 0, 1, s > 0);  // hi lo
      issue(small, s, 1, 0, true);   // lo hi
      issue(big, s, 0, 0, s > 0);    // hi hi
    }
    wgmma::commit();
    wgmma::wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] += fmaf(small[i], 1.f / kLowPartFactor, big[i]);
  }
}

// acc += A B, A the warp's 16 x 64 float values (pair: a_fragment's) rounded
// to fp16 (split with two parts) and B a staged k-major tile ([k][n], read
// MN-major; b_rows_as_k); run_products' `wait`.
template <class Mma, class BTile, class PairAt>
__device__ __forceinline__ void register_a_product(float (&acc)[32], bool wait, BTile b_tile, const PairAt& pair) {
  uint32_t a[kSteps][Mma::kParts][4];  // every step's fragments, written before run_products' fence
#pragma unroll
  for (int s = 0; s < kSteps; ++s) a_fragment<Mma>(a[s], s, pair);
  run_products<Mma>(acc, wait, [&](float(&d)[32], int s, int pa, int pb, bool accumulate) {
    wgmma::mma_64x64x16<true>(d, a[s][pa], b_rows_as_k<Mma>(b_tile, pb, s), accumulate);
  });
}
}  // namespace warpgroup

// acc += A B^T, A a staged 64 x 64 tile (its rows the warpgroup's, K-major)
// and B the staged n-major tile from row n0 ([n][k]: a plain staged tile or
// SwizzledRows); issued and waited for. Its A rows are the staged ones
// (WarpRows, which wgmma reads without the map): a caller whose rows are
// permuted stages them permuted (the backward's kFragmentOrderK); another
// row map does not compile.
template <class Mma, int K, int N, class BTile>
  requires(Mma::kWarpgroup)
__device__ __forceinline__ void tile_product(float (&acc)[N][4], const __half* a_tile, int /*a_stride*/,
                                             WarpRows /*a_row*/, BTile b_tile, int /*b_stride*/, int n0,
                                             int /*lane*/) {
  using namespace warpgroup;
  static_assert(K == 8 && N == 8, "warpgroup products are 64 x 64 x 64");
  run_products<Mma>(flat(acc), true, [&](float(&d)[32], int s, int pa, int pb, bool accumulate) {
    wgmma::mma_64x64x16(d, k_major<Mma>(a_tile, pa, s), b_k_major<Mma>(b_tile, n0, pb, s), accumulate);
  });
}

// acc += A B, A an earlier product's accumulators (rounded to fp16 as they
// are) and B a staged k-major tile ([k][n], read MN-major; a plain staged
// tile or SwizzledRows); issued, and with
// one part not waited for: products_done before acc is read or b_tile
// written.
template <class Mma, int K, int N, class BTile>
  requires(Mma::kWarpgroup)
__device__ __forceinline__ void accumulator_product(float (&acc)[N][4], const float (&a_acc)[K][4], BTile b_tile,
                                                    int /*b_stride*/, int /*lane*/) {
  using namespace warpgroup;
  static_assert(K == 8 && N == 8, "warpgroup products are 64 x 64 x 64");
  register_a_product<Mma>(flat(acc), false, b_tile, [&](int r, int k) {
    const float(&c)[4] = a_acc[k / 8];
    return make_float2(c[2 * r], c[2 * r + 1]);
  });
}

// acc += (a_scale A) B, A the warp's rows a_row(r) of a float32 shared tile
// (rounded to fp16 as loaded) and B a staged k-major tile; issued and waited for.
template <class Mma, int K, int N, class RowOf>
  requires(Mma::kWarpgroup)
__device__ __forceinline__ void scaled_float_product(float (&acc)[N][4], const float* a_tile, int a_stride,
                                                     const RowOf& a_row, float a_scale, const __half* b_tile,
                                                     int /*b_stride*/, int lane) {
  using namespace warpgroup;
  static_assert(K == 8 && N == 8, "warpgroup products are 64 x 64 x 64");
  const int g = lane >> 2, t = lane & 3;
  const float* rows[2] = {a_tile + a_row(g) * a_stride + 2 * t, a_tile + a_row(g + 8) * a_stride + 2 * t};
  register_a_product<Mma>(flat(acc), true, b_tile, [&](int r, int k) {
    const float2 v = *reinterpret_cast<const float2*>(rows[r] + k);
    return make_float2(a_scale * v.x, a_scale * v.y);
  });
}

}  // namespace tg::cuda::mma
