#include "ops/binary_mask.h"

#include <algorithm>
#include <vector>

#include "autograd/grad_mode.h"
#include "ops/binary_mask_kernels.h"

namespace tg {

template <>
void BinaryMaskKernels<Device::CPU>::count_non_binary(const Tensor& mask, const Tensor& counts, int64_t slot) {
  TG_DISPATCH_FLOAT(mask.dtype(), T, [&] {
    const T* m = mask.data<T>();
    counts.data<double>()[slot] += static_cast<double>(std::count_if(m, m + mask.numel(), non_binary<T>));
  });
}

TG_INSTANTIATE_KERNELS(BinaryMaskKernels, Device::CPU);

void check_binary_masks(const char* op, std::initializer_list<NamedMask> masks) {
  if (masks.size() == 0) return;
  for (const NamedMask& m : masks) check_defined(op, m.arg, m.mask);
  NoGradGuard no_grad;
  const Tensor& first = masks.begin()->mask;
  const Tensor counts = zeros({static_cast<int64_t>(masks.size())}, {DType::Float64, first.device()});
  int64_t slot = 0;
  for (const NamedMask& m : masks) {
    TG_CHECK(m.mask.device() == first.device(), op, ": ", m.arg, " is on ", m.mask.device(), ", ",
             masks.begin()->arg, " on ", first.device());
    TG_DISPATCH_DEVICE(m.mask, BinaryMaskKernels, count_non_binary, m.mask.contiguous(), counts, slot++);
  }
  const std::vector<double> found = counts.to_vector();  // the one device sync
  slot = 0;
  for (const NamedMask& m : masks) {
    if (found[slot++] == 0) continue;
    const std::vector<double> values = m.mask.to_vector();
    const auto bad = std::find_if(values.begin(), values.end(), non_binary<double>);
    TG_CHECK(bad != values.end(), op, ": ", m.arg, " ", m.mask.shape(), ": the device counted ", found[slot - 1],
             " elements that are not 0 or 1, the host none (was the mask written meanwhile?)");
    TG_FAIL(op, ": ", m.arg, " ", m.mask.shape(), " must hold only 0 and 1; element ", bad - values.begin(), " is ",
            *bad);
  }
}

void check_binary_mask(const char* op, const char* arg, const Tensor& mask) { check_binary_masks(op, {{arg, mask}}); }

}  // namespace tg
