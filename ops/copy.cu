#include "core/cuda_loops.cuh"
#include "ops/copy_kernels.h"

namespace tg {

TG_INSTANTIATE_KERNELS(CopyKernels, Device::CUDA);

void cuda::copy_between_devices(const Tensor& dst, const Tensor& src) {
  const size_t bytes = dst.numel() * element_size(dst.dtype());
  if (bytes == 0) return;
  const cudaMemcpyKind kind = dst.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  TG_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), bytes, kind, stream()), "to");
  TG_CUDA_CHECK(cudaStreamSynchronize(stream()), "to");
}

}  // namespace tg
