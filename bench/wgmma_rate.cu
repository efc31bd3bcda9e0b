// bench/wgmma_rate: the tensor cores' rate from shared memory, for the next
// attention kernels' design (bench/NOTES.md): the same 64 x 64 x 64 fp16
// product (fp32 accumulation), repeated by every CTA from operand tiles it
// keeps in shared memory, six CTAs of four warps on every SM, through
//   - mma.sync m16n8k16 with ldmatrix (core/mma.cuh's tile_product, the
//     current kernels' path: four warps of 16 rows each), alternating
//     between two copies of the tiles so that the loads stay in the loop
//     (with one copy ptxas may hoist them and hold the operands in
//     registers: session 26's first run, 119 registers, a rate that the
//     shared memory's bandwidth could not have fed),
//   - wgmma m64n64k16 from K-major tiles without swizzle (core/wgmma.cuh),
//   - wgmma from tiles with the 128-byte swizzle,
// with one group of four products in flight behind the one being issued. No
// global memory is read: the rate is the tensor cores' and the operand
// path's. Timing: bench/timing.h (CUDA events, warm-up, median).
// Built for sm_90a (wgmma needs it); runs on Hopper alone.
#include <cstdio>

#include "bench/timing.h"
#include "core/mma.cuh"
#include "core/wgmma.cuh"

namespace {

namespace mma = tg::cuda::mma;
namespace wg = tg::cuda::wgmma;

constexpr int kTile = 64;            // rows and K of each operand tile
constexpr int kIterations = 4096;    // products of 64 x 64 x 64 per CTA
constexpr int kHalfStride = 72;      // the current kernels' fp16 row stride
constexpr int kCtasPerSm = 6;         // what the mma.sync kernel's 36 KB of tiles allow

// A small value for element i, so that no sum overflows.
__device__ float value(int i) { return static_cast<float>(i % 7 - 3) / 64; }

// The accumulators' sum, stored so that the products cannot be dropped.
template <int N>
__device__ void keep(const float (&d)[N], float* out) {
  float sum = 0;
  for (float x : d) sum += x;
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

__global__ void __launch_bounds__(128) mma_sync_rate_kernel(float* out) {
  constexpr int kTileHalves = kTile * kHalfStride;
  __shared__ alignas(16) __half a[2 * kTileHalves], b[2 * kTileHalves];
  for (int i = threadIdx.x; i < 2 * kTileHalves; i += blockDim.x) {
    a[i] = __float2half_rn(value(i % kTileHalves));
    b[i] = __float2half_rn(value(i % kTileHalves + 3));
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const auto rows = [&](int r) { return 16 * warp + r; };
  float acc[8][4] = {};
  for (int it = 0; it < kIterations; ++it) {
    const int copy = (it & 1) * kTileHalves;
    mma::tile_product<mma::Fp16, kTile / 8, 8>(acc, a + copy, kHalfStride, rows, b + copy, kHalfStride, 0, lane);
  }
  float flat[32];
  for (int i = 0; i < 32; ++i) flat[i] = acc[i / 4][i % 4];
  keep(flat, out);
}

template <wg::Swizzle kSwizzle>
__global__ void __launch_bounds__(128) wgmma_rate_kernel(float* out) {
  using Layout = wg::KMajor<kSwizzle>;
  __shared__ alignas(1024) __half a[kTile * kTile], b[kTile * kTile];
  for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
    a[Layout::offset(i / kTile, i % kTile, kTile, kTile)] = __float2half_rn(value(i));
    b[Layout::offset(i / kTile, i % kTile, kTile, kTile)] = __float2half_rn(value(i + 3));
  }
  wg::fence_shared_writes();
  __syncthreads();
  float d[32] = {};
  wg::fence();
  for (int it = 0; it < kIterations; ++it) {
#pragma unroll
    for (int s = 0; s < kTile / 16; ++s)
      wg::mma_64x64x16(d, Layout::product(a, s, kTile, kTile), Layout::product(b, s, kTile, kTile), true);
    wg::commit();
    wg::wait<1>();
  }
  wg::wait<0>();
  keep(d, out);
}

}  // namespace

int main() {
  if (!tgbench::cuda_present("wgmma_rate")) return 1;
  int device = 0, major = 0;
  TG_CUDA_CHECK(cudaGetDevice(&device), "wgmma_rate");
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "wgmma_rate");
  if (major != 9) {
    std::printf("wgmma_rate: wgmma needs a Hopper GPU (compute capability 9.0)\n");
    return 1;
  }
  const int ctas = kCtasPerSm * tg::cuda::context().sm_count;
  const tg::Tensor out = tg::empty({int64_t(ctas) * 128}, {tg::DType::Float32, tg::Device::CUDA});
  const double flops = 2.0 * kTile * kTile * kTile * kIterations * ctas;
  tgbench::Timer timer;
  const auto rate = [&](const char* name, auto kernel) {
    const double ms = timer.median_ms([&] {
      kernel<<<ctas, 128, 0, tg::cuda::stream()>>>(out.data<float>());
      tg::cuda::check_launch("wgmma_rate");
    });
    std::printf("%-44s %8.3f ms  %6.1f TFLOP/s\n", name, ms, flops / ms * 1e-9);
    return flops / ms * 1e-9;
  };
  std::printf("%d CTAs of 128 threads, each %d products of 64 x 64 x 64 (fp16, fp32 accumulation)\n", ctas,
              kIterations);
  const double sync = rate("mma.sync m16n8k16 + ldmatrix (current)", mma_sync_rate_kernel);
  const double plain = rate("wgmma m64n64k16, no swizzle", wgmma_rate_kernel<wg::Swizzle::kNone>);
  const double swizzled = rate("wgmma m64n64k16, 128-byte swizzle", wgmma_rate_kernel<wg::Swizzle::k128B>);
  std::printf("wgmma over mma.sync: %.2fx without swizzle, %.2fx with the 128-byte swizzle\n", plain / sync,
              swizzled / sync);
  return 0;
}
