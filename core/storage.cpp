#include "core/storage.h"

#include <cstdlib>
#include <new>

#include "core/dispatch.h"
#include "core/error.h"
#ifdef TG_CUDA
#include "core/cuda_allocator.h"
#endif

namespace tg {

namespace {
constexpr std::size_t kCpuAlignment = 64;
}

bool built_with_cuda() {
#ifdef TG_CUDA
  return true;
#else
  return false;
#endif
}

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device == Device::CPU) {
    const std::size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    data_ = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
    if (!data_) throw std::bad_alloc();
    return;
  }
#ifdef TG_CUDA
  data_ = cuda::allocate(nbytes);
#else
  no_cuda_backend();
#endif
}

Storage::~Storage() {
  if (device_ == Device::CPU) {
    std::free(data_);
    return;
  }
#ifdef TG_CUDA
  cuda::deallocate(data_);
#endif
}

}  // namespace tg
