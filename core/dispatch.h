// Device dispatch: each op declares the same kernel entry point in namespace
// tg::cpu and tg::cuda; TG_DISPATCH_DEVICE(t, fn, args...) calls the one for t's device.
#pragma once
#include "core/error.h"

namespace tg {
template <class R = void>
R no_cuda_backend() {
  TG_FAIL("tapegrad was built without CUDA (configure with -DTG_CUDA=ON)");
}
}  // namespace tg

#ifdef TG_CUDA
#define TG_DISPATCH_DEVICE(t, fn, ...) \
  ((t).is_cuda() ? ::tg::cuda::fn(__VA_ARGS__) : ::tg::cpu::fn(__VA_ARGS__))
#else
#define TG_DISPATCH_DEVICE(t, fn, ...)                                                    \
  ((t).is_cuda() ? ::tg::no_cuda_backend<decltype(::tg::cpu::fn(__VA_ARGS__))>()          \
                 : ::tg::cpu::fn(__VA_ARGS__))
#endif
