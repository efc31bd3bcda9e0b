#include "ops/copy.h"

#include "autograd/engine.h"
#include "core/cpu_loops.h"
#include "core/pack.h"
#include "ops/copy_kernels.h"
#include "ops/untracked.h"

namespace tg {

TG_INSTANTIATE_KERNELS(CopyKernels, Device::CPU);

std::pair<const char*, const char*> byte_range(const Tensor& t) {
  check_defined("byte_range", "t", t);
  const ElementSpan s = element_span(t.shape(), t.strides(), 0);
  const char* base = static_cast<const char*>(t.raw_data());
  const int64_t elem = static_cast<int64_t>(element_size(t.dtype()));
  return {base + s.begin * elem, base + s.end * elem};
}

namespace {

// A contiguous copy of x on its device.
Tensor copy_of(const Tensor& x) {
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  TG_DISPATCH_DEVICE(x, CopyKernels, copy_strided, out, x);
  return out;
}

}  // namespace

void copy_into(const Tensor& dst, const Tensor& src_in) {
  check_defined("copy_", "dst", dst);
  check_defined("copy_", "src", src_in);
  TG_CHECK(dst.shape() == src_in.shape(), "copy_: destination ", dst.shape(), " and source ", src_in.shape(),
           " differ in shape");
  // A source that overlaps the destination would be read after being partly overwritten.
  const Tensor src = bytes_overlap(dst, src_in) ? copy_of(src_in) : src_in;
  if (dst.device() == src.device()) {
    TG_DISPATCH_DEVICE(dst, CopyKernels, copy_strided, dst, src);
    return;
  }
  // Across devices: stage a contiguous copy of dst's dtype on src's device, move the bytes once.
  Tensor staged_src = materialize(src);
  if (staged_src.dtype() != dst.dtype()) {
    const Tensor cast_src = empty(src.shape(), {dst.dtype(), src.device()});
    TG_DISPATCH_DEVICE(src, CopyKernels, copy_strided, cast_src, staged_src);
    staged_src = cast_src;
  }
  const Tensor staged_dst = dst.is_contiguous() ? dst : empty(dst.shape(), {dst.dtype(), dst.device()});
#ifdef TG_CUDA
  cuda::copy_between_devices(staged_dst, staged_src);
#else
  no_cuda_backend();  // unreachable: without CUDA no tensor is on the GPU (empty and from_blob refuse one)
#endif
  if (!staged_dst.same_storage(dst)) TG_DISPATCH_DEVICE(dst, CopyKernels, copy_strided, dst, staged_dst);
}

void fill_into(const Tensor& dst, double value) { TG_DISPATCH_DEVICE(dst, CopyKernels, fill, dst, value); }

Tensor materialize(const Tensor& x) { return x.is_contiguous() ? x : copy_of(x); }
Tensor materialize_aligned(const Tensor& x) {
  return x.is_contiguous() && aligned16(x.raw_data()) ? x : copy_of(x);
}

bool bytes_overlap(const Tensor& a, const Tensor& b) {
  if (a.device() != b.device() || a.numel() == 0 || b.numel() == 0) return false;
  const auto [a0, a1] = byte_range(a);
  const auto [b0, b1] = byte_range(b);
  return a0 < b1 && b0 < a1;
}

Tensor clone(const Tensor& x) {
  check_defined("clone", "x", x);
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  copy_into(out, x);
  return autograd::record(OpId::clone, out, {x}, {}, [](const Tensor& g, const auto&, const auto&) {
    return std::vector<Tensor>{g};
  });
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", "x", x);
  Tensor out = empty(x.shape(), {dtype, x.device()});
  copy_into(out, x);
  const DType from = x.dtype();
  return autograd::record(OpId::cast, out, {x}, {}, [from](const Tensor& g, const auto&, const auto&) {
    return std::vector<Tensor>{cast(g, from)};
  });
}

Tensor to_device(const Tensor& x, Device device) {
  check_defined("to", "x", x);
  Tensor out = empty(x.shape(), {x.dtype(), device});
  copy_into(out, x);
  const Device from = x.device();
  return autograd::record(OpId::to_device, out, {x}, {}, [from](const Tensor& g, const auto&, const auto&) {
    return std::vector<Tensor>{to_device(g, from)};
  });
}

}  // namespace tg
