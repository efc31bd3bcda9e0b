// Kernel launches that overlap the gap between kernels: programmatic
// dependent launch (compute capability 9.0). A kernel launched by launch()
// may be dispatched as soon as every block of the kernel before it in the
// stream has exited, before that kernel's completion is signalled: its
// blocks become resident and park in after_previous_kernels(), which returns
// once that kernel has completed and its writes are visible. The dispatch
// and the block start-up then overlap the previous kernel's drain instead of
// following it (bench/NOTES.md version 50: the training step 1.5-4.5% faster).
//
// The contract: every kernel launched through launch() calls
// after_previous_kernels() before it reads or writes global memory. Every
// kernel of the library does, first thing, and every launch in ops/ and
// core/ goes through launch() but one that may not throw (test "sources/every
// library kernel waits for the kernels before it" reads the sources).
#pragma once
#include <utility>

#include "core/cuda.h"
#include "core/cuda_context.h"

namespace tg::cuda {

// Waits for the kernels before this one in the stream (griddepcontrol.wait).
// Launched without the attribute (off, or before compute capability 9.0) it
// returns at once. Kernels do not signal their dependents early
// (griddepcontrol.launch_dependents): the next kernel's blocks would then
// hold SMs while they wait, which cost the benchmark interface 1.4% beside
// its side streams (NOTES version 50).
__device__ __forceinline__ void after_previous_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether launch() asks for the overlap: the setting and a device that has it.
inline bool launch_overlaps() { return overlapped_launch_enabled() && context().major >= 9; }

// kernel<<<grid, block, shared_bytes, stream()>>>(args...), overlapping the
// kernel before it (above), with launch errors raised against `op`.
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
  config.numAttrs = launch_overlaps() ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), op, "cudaLaunchKernelEx");
  check_launch(op);
}

}  // namespace tg::cuda
