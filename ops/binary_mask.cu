#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/binary_mask_kernels.h"

namespace tg {

namespace {

// A grid-stride count per thread, a block sum, one atomic per block that saw any.
template <class T>
__global__ void count_non_binary_kernel(const T* mask, int64_t n, double* count) {
  cuda::after_previous_kernels();
  double c = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    c += non_binary(mask[i]) ? 1 : 0;
  c = cuda::block_sum(c);
  if (threadIdx.x == 0 && c != 0) atomicAdd(count, c);
}

}  // namespace

template <>
void BinaryMaskKernels<Device::CUDA>::count_non_binary(const Tensor& mask, const Tensor& counts, int64_t slot) {
  const int64_t n = mask.numel();
  if (n == 0) return;
  TG_DISPATCH_FLOAT(mask.dtype(), T, [&] {
    cuda::launch("check_binary_mask", count_non_binary_kernel<T>, cuda::grid_for(n), cuda::kThreads, 0, mask.data<T>(),
                 n, counts.data<double>() + slot);
  });
}

TG_INSTANTIATE_KERNELS(BinaryMaskKernels, Device::CUDA);

}  // namespace tg
