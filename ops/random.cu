#include "core/cuda_loops.cuh"
#include "ops/random_kernels.h"

namespace tg {
TG_INSTANTIATE_KERNELS(RandomKernels, Device::CUDA);
}
