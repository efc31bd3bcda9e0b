// The "highest" split GEMM on Hopper's warpgroup MMA (declared in
// ops/matmul_warpgroup.h; built for sm_90a, chosen by ops/matmul.cu's
// gemm_fp16 on compute capability 9.0). bench/NOTES.md version 25.
//
// A CTA computes a 128 x 128 tile of c, each of its two warpgroups 64 rows
// of it with m64n128k16 products. Along k it walks stretches of 64 (a
// chunk): A's hi and lo [128][64] and B's hi and lo [128 cols][64] (B
// transposed first, so that both operands are K-major) copied by the TMA
// kStages chunks ahead into wgmma's 128-byte swizzled K-major layout (one
// 128-byte row per tile row), each stage's four boxes completing one
// mbarrier. Per chunk and warpgroup: four hi hi products into a fresh
// accumulator (a group of its own), then the eight cross products onto the
// running cross sum (a second group); once the first group is done its
// accumulator is added to the float running sum while the second still
// runs. The end: c = alpha sum + low_alpha cross.
//
// Why not cuBLAS: its accumulation over k truncates in the tensor cores, so
// the hi hi product had to go in k slices of 512, each a GEMM of its own
// whose output c (or a workspace) is read and written again per slice; at
// 773/32 the slices of dx = dqkv Wqkv moved more bytes of c than the
// products took time (bench/NOTES.md version 24). Why the TMA: the first
// version staged with cp.async (16 bytes a thread, 8 rows x 64 bytes a
// warp) and ran at 190-250 TFLOP/s, the L2 90% busy (version 25).
#include "ops/matmul_warpgroup.h"

#include "core/cuda_context.h"
#include "core/error.h"
#include "core/tma.cuh"
#include "core/wgmma.cuh"

namespace tg::cuda {

namespace {

constexpr int kRows = kSplitGemmRows, kCols = kSplitGemmCols, kDepth = kSplitGemmDepth;
constexpr int kThreads = 256, kStages = 3, kSteps = kDepth / 16;
static_assert(kDepth * sizeof(__half) == 128, "a chunk's tile row is one 128-byte swizzled row");
constexpr int kATile = kRows * kDepth, kBTile = kCols * kDepth;  // halves of one part
constexpr int kStageHalves = 2 * (kATile + kBTile);              // hi and lo of A and B
constexpr uint32_t kStageBytes = kStageHalves * sizeof(__half);
constexpr size_t kSharedBytes = size_t(kStages) * kStageBytes + 1024 + kStages * sizeof(uint64_t);  // + alignment

struct SplitGemmMaps {
  CUtensorMap a_hi, a_lo, b_hi, b_lo;  // b: the transposed parts [cols, depth]
};

using Tile = wgmma::KMajor<wgmma::Swizzle::k128B>;

__global__ void __launch_bounds__(kThreads, 1)
    split_gemm_kernel(const __grid_constant__ SplitGemmMaps maps, const __grid_constant__ SplitGemm g) {
  extern __shared__ unsigned char raw[];
  // The swizzled tiles need 1024-byte alignment; the barriers follow the stages.
  __half* stages = reinterpret_cast<__half*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * kStageHalves);
  // blockIdx.x walks the columns: the CTAs resident at once share A's rows (read from DRAM about once).
  const int row0 = static_cast<int>(blockIdx.y) * kRows, col0 = static_cast<int>(blockIdx.x) * kCols;
  const int chunks = static_cast<int>(g.depth / kDepth), warpgroup = static_cast<int>(threadIdx.x) / 128;
  const auto stage_of = [&](int chunk) { return stages + (chunk % kStages) * kStageHalves; };
  const auto load = [&](int chunk) {  // by one thread
    __half* s = stage_of(chunk);
    uint64_t* bar = full + chunk % kStages;
    tma::arrive_expect_bytes(bar, kStageBytes);
    const int k0 = chunk * kDepth;
    tma::load_2d(s, maps.a_hi, k0, row0, bar);
    tma::load_2d(s + kATile, maps.a_lo, k0, row0, bar);
    tma::load_2d(s + 2 * kATile, maps.b_hi, k0, col0, bar);
    tma::load_2d(s + 2 * kATile + kBTile, maps.b_lo, k0, col0, bar);
  };
  // Part p (0 hi, 1 lo) of the staged chunk's k-step s: this warpgroup's 64 rows of A, and B.
  const auto a_desc = [&](const __half* s, int p, int step) {
    return Tile::product(s + p * kATile + 64 * kDepth * warpgroup, step, 64, kDepth);
  };
  const auto b_desc = [&](const __half* s, int p, int step) {
    return Tile::product(s + 2 * kATile + p * kBTile, step, kCols, kDepth);
  };

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) tma::init_barrier(full + i, 1);
    tma::fence_barrier_init();
    for (int c = 0; c < kStages - 1 && c < chunks; ++c) load(c);
  }
  __syncthreads();
  float sum[64], cross[64], fresh[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) sum[i] = cross[i] = 0.f;
  for (int c = 0; c < chunks; ++c) {
    wgmma::wait<0>();  // chunk c - 1's cross products are done with the stage loaded next
    __syncthreads();   // ... in both warpgroups
    if (threadIdx.x == 0 && c + kStages - 1 < chunks) load(c + kStages - 1);
    tma::wait(full + c % kStages, (c / kStages) & 1);
    const __half* s = stage_of(c);
    wgmma::fence();
#pragma unroll
    for (int step = 0; step < kSteps; ++step) wgmma::mma_64x128x16(fresh, a_desc(s, 0, step), b_desc(s, 0, step), step > 0);
    wgmma::commit();
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      wgmma::mma_64x128x16(cross, a_desc(s, 0, step), b_desc(s, 1, step), true);
      wgmma::mma_64x128x16(cross, a_desc(s, 1, step), b_desc(s, 0, step), true);
    }
    wgmma::commit();
    wgmma::wait<1>();  // the hi hi group
#pragma unroll
    for (int i = 0; i < 64; ++i) sum[i] += fresh[i];
  }
  wgmma::wait<0>();

  // Accumulator d[4j + 2h + e] of thread (warp w, g = lane / 4, t = lane % 4) is (16 w + g + 8 h, 8 j + 2 t + e).
  const float alpha = *g.alpha, low_alpha = *g.low_alpha;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + 64 * warpgroup + 16 * warp + lane / 4 + 8 * h;
    if (row >= g.rows) continue;
    float* out = g.c + row * g.cols + col0 + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int i = 4 * j + 2 * h;
      *reinterpret_cast<float2*>(out + 8 * j) =
          make_float2(fmaf(low_alpha, cross[i], alpha * sum[i]), fmaf(low_alpha, cross[i + 1], alpha * sum[i + 1]));
    }
  }
}

// to[part][n][k] = from[part][k][n] for B's two parts (blockIdx.z), 32 x 32 tiles through shared memory.
constexpr int kTransposeTile = 32;
struct TransposeArgs {
  const __half* from[2];
  __half* to;
  int64_t depth, cols;
};
__global__ void __launch_bounds__(kTransposeTile * 8) transpose_parts_kernel(const __grid_constant__ TransposeArgs t) {
  __shared__ __half tile[kTransposeTile][kTransposeTile + 2];
  const __half* from = t.from[blockIdx.z];
  __half* to = t.to + blockIdx.z * t.depth * t.cols;
  const int64_t k0 = int64_t(blockIdx.y) * kTransposeTile, n0 = int64_t(blockIdx.x) * kTransposeTile;
  const int x = threadIdx.x % kTransposeTile, y = threadIdx.x / kTransposeTile;
  for (int r = y; r < kTransposeTile; r += 8) tile[r][x] = from[(k0 + r) * t.cols + n0 + x];
  __syncthreads();
  for (int r = y; r < kTransposeTile; r += 8) to[(n0 + r) * t.depth + k0 + x] = tile[x][r];
}

}  // namespace

void launch_split_gemm_warpgroup(const SplitGemm& g) {
  const char* op = "gemm_fp16";
  TG_CHECK(split_gemm_fits(g.rows, g.cols, g.depth), "split_gemm (internal): sizes it does not take: ", g.rows, " x ",
           g.depth, " @ ", g.depth, " x ", g.cols);
  const int64_t row_tiles = (g.rows + kRows - 1) / kRows;
  const TransposeArgs t{{g.b_hi, g.b_lo}, g.b_transposed, g.depth, g.cols};
  transpose_parts_kernel<<<dim3(static_cast<unsigned>(g.cols / kTransposeTile),
                                static_cast<unsigned>(g.depth / kTransposeTile), 2),
                           kTransposeTile * 8, 0, stream()>>>(t);
  check_launch(op);
  const __half *b_hi = g.b_transposed, *b_lo = g.b_transposed + g.cols * g.depth;
  const SplitGemmMaps maps{tma::encode_2d(g.a_hi, g.rows, g.depth, kRows, kDepth, op),
                           tma::encode_2d(g.a_lo, g.rows, g.depth, kRows, kDepth, op),
                           tma::encode_2d(b_hi, g.cols, g.depth, kCols, kDepth, op),
                           tma::encode_2d(b_lo, g.cols, g.depth, kCols, kDepth, op)};
  allow_shared_memory<split_gemm_kernel>(kSharedBytes, op);
  const dim3 grid(static_cast<unsigned>(g.cols / kCols), static_cast<unsigned>(row_tiles));
  split_gemm_kernel<<<grid, kThreads, kSharedBytes, stream()>>>(maps, g);
  check_launch(op);
}

}  // namespace tg::cuda
