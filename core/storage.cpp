#include "core/storage.h"

#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <new>

#include "core/dispatch.h"
#include "core/error.h"
#ifdef TG_CUDA
#include "core/cuda_allocator.h"
#endif

namespace tg {

namespace {
constexpr std::size_t kCpuAlignment = 64;

// Physical memory: a request beyond it fails here, clearly, instead of being
// overcommitted and killed later (or aborted by a sanitizer's allocator).
std::size_t host_memory_bytes() {
  static const std::size_t bytes =
      static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return bytes;
}
// glibc hands a freed block of 128 KB or more back to the kernel (an mmap'd
// block, or the heap's top trimmed), and the kernel zero-fills its pages again
// at their next first touch: activations freed and allocated anew every
// training step then cost page faults (10% of the main demo's samples; the demo
// 1.6x slower in a CPU-only build, 1.14x in a CUDA build: bench/NOTES.md "CPU
// demo"). From the first CPU tensor on, blocks up to 32 MiB (glibc's largest
// setting) come from the heap and up to 1 GiB of it stays free for reuse, as a
// caching allocator keeps them (the demo's peak resident memory: 161 MB either
// way in a CPU-only build, 348-360 -> 375 MB in a CUDA build, whose libraries
// take ~200 MB of it). A program that wants otherwise may call mallopt after
// that.
void keep_freed_host_memory() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace

bool built_with_cuda() {
#ifdef TG_CUDA
  return true;
#else
  return false;
#endif
}

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device == Device::CPU) {
    TG_CHECK(nbytes <= host_memory_bytes(), "more than the ", host_memory_bytes(), " bytes of host memory");
    static const bool kept = (keep_freed_host_memory(), true);
    (void)kept;
    // Exactly nbytes (not rounded up): AddressSanitizer then sees a write one past the end.
    data_ = ::operator new(std::max<std::size_t>(nbytes, 1), std::align_val_t{kCpuAlignment}, std::nothrow);
    TG_CHECK(data_, "out of host memory");
    return;
  }
#ifdef TG_CUDA
  data_ = cuda::allocate(nbytes);
#else
  no_cuda_backend();
#endif
}

Storage::Storage(void* borrowed, std::size_t nbytes, Device device)
    : data_(borrowed), nbytes_(nbytes), device_(device), owned_(false) {}

Storage::~Storage() {
  if (!owned_) return;
  if (device_ == Device::CPU) {
    ::operator delete(data_, std::align_val_t{kCpuAlignment});
    return;
  }
#ifdef TG_CUDA
  cuda::deallocate(data_);
#endif
}

}  // namespace tg
