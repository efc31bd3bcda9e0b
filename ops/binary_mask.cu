#include "core/cuda_loops.cuh"
#include "ops/binary_mask_kernels.h"

namespace tg {
TG_INSTANTIATE_KERNELS(BinaryMaskKernels, Device::CUDA);
}
