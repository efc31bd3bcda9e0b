// One 64 x 64 x k product on wgmma (core/wgmma.cuh) for `cuda/wgmma`: a
// single warpgroup stages both operands as K-major tiles, each without
// swizzle or with the 128-byte swizzle, and accumulates k / 16 products.
// And the split products of core/mma.cuh's Fp16x3Warpgroup for
// `cuda/mma_split` (tests/split_probe.cuh). Compiled for sm_90a (wgmma needs
// it), so it runs on Hopper alone; the tests skip elsewhere.
#include <cuda_fp16.h>

#include "core/cuda_context.h"
#include "core/mma.cuh"
#include "core/wgmma.cuh"  // before split_probe.cuh: its kernel's calls find the warpgroup products
#include "split_probe.cuh"

namespace tgtest {

namespace {

constexpr int kTileRows = 64;
using tg::cuda::wgmma::KMajor;
using tg::cuda::wgmma::MnMajor;
using tg::cuda::wgmma::MnMajor128B;
using tg::cuda::wgmma::MnMajorOfRows;
using tg::cuda::wgmma::Swizzle;
using Plain = KMajor<Swizzle::kNone>;
using Swizzled = KMajor<Swizzle::k128B>;

// A's k-step s in warp `warp`'s registers, as mma.sync's A fragment.
template <int kK>
__device__ void a_fragment(uint32_t (&r)[4], const float* a, int warp, int lane, int s) {
  const int row = 16 * warp + lane / 4, col = 16 * s + 2 * (lane % 4);
  const auto pair = [&](int rr, int cc) {
    return tg::cuda::mma::pack_half2(a[rr * kK + cc], a[rr * kK + cc + 1]);
  };
  r[0] = pair(row, col), r[1] = pair(row + 8, col), r[2] = pair(row, col + 8), r[3] = pair(row + 8, col + 8);
}

// c (64 x 64, row-major) = a b^T for a and b 64 x kK (row-major floats,
// made fp16 here), A staged in layout kA (or with kARegs held in
// registers) and B in kB. kK is a template parameter so that the products
// unroll: a loop over them with a run-time bound makes ptxas serialize the
// wgmma instructions (its warning C7520).
template <class A, class B, int kK, bool kARegs = false>
__global__ void __launch_bounds__(128) wgmma_product_kernel(const float* a, const float* b, float* c) {
  namespace wg = tg::cuda::wgmma;
  __shared__ alignas(1024) __half as[kTileRows * kK];
  __shared__ alignas(1024) __half bs[kTileRows * kK];
  for (int i = threadIdx.x; i < kTileRows * kK; i += blockDim.x) {
    const int r = i / kK, k = i % kK;
    as[A::offset(r, k, kTileRows, kK)] = __float2half_rn(a[i]);
    bs[B::offset(r, k, kTileRows, kK)] = __float2half_rn(b[i]);
  }
  wg::fence_shared_writes();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  [[maybe_unused]] uint32_t a_regs[kK / 16][4];
  if constexpr (kARegs)
    for (int s = 0; s < kK / 16; ++s) a_fragment<kK>(a_regs[s], a, warp, lane, s);
  float d[32];
  for (float& x : d) x = __int_as_float(0x7fc00000);  // NaN: the first product must overwrite, not add
  wg::fence();
#pragma unroll
  for (int s = 0; s < kK / 16; ++s) {
    const uint64_t b_s = B::product(bs, s, kTileRows, kK);
    if constexpr (kARegs) wg::mma_64x64x16<B::kTransposed>(d, a_regs[s], b_s, s > 0);
    else wg::mma_64x64x16<B::kTransposed, A::kTransposed>(d, A::product(as, s, kTileRows, kK), b_s, s > 0);
  }
  wg::commit();
  wg::wait<0>();
  const int row = 16 * warp + lane / 4, t = lane % 4;
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

// layouts: 0 both without swizzle, 1 A swizzled, 2 B swizzled, 3 both (k a
// multiple of 64 for a swizzled one); 4 A from registers, B without swizzle,
// 5 A from registers, B swizzled; B MN-major (A without swizzle, or from
// registers): 6 and 7 MnMajor, 8 and 9 MnMajorOfRows; with the 128-byte
// swizzle (MnMajor128B): 10 B MN-major (A swizzled), 11 A MN-major (B swizzled).
void wgmma_product(const float* a, const float* b, int k, int layouts, float* c) {
  const auto launch = [&](auto kernel) {
    kernel<<<1, 128, 0, tg::cuda::stream()>>>(a, b, c);
    tg::cuda::check_launch("wgmma_probe");
  };
  if (layouts == 0 && k == 16) launch(wgmma_product_kernel<Plain, Plain, 16>);
  else if (layouts == 0 && k == 64) launch(wgmma_product_kernel<Plain, Plain, 64>);
  else if (layouts == 0 && k == 128) launch(wgmma_product_kernel<Plain, Plain, 128>);
  else if (layouts == 1 && k == 64) launch(wgmma_product_kernel<Swizzled, Plain, 64>);
  else if (layouts == 2 && k == 128) launch(wgmma_product_kernel<Plain, Swizzled, 128>);
  else if (layouts == 3 && k == 64) launch(wgmma_product_kernel<Swizzled, Swizzled, 64>);
  else if (layouts == 3 && k == 128) launch(wgmma_product_kernel<Swizzled, Swizzled, 128>);
  else if (layouts == 4 && k == 64) launch(wgmma_product_kernel<Plain, Plain, 64, true>);
  else if (layouts == 5 && k == 128) launch(wgmma_product_kernel<Plain, Swizzled, 128, true>);
  else if (layouts == 6 && k == 64) launch(wgmma_product_kernel<Plain, MnMajor, 64>);
  else if (layouts == 7 && k == 128) launch(wgmma_product_kernel<Plain, MnMajor, 128, true>);
  else if (layouts == 8 && k == 64) launch(wgmma_product_kernel<Plain, MnMajorOfRows, 64>);
  else if (layouts == 9 && k == 128) launch(wgmma_product_kernel<Plain, MnMajorOfRows, 128, true>);
  else if (layouts == 10 && k == 64) launch(wgmma_product_kernel<Swizzled, MnMajor128B, 64>);
  else if (layouts == 11 && k == 128) launch(wgmma_product_kernel<MnMajor128B, Swizzled, 128>);
  else TG_FAIL("wgmma_probe: no kernel for k = ", k, " with layouts ", layouts);
}

void split_product_warpgroup(int form, const float* a, const float* b, int k, float* c) {
  split_probe::split_product<tg::cuda::mma::Fp16x3Warpgroup>(form, a, b, k, c);
}

}  // namespace tgtest
