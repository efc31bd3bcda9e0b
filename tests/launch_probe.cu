// Probes of overlapped launches (core/cuda_launch.cuh) for the test "cuda/launch: ...":
// a kernel that lets the next one start at once and writes only later, and
// a kernel that does not wait for the one before it.
#include "core/cuda_launch.cuh"

namespace tgtest {

namespace {
// Nanoseconds on the device's global timer.
__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Signals its dependents first (griddepcontrol.launch_dependents: a kernel
// launched with the overlap may start at once), then writes `value` into
// x[0 .. n) 20 ms later (by the global timer: __nanosleep may sleep for
// any time up to twice what it is asked).
__global__ void write_late_kernel(float* x, int64_t n, float value) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  const uint64_t start = global_ns();
  while (global_ns() - start < 20000000) __nanosleep(100000);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) x[i] = value;
}

// out = x, read at once: no after_previous_kernels().
__global__ void copy_without_waiting_kernel(const float* x, float* out, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = x[i];
}
}  // namespace

void write_late(float* x, int64_t n, float value) {
  write_late_kernel<<<1, 256, 0, tg::cuda::stream()>>>(x, n, value);
  tg::cuda::check_launch("launch probe (late write)");
}

void copy_without_waiting(const float* x, float* out, int64_t n) {
  tg::cuda::launch("launch probe (copy)", copy_without_waiting_kernel, 1, 256, 0, x, out, n);
}

void launch_too_many_threads(const float* x, float* out, int64_t n) {
  tg::cuda::launch("launch probe (2048 threads)", copy_without_waiting_kernel, 1, 2048, 0, x, out, n);
}

}  // namespace tgtest
