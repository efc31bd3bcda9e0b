// TG_HD marks functions compiled for both the host and the device, so one
// definition of each element formula serves the CPU loop and the CUDA kernel.
#pragma once
#ifdef __CUDACC__
#define TG_HD __host__ __device__ __forceinline__
#else
#define TG_HD inline
#endif

// TG_UNROLL(n): `#pragma unroll n` in device code, nothing in host code.
#ifdef __CUDA_ARCH__
#define TG_PRAGMA(x) _Pragma(#x)
#define TG_UNROLL(n) TG_PRAGMA(unroll n)
#else
#define TG_UNROLL(n)
#endif
