#include "ops/copy.h"

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "core/dispatch.h"

namespace tg {

void copy_into(const Tensor& dst, const Tensor& src) {
  check_defined("copy_", "dst", dst);
  check_defined("copy_", "src", src);
  TG_CHECK(dst.shape() == src.shape(), "copy_: destination ", dst.shape(), " and source ",
           src.shape(), " differ in shape");
  if (dst.device() == src.device()) {
    TG_DISPATCH_DEVICE(dst, copy_strided, dst, src);
    return;
  }
  // Across devices: stage a contiguous copy of dst's dtype on src's device, move the bytes once.
  Tensor staged_src = materialize(src);
  if (staged_src.dtype() != dst.dtype()) {
    const Tensor cast_src = empty(src.shape(), {dst.dtype(), src.device()});
    TG_DISPATCH_DEVICE(src, copy_strided, cast_src, staged_src);
    staged_src = cast_src;
  }
  const Tensor staged_dst = dst.is_contiguous() ? dst : empty(dst.shape(), {dst.dtype(), dst.device()});
#ifdef TG_CUDA
  cuda::copy_between_devices(staged_dst, staged_src);
#endif
  if (!staged_dst.same_storage(dst)) TG_DISPATCH_DEVICE(dst, copy_strided, dst, staged_dst);
}

void fill_into(const Tensor& dst, double value) { TG_DISPATCH_DEVICE(dst, fill, dst, value); }

Tensor materialize(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  copy_into(out, x);
  return out;
}

Tensor clone(const Tensor& x) {
  check_defined("clone", "x", x);
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  copy_into(out, x);
  return autograd::record("clone", out, {x}, {}, [](const Tensor& g, const auto&) {
    return std::vector<Tensor>{g};
  });
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", "x", x);
  Tensor out = empty(x.shape(), {dtype, x.device()});
  copy_into(out, x);
  const DType from = x.dtype();
  return autograd::record("cast", out, {x}, {}, [from](const Tensor& g, const auto&) {
    return std::vector<Tensor>{cast(g, from)};
  });
}

Tensor to_device(const Tensor& x, Device device) {
  check_defined("to", "x", x);
  Tensor out = empty(x.shape(), {x.dtype(), device});
  copy_into(out, x);
  const Device from = x.device();
  return autograd::record("to_device", out, {x}, {}, [from](const Tensor& g, const auto&) {
    return std::vector<Tensor>{to_device(g, from)};
  });
}

namespace cpu {
void copy_strided(const Tensor& dst, const Tensor& src) { copy_strided_with(Loop{"copy_"}, dst, src); }
void fill(const Tensor& dst, double value) { fill_with(Loop{"fill_"}, dst, value); }
}  // namespace cpu

}  // namespace tg
