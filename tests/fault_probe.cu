// A kernel that faults on purpose, for the test of the sync-debug mode
// (tests/test_cuda_ops.cpp runs it in a child process).
#include "core/cuda_context.h"

namespace tgtest {

namespace {
// Waits ~50 ms first, so that the launch has surely returned when it faults.
__global__ void write_through_a_wild_pointer(float* p) {
  for (int i = 0; i < 50; ++i) __nanosleep(1000000);
  p[threadIdx.x] = 1.0f;
}
}  // namespace

void launch_faulting_kernel() {
  write_through_a_wild_pointer<<<1, 32, 0, tg::cuda::stream()>>>(reinterpret_cast<float*>(0x10));
  tg::cuda::check_launch("fault_probe");
}

}  // namespace tgtest
