#include "core/cuda_loops.cuh"
#include "ops/mse_loss_kernels.h"

namespace tg {
TG_INSTANTIATE_KERNELS(MseKernels, Device::CUDA);
}
