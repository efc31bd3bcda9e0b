// The "highest" split GEMM on Hopper's warpgroup MMA (declared in
// ops/matmul_warpgroup.h; built for sm_90a, chosen by ops/matmul.cu's
// gemm_fp16 on compute capability 9.0). bench/NOTES.md versions 25 and 26.
//
// A CTA computes a 128 x 128 tile of c, each of its two warpgroups 64 rows
// of it with m64n128k16 products. Along k it walks stretches of 64 (a
// chunk): A's hi and lo (128 rows of c by 64 of k) and B's hi and lo (64 of
// k by 128 columns of c), copied by the TMA kStages chunks ahead into
// wgmma's 128-byte swizzled layouts, K-major where the operand is stored
// with k contiguous and MN-major where it is stored k-strided
// (`Operand`), each stage's boxes completing one mbarrier. Per chunk and
// warpgroup: four hi hi products into a fresh accumulator (a group of its
// own), then the eight cross products onto the running cross sum (a second
// group); once the first group is done its accumulator is added to the
// float running sum while the second still runs. The end: c = alpha sum +
// low_alpha cross. With split k (blockIdx.z) a CTA walks its stretch of
// the chunks and writes its partial c for the caller's ordered sum.
//
// Why not cuBLAS: its accumulation over k truncates in the tensor cores, so
// the hi hi product had to go in k slices of 512, each a GEMM of its own
// whose output c (or a workspace) is read and written again per slice; at
// 773/32 the slices of dx = dqkv Wqkv moved more bytes of c than the
// products took time (bench/NOTES.md version 24). Why the TMA: the first
// version staged with cp.async (16 bytes a thread, 8 rows x 64 bytes a
// warp) and ran at 190-250 TFLOP/s, the L2 90% busy (version 25).
#include "ops/matmul_warpgroup.h"

#include <type_traits>

#include "core/async_copy.cuh"
#include "core/cuda_context.h"
#include "core/cuda_launch.cuh"
#include "core/error.h"
#include "core/tma.cuh"
#include "core/wgmma.cuh"

namespace tg::cuda {

namespace {

constexpr int kRows = kSplitGemmRows, kCols = kSplitGemmCols, kDepth = kSplitGemmDepth;
constexpr int kThreads = 256, kStages = 3, kSteps = kDepth / 16, kBox = 64;
static_assert(kDepth * sizeof(__half) == 128 && kBox == kDepth, "a chunk's tile row is one 128-byte swizzled row");
static_assert(kRows == kCols, "both operands' tiles are 128 wide");
constexpr int kTile = kRows * kDepth;       // halves of one part of one operand's chunk
constexpr int kStageHalves = 4 * kTile;     // hi and lo of A and B
constexpr uint32_t kStageBytes = kStageHalves * sizeof(__half);
constexpr size_t kSharedBytes = size_t(kStages) * kStageBytes + 1024 + kStages * sizeof(uint64_t);  // + alignment

// One operand's chunk: 128 rows or columns of c ("outer") by 64 of k, from
// a matrix stored [outer][k] (kKContiguous: one 128 x 64 box, K-major) or
// [k][outer] (two 64 x 64 boxes, MN-major), 128-byte swizzled either way.
// In both the outer elements from `first` (a multiple of 64) start first x
// 64 halves into the tile.
template <bool kKContiguous>
struct Operand {
  using Layout = std::conditional_t<kKContiguous, wgmma::KMajor<wgmma::Swizzle::k128B>, wgmma::MnMajor128B>;
  static CUtensorMap map(const __half* base, int64_t outer, int64_t depth, const char* op) {
    return kKContiguous ? tma::encode_2d(base, outer, depth, kRows, kBox, op)
                        : tma::encode_2d(base, depth, outer, kDepth, kBox, op);
  }
  __device__ static void load(__half* tile, const CUtensorMap& map, int k0, int outer0, uint64_t* bar) {
    if constexpr (kKContiguous) {
      tma::load_2d(tile, map, k0, outer0, bar);
    } else {
      for (int b = 0; b < kRows / kBox; ++b) tma::load_2d(tile + b * kBox * kDepth, map, outer0 + b * kBox, k0, bar);
    }
  }
  // K-step s of the `width` outer elements from `first`.
  __device__ static uint64_t product(const __half* tile, int first, int width, int s) {
    return Layout::product(tile + first * kDepth, s, width, kDepth);
  }
};

struct SplitGemmMaps {
  CUtensorMap a_hi, a_lo, b_hi, b_lo;
};

template <bool kTransposeA, bool kTransposeB>
__global__ void __launch_bounds__(kThreads, 1)
    split_gemm_kernel(const __grid_constant__ SplitGemmMaps maps, const __grid_constant__ SplitGemm g) {
  after_previous_kernels();
  using A = Operand<!kTransposeA>;  // A stored [rows][depth] unless transposed
  using B = Operand<kTransposeB>;   // B stored [depth][cols] unless transposed
  extern __shared__ unsigned char raw[];
  // The swizzled tiles need 1024-byte alignment; the barriers follow the stages.
  __half* stages = reinterpret_cast<__half*>(async::align_shared<1024>(raw));
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * kStageHalves);
  // blockIdx.x walks the columns: the CTAs resident at once share A's rows (read from DRAM about once).
  const int row0 = static_cast<int>(blockIdx.y) * kRows, col0 = static_cast<int>(blockIdx.x) * kCols;
  const int all_chunks = static_cast<int>(split_gemm_chunks(g.depth));  // k past depth arrives as zeros
  const int per_split = static_cast<int>(split_gemm_chunks_per_stretch(all_chunks, g.splits));
  const int first_chunk = static_cast<int>(blockIdx.z) * per_split;
  const int chunks = min(per_split, all_chunks - first_chunk);  // >= 1: the host's splits leave none empty
  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const auto stage_of = [&](int chunk) { return stages + (chunk % kStages) * kStageHalves; };
  const auto load = [&](int chunk) {  // by one thread
    __half* s = stage_of(chunk);
    uint64_t* bar = full + chunk % kStages;
    tma::arrive_expect_bytes(bar, kStageBytes);
    const int k0 = (first_chunk + chunk) * kDepth;
    A::load(s, maps.a_hi, k0, row0, bar);
    A::load(s + kTile, maps.a_lo, k0, row0, bar);
    B::load(s + 2 * kTile, maps.b_hi, k0, col0, bar);
    B::load(s + 3 * kTile, maps.b_lo, k0, col0, bar);
  };
  // Part p (0 hi, 1 lo) of the staged chunk's k-step s: this warpgroup's 64 rows of A, and B.
  const auto a_desc = [&](const __half* s, int p, int step) { return A::product(s + p * kTile, 64 * warpgroup, 64, step); };
  const auto b_desc = [&](const __half* s, int p, int step) { return B::product(s + (2 + p) * kTile, 0, kCols, step); };
  const auto mma = [](float(&d)[64], uint64_t a, uint64_t b, bool accumulate) {
    wgmma::mma_64x128x16<B::Layout::kTransposed, A::Layout::kTransposed>(d, a, b, accumulate);
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
    for (int step = 0; step < kSteps; ++step) mma(fresh, a_desc(s, 0, step), b_desc(s, 0, step), step > 0);
    wgmma::commit();
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      mma(cross, a_desc(s, 0, step), b_desc(s, 1, step), true);
      mma(cross, a_desc(s, 1, step), b_desc(s, 0, step), true);
    }
    wgmma::commit();
    wgmma::wait<1>();  // the hi hi group
#pragma unroll
    for (int i = 0; i < 64; ++i) sum[i] += fresh[i];
  }
  wgmma::wait<0>();

  // Accumulator d[4j + 2h + e] of thread (warp w, g = lane / 4, t = lane % 4) is (16 w + g + 8 h, 8 j + 2 t + e).
  const float alpha = *g.alpha, low_alpha = *g.low_alpha;
  float* c = blockIdx.z == 0 ? g.c : g.partials + (blockIdx.z - 1) * g.rows * g.cols;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + 64 * warpgroup + 16 * warp + lane / 4 + 8 * h;
    if (row >= g.rows) continue;
    float* out = c + row * g.cols + col0 + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int i = 4 * j + 2 * h;
      *reinterpret_cast<float2*>(out + 8 * j) =
          make_float2(fmaf(low_alpha, cross[i], alpha * sum[i]), fmaf(low_alpha, cross[i + 1], alpha * sum[i + 1]));
    }
  }
}

template <bool kTransposeA, bool kTransposeB>
void launch_split_gemm(const SplitGemm& g, const char* op) {
  using A = Operand<!kTransposeA>;
  using B = Operand<kTransposeB>;
  const SplitGemmMaps maps{A::map(g.a_hi, g.rows, g.depth, op), A::map(g.a_lo, g.rows, g.depth, op),
                           B::map(g.b_hi, g.cols, g.depth, op), B::map(g.b_lo, g.cols, g.depth, op)};
  constexpr auto kernel = split_gemm_kernel<kTransposeA, kTransposeB>;
  allow_shared_memory<kernel>(kSharedBytes, op);
  const dim3 grid(static_cast<unsigned>(g.cols / kCols), static_cast<unsigned>((g.rows + kRows - 1) / kRows),
                  static_cast<unsigned>(g.splits));
  launch(op, kernel, grid, kThreads, kSharedBytes, maps, g);
}

}  // namespace

void launch_split_gemm_warpgroup(const SplitGemm& g) {
  const char* op = "gemm_fp16";
  TG_CHECK(split_gemm_takes(g), "split_gemm (internal): a product it does not take: ", g.rows, " x ", g.depth, " @ ",
           g.depth, " x ", g.cols, " (sizes or alignment)");
  const int64_t chunks = split_gemm_chunks(g.depth), per_split = split_gemm_chunks_per_stretch(chunks, g.splits);
  TG_CHECK(g.splits >= 1 && g.splits <= 65535 && (g.splits - 1) * per_split < chunks && (g.splits == 1 || g.partials),
           "split_gemm (internal): ", g.splits, " splits of ", chunks, " chunks leave one empty or have no partials");
  if (!g.transpose_a && !g.transpose_b) launch_split_gemm<false, false>(g, op);
  else if (!g.transpose_a) launch_split_gemm<false, true>(g, op);
  else if (!g.transpose_b) launch_split_gemm<true, false>(g, op);
  else launch_split_gemm<true, true>(g, op);
}

}  // namespace tg::cuda
