#include "core/cuda_loops.cuh"
#include "ops/masked_fill_kernels.h"

namespace tg {
TG_INSTANTIATE_KERNELS(MaskedFillKernels, Device::CUDA);
}
