#include "ops/binary_mask.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "core/cpu_loops.h"
#include "ops/binary_mask_kernels.h"
#include "ops/reduce.h"

namespace tg {

TG_INSTANTIATE_KERNELS(BinaryMaskKernels, Device::CPU);

void check_binary_mask(const char* op, const char* arg, const Tensor& mask) {
  check_defined(op, arg, mask);
  NoGradGuard no_grad;
  const Tensor marks = empty(mask.shape(), {mask.dtype(), mask.device()});
  TG_DISPATCH_DEVICE(mask, BinaryMaskKernels, mark_non_binary, mask, marks);
  if (marks.numel() == 0 || sum(marks).item() == 0) return;
  const std::vector<double> values = mask.to_vector(), bad = marks.to_vector();
  const size_t i = static_cast<size_t>(std::find(bad.begin(), bad.end(), 1.0) - bad.begin());
  TG_FAIL(op, ": ", arg, " ", mask.shape(), " must hold only 0 and 1; element ", i, " is ", values[i]);
}

}  // namespace tg
