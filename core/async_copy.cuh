// Asynchronous global -> shared copies (cp.async, sm_80+): a thread issues
// many copies without waiting for each, commits them as a group, and waits
// for whole groups later, so a tile's loads are all in flight at once and can
// overlap arithmetic on the previous data. A copy with `valid` false writes
// zeros and reads nothing.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace tg::cuda::async {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The first kAlign-byte boundary of the shared address space at or after p,
// a 16-byte aligned pointer into shared memory (an __align__(16) dynamic
// array; swizzled tiles need 1024). p is offset, not rounded as an integer: a
// pointer that went through an integer is generic to nvcc, and its loads
// become generic ones with 64-bit addresses instead of ld.shared.
template <unsigned kAlign>
__device__ __forceinline__ unsigned char* align_shared(unsigned char* p) {
  static_assert(kAlign > 0 && (kAlign & (kAlign - 1)) == 0, "align_shared: a power of two");
  if constexpr (kAlign <= 16) return p;
  else return p + (kAlign - shared_address(p) % kAlign) % kAlign;
}

// 16 bytes; both addresses 16-byte aligned. Cached in L2 only (.cg).
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// 16 bytes that are all there to read: the form without a source size, for
// whole tiles, which needs no per-copy select or predicate.
__device__ __forceinline__ void copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)), "l"(src) : "memory");
}

// 4 bytes.
__device__ __forceinline__ void copy4(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

// Closes the group of the copies this thread issued since the last commit.
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `kPending` of this thread's groups are still in flight
// (the newest ones). Other threads' copies need a __syncthreads after it.
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace tg::cuda::async
