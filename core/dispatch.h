// Device dispatch. Each op declares its kernel entry points once, as static
// members of a class template over the device (e.g. SoftmaxKernels<D>).
// Members whose code differs by device are defined as explicit
// specialisations, Kernels<Device::CPU>::fn in op.cpp and
// Kernels<Device::CUDA>::fn in op.cu; generic members are defined once in the
// op's kernels header against Loop<D> and instantiated by one line in each.
// TG_DISPATCH_DEVICE(t, Kernels, fn, args...) calls Kernels<t's device>::fn(args...).
#pragma once
#include "core/device.h"
#include "core/error.h"

namespace tg {

template <class R = void>
[[noreturn]] R no_cuda_backend() {
  TG_FAIL("tapegrad was built without CUDA (configure with -DTG_CUDA=ON)");
}

// The parallel loop of a device: cpu_loops.h defines Loop<Device::CPU>,
// cuda_loops.cuh Loop<Device::CUDA>. Generic kernels are written once against it.
template <Device D>
struct Loop;

}  // namespace tg

#ifdef TG_CUDA
#define TG_DISPATCH_DEVICE(t, Kernels, fn, ...)                                     \
  ((t).is_cuda() ? Kernels<::tg::Device::CUDA>::fn(__VA_ARGS__)                      \
                 : Kernels<::tg::Device::CPU>::fn(__VA_ARGS__))
#else
#define TG_DISPATCH_DEVICE(t, Kernels, fn, ...)                                          \
  ((t).is_cuda() ? ::tg::no_cuda_backend<decltype(Kernels<::tg::Device::CPU>::fn(__VA_ARGS__))>() \
                 : Kernels<::tg::Device::CPU>::fn(__VA_ARGS__))
#endif

// In an op's kernels header, after the class template: the C++ translation
// units that dispatch never instantiate Kernels<Device::CUDA> themselves (they
// cannot compile CUDA); op.cu does, after its device-specific members.
#ifdef __CUDACC__
#define TG_EXTERN_CUDA_KERNELS(Kernels) static_assert(true)
#else
#define TG_EXTERN_CUDA_KERNELS(Kernels) extern template struct Kernels<::tg::Device::CUDA>
#endif
// In op.cpp / op.cu, after the device-specific members: the generic ones for `device`.
#define TG_INSTANTIATE_KERNELS(Kernels, device) template struct Kernels<device>
