#include "core/cuda_loops.cuh"
#include "ops/foreach_kernels.h"

namespace tg {
TG_INSTANTIATE_KERNELS(ForeachKernels, Device::CUDA);
}
