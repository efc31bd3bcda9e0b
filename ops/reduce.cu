#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/reduce.h"

namespace tg::cuda {

namespace {

// One block per row (grid-stride over rows), a block-wide shuffle reduction.
template <class T>
__global__ void sum_rows_kernel(const T* x, T* out, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T acc = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc += x[r * cols + j];
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[r] = acc;
  }
}

}  // namespace

void sum_rows(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  const int threads = cols <= 32 ? 32 : cols <= 128 ? 128 : 256;
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 65535));
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    sum_rows_kernel<<<blocks, threads, 0, stream()>>>(x.data<T>(), out.data<T>(), rows, cols);
  });
  check_launch("sum");
}

}  // namespace tg::cuda
