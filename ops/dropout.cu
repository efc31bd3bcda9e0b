#include "core/cuda_loops.cuh"
#include "ops/dropout_kernels.h"

namespace tg {
TG_INSTANTIATE_KERNELS(DropoutKernels, Device::CUDA);
}
