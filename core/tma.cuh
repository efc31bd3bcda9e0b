// Hopper's tensor memory accelerator (TMA, sm_90): one thread asks for a
// whole 2-D or 3-D box of a global tensor to be copied into shared memory
// (cp.async.bulk.tensor), laid out and swizzled as the tensor map describes,
// and the copy reports its bytes to an mbarrier in shared memory, on which
// the CTA's threads wait. Rows of the box outside the tensor are written as
// zeros. Host side: `encode`, from the driver's cuTensorMapEncodeTiled
// (reached through the runtime, so nothing links libcuda).
#pragma once
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/async_copy.cuh"

namespace tg::cuda::tma {

using async::shared_address;

// An mbarrier that completes once `arrivals` threads arrived and every byte
// announced to it (expect_bytes) has landed.
__device__ __forceinline__ void init_barrier(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(arrivals) : "memory");
}
// Makes initialised barriers visible to the async proxy (the TMA unit); a
// __syncthreads after it makes them visible to the CTA's threads.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// This thread's arrival, announcing `bytes` of copies that will complete the phase.
__device__ __forceinline__ void arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}
// Waits for the phase of parity `parity` (0 for the first, 1 for the next, ...) to complete.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(shared_address(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}

// The box of `map` at (inner, outer) (element coordinates, inner the
// contiguous dimension) into dst, completing on bar.
__device__ __forceinline__ void load_2d(void* dst, const CUtensorMap& map, int inner, int outer, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(inner), "r"(outer), "r"(shared_address(bar))
      : "memory");
}

// The same in three dimensions: the box of `map` at (inner, middle, outer).
__device__ __forceinline__ void load_3d(void* dst, const CUtensorMap& map, int inner, int middle, int outer,
                                        uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(inner), "r"(middle), "r"(outer), "r"(shared_address(bar))
      : "memory");
}

// Host: a tensor of up to three dimensions as a TMA reads it: dims[0] the
// contiguous one, strides[i] the bytes from one index of dimension i + 1 to
// the next (multiples of 16; a dimension may be shorter than its stride
// allows, the elements past it read as zeros), boxes of box[0] x box[1] x
// box[2] elements (box[0] times the element's size at most 128 bytes).
struct TensorShape {
  int rank;
  uint64_t dims[3];
  uint64_t strides[2];
  uint32_t box[3];
};

// Host: the map of such a tensor of fp16 or float elements at base (16-byte
// aligned), its boxes written with the 128-byte swizzle, the one layout the
// kernels here read (a box row of 128 bytes: one row of wgmma's K-major
// swizzled layout, core/wgmma.cuh); errors name `op`.
CUtensorMap encode(const void* base, CUtensorMapDataType type, const TensorShape& shape, const char* op);

// Host: the map of a row-major fp16 matrix [rows, cols] (cols a multiple of
// 8, base 16-byte aligned) read in boxes of box_rows x box_cols (encode's).
CUtensorMap encode_2d(const __half* base, int64_t rows, int64_t cols, int box_rows, int box_cols, const char* op);

}  // namespace tg::cuda::tma
