#include "core/cuda_loops.cuh"
#include "ops/elementwise_kernels.h"

namespace tg {
TG_INSTANTIATE_KERNELS(ElementwiseKernels, Device::CUDA);
}
