// TG_HD marks functions compiled for both the host and the device, so one
// definition of each element formula serves the CPU loop and the CUDA kernel.
#pragma once
#ifdef __CUDACC__
#define TG_HD __host__ __device__ __forceinline__
#else
#define TG_HD inline
#endif
