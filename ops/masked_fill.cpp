#include "ops/masked_fill.h"

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "ops/masked_fill_kernels.h"
#include "ops/untracked.h"

namespace tg {

TG_INSTANTIATE_KERNELS(MaskedFillKernels, Device::CPU);

namespace {
Tensor masked_fill_untracked(const Tensor& x, const Tensor& mask, double value) {
  if (mask.dtype() != x.dtype()) {  // nonzeros made 1 in the mask's own dtype first: cast as is, 1e-50 is 0 in float
    const Tensor ones_where = masked_fill_untracked(zeros(mask.shape(), {mask.dtype(), mask.device()}), mask, 1.0);
    return masked_fill_untracked(x, ones_where.to(x.dtype()), value);
  }
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  const Tensor m = broadcast_view("masked_fill", mask, x.shape());
  TG_DISPATCH_DEVICE(x, MaskedFillKernels, masked_fill, x, m, value, out);
  return out;
}
}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined("masked_fill", "x", x);
  check_defined("masked_fill", "mask", mask);
  TG_CHECK(x.device() == mask.device(), "masked_fill: x ", x.shape(), " is on ", x.device(),
           " but mask ", mask.shape(), " is on ", mask.device());
  TG_CHECK(broadcast_shapes("masked_fill", x.shape(), mask.shape()) == x.shape(), "masked_fill: mask ",
           mask.shape(), " does not broadcast to x ", x.shape());
  Tensor out = masked_fill_untracked(x, mask, value);
  return autograd::record(OpId::masked_fill, out, {x}, {mask.detach()}, [](const Tensor& g, const auto& s, const auto&) {
    return std::vector<Tensor>{masked_fill_untracked(g, s[0], 0.0)};
  });
}

}  // namespace tg
