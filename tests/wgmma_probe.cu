// One 64 x 64 x k product on wgmma (core/wgmma.cuh) for `cuda/wgmma`: a
// single warpgroup stages both operands as K-major core-matrix tiles and
// accumulates k / 16 products (k = 16, 64 or 128). Compiled for sm_90a
// (wgmma needs it), so it runs on Hopper alone; the test skips elsewhere.
#include <cuda_fp16.h>

#include "core/cuda_context.h"
#include "core/wgmma.cuh"

namespace tgtest {

namespace {

constexpr int kTileRows = 64;

// c (64 x 64, row-major) = a b^T for a and b 64 x kK (row-major floats,
// made fp16 here). kK is a template parameter so that the products unroll:
// a loop over them with a run-time bound makes ptxas serialize the wgmma
// instructions (its warning C7520).
template <int kK>
__global__ void __launch_bounds__(128) wgmma_product_kernel(const float* a, const float* b, float* c) {
  namespace wg = tg::cuda::wgmma;
  constexpr int kCores = kK / 8;
  __shared__ alignas(128) __half as[kTileRows * kK], bs[kTileRows * kK];
  for (int i = threadIdx.x; i < kTileRows * kK; i += blockDim.x) {
    const int at = wg::k_major_offset(i / kK, i % kK, kCores);
    as[at] = __float2half_rn(a[i]);
    bs[at] = __float2half_rn(b[i]);
  }
  wg::fence_shared_writes();
  __syncthreads();
  float d[32];
  for (float& x : d) x = __int_as_float(0x7fc00000);  // NaN: the first product must overwrite, not add
  wg::fence();
#pragma unroll
  for (int s = 0; s < kK / 16; ++s) {  // product s: core matrices 2s and 2s + 1 along K
    const int first = wg::k_major_offset(0, 16 * s, kCores);
    wg::mma_64x64x16(d, wg::k_major_descriptor(as + first, kCores), wg::k_major_descriptor(bs + first, kCores), s > 0);
  }
  wg::commit();
  wg::wait<0>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = 16 * warp + lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = 8 * j + 2 * t;
    c[row * 64 + col] = d[4 * j];
    c[row * 64 + col + 1] = d[4 * j + 1];
    c[(row + 8) * 64 + col] = d[4 * j + 2];
    c[(row + 8) * 64 + col + 1] = d[4 * j + 3];
  }
}

}  // namespace

// Whether the device is compute capability 9.0 (sm_90a code runs there
// alone); false, not an exception, where the runtime cannot tell (this runs
// while the tests register, before main).
bool wgmma_supported() {
  int device = 0, major = 0, minor = 0;
  const bool known = cudaGetDevice(&device) == cudaSuccess &&
                     cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                     cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
  if (!known) cudaGetLastError();  // clears the error, so that no later launch check reports it
  return known && major == 9 && minor == 0;
}

void wgmma_product(const float* a, const float* b, int k, float* c) {
  const auto launch = [&](auto kernel) {
    kernel<<<1, 128, 0, tg::cuda::stream()>>>(a, b, c);
    tg::cuda::check_launch("wgmma_probe");
  };
  if (k == 16) launch(wgmma_product_kernel<16>);
  else if (k == 64) launch(wgmma_product_kernel<64>);
  else if (k == 128) launch(wgmma_product_kernel<128>);
  else TG_FAIL("wgmma_probe: k = ", k, " is none of 16, 64 and 128");
}

}  // namespace tgtest
