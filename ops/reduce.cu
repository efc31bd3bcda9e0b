#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/reduce_kernels.h"

namespace tg::cuda {

namespace {

// Segment s of a row split into `chunks` pieces: block s sums its piece with a
// block-wide shuffle reduction. chunks = 1 is one block per row.
template <class T>
__global__ void sum_segments_kernel(const T* x, T* out, int64_t rows, int64_t cols, int64_t chunks) {
  after_previous_kernels();
  const int64_t piece = (cols + chunks - 1) / chunks;
  for (int64_t s = blockIdx.x; s < rows * chunks; s += gridDim.x) {
    const int64_t r = s / chunks, first = (s % chunks) * piece, last = min(cols, first + piece);
    T acc = 0;
    for (int64_t j = first + threadIdx.x; j < last; j += blockDim.x) acc += x[r * cols + j];
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[s] = acc;
  }
}

// Many short rows: one warp per row.
template <class T>
__global__ void sum_rows_warp_kernel(const T* x, T* out, int64_t rows, int64_t cols) {
  after_previous_kernels();
  const int64_t r = warp_row();
  if (r >= rows) return;
  T acc = 0;
  for (int64_t j = threadIdx.x % 32; j < cols; j += 32) acc += x[r * cols + j];
  acc = warp_sum(acc);
  if (threadIdx.x % 32 == 0) out[r] = acc;
}

template <class T>
void sum_rows_typed(const T* x, T* out, int64_t rows, int64_t cols) {
  const int64_t sms = context().sm_count;
  if (cols <= 1024) {
    launch("sum", sum_rows_warp_kernel<T>, row_blocks(rows), 32 * kRowsPerBlock, 0, x, out, rows, cols);
    return;
  }
  // Few long rows: split each into chunks (>= 4096 elements) so ~4 blocks run per SM, then sum the chunks.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>((4 * sms + rows - 1) / rows, cols / 4096));
  const int blocks = static_cast<int>(std::min<int64_t>(rows * chunks, 65535));
  const Tensor partial = chunks > 1 ? empty({rows, chunks}, {dtype_of<T>(), Device::CUDA}) : Tensor();
  launch("sum", sum_segments_kernel<T>, blocks, 256, 0, x, chunks > 1 ? partial.data<T>() : out, rows, cols, chunks);
  if (chunks == 1) return;
  sum_rows_typed(partial.data<T>(), out, rows, chunks);
}

}  // namespace

}  // namespace tg::cuda

namespace tg {

template <>
void ReduceKernels<Device::CUDA>::sum_rows(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] { cuda::sum_rows_typed(x.data<T>(), out.data<T>(), rows, cols); });
}

TG_INSTANTIATE_KERNELS(ReduceKernels, Device::CUDA);

}  // namespace tg
