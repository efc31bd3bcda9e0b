#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/edit_bias_kernels.h"

namespace tg::cuda {

namespace {

// One warp per row (h, i) of [H, M, M]: each lane takes quads of columns
// j0 .. j0+3, sums over the batch (Quad loads of g along j), writes its dE
// quad; a warp shuffle then reduces the within/cross shares into one value per
// row, with no block barrier. Rows and columns past S are written as zeros.
template <class T>
__global__ void edit_bias_backward_kernel(const T* g, const T* e, T* dE, T* within_rows, T* cross_rows,
                                          EditBiasDims d, bool vector) {
  after_previous_kernels();
  const int64_t row = warp_row();
  if (row >= d.H * d.M) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t h = row / d.M, i = row % d.M;
  T within = 0, cross = 0;
  for (int64_t j0 = 4 * lane; j0 < d.M; j0 += 4 * 32) {
    const EditBiasGradQuad<T> r = edit_bias_grad_quad(g, e, d, h, i, j0, vector);
    store_edit_bias_quad(dE ? dE + row * d.M : nullptr, j0, r.dE, d.M, vector);
    within += r.within;
    cross += r.cross;
  }
  within = warp_sum(within);
  cross = warp_sum(cross);
  if (lane == 0) {
    within_rows[row] = within;
    cross_rows[row] = cross;
  }
}

}  // namespace

}  // namespace tg::cuda

namespace tg {

template <>
void EditBiasKernels<Device::CUDA>::backward(const Tensor& g, const Tensor& e, const Tensor& dE,
                                             const Tensor& within_rows, const Tensor& cross_rows, EditBiasDims d) {
  using namespace cuda;
  if (d.H * d.M == 0) return;
  const bool vector = edit_bias_quads_fit(d, g, dE);
  TG_DISPATCH_FLOAT(g.dtype(), T, [&] {
    launch("edit_bias_backward", edit_bias_backward_kernel<T>, row_blocks(d.H * d.M), 32 * kRowsPerBlock, 0, g.data<T>(),
           e.data<T>(), data_or_null<T>(dE), within_rows.data<T>(), cross_rows.data<T>(), d, vector);
  });
}

TG_INSTANTIATE_KERNELS(EditBiasKernels, Device::CUDA);

}  // namespace tg
