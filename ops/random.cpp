#include "ops/random.h"

#include "core/cpu_loops.h"
#include "ops/random_kernels.h"

namespace tg {

TG_INSTANTIATE_KERNELS(RandomKernels, Device::CPU);

namespace {
void check_fill_target(const char* op, const Tensor& dst) {
  check_defined(op, "dst", dst);
  TG_CHECK(dst.is_contiguous(), op, ": dst ", dst.shape(), " with strides ", dst.strides(), " is not contiguous");
}
}  // namespace

void fill_uniform_into(const Tensor& dst, PhiloxState state) {
  check_fill_target("fill_uniform_into", dst);
  if (dst.numel() > 0) TG_DISPATCH_DEVICE(dst, RandomKernels, uniform, dst, state);
}

void fill_normal_into(const Tensor& dst, PhiloxState state) {
  check_fill_target("fill_normal_into", dst);
  if (dst.numel() > 0) TG_DISPATCH_DEVICE(dst, RandomKernels, normal, dst, state);
}

}  // namespace tg
