// Kernel launches that overlap the gap between kernels: programmatic
// dependent launch (compute capability 9.0). A kernel launched by launch()
// may be dispatched once every block of the kernel before it in the stream
// has exited (or signalled, which the library's kernels never do), before
// that kernel's completion: its blocks become resident and park in
// after_previous_kernels(), which returns once that kernel has completed and
// its writes are visible. The dispatch and the block start-up then overlap
// the previous kernel's drain instead of following it (bench/NOTES.md
// version 50: the training step 1.5-4.5% faster).
//
// The contract: every thread of a kernel launched through launch() calls
// after_previous_kernels() first, unconditionally, before any read, write or
// return. The wait covers only the kernel right before; the one before that
// is complete because that kernel's own threads waited for it before any of
// them could finish. So a thread that returned before waiting would let the
// next kernel run beside an unfinished one. (Nor may a load be hoisted above
// the wait: the library uses no __ldg or const __restrict__ pointers, whose
// non-coherent loads the compiler may move.) Every kernel of the library
// begins so, and every launch in ops/ and core/ goes through launch() (the
// test "sources/every library kernel waits for the kernels before it" reads
// the sources; "cuda/launch: ..." checks on the device that a kernel
// overlaps its predecessor and that the library's kernels wait for theirs).
#pragma once
#include <utility>

#include "core/cuda.h"
#include "core/cuda_context.h"

namespace tg::cuda {

// Waits for the kernel before this one in the stream (griddepcontrol.wait);
// returns at once in a kernel launched without the overlap. Kernels do not
// signal their dependents early (griddepcontrol.launch_dependents): the next
// kernel's blocks would then hold SMs while they wait, which cost the
// benchmark interface 1.4% beside its side streams (NOTES version 50).
__device__ __forceinline__ void after_previous_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared_bytes, stream()>>>(args...), overlapping the
// kernel before it (above) unless the setting is off or the kernel's code on
// this device has no wait (kernel_waits), with launch errors raised against `op`.
template <class... Params, class... Args>
void launch(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Args&&... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream();
  config.attrs = &overlap;
  config.numAttrs = overlapped_launch_enabled() && kernel_waits(reinterpret_cast<const void*>(kernel), op) ? 1 : 0;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (status != cudaSuccess) cudaGetLastError();  // also the thread's last error: cleared, or a later check reports it
  check(status, op, "cudaLaunchKernelEx");
  check_launch(op);
}

}  // namespace tg::cuda
