#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/edit_bias.h"

namespace tg::cuda {

namespace {

// One block per row (h, i) of [H, M, M]: threads sweep j, each summing over the
// batch (coalesced reads of g along j); the block then reduces its within/cross
// partials into one value per row. Rows and columns past S are written as zeros.
template <class T>
__global__ void edit_bias_backward_kernel(const T* g, const T* e, T* dE, T* within_rows, T* cross_rows,
                                          EditBiasDims d) {
  const int64_t row = blockIdx.x, h = row / d.M, i = row % d.M;
  T within = 0, cross = 0;
  for (int64_t j = threadIdx.x; j < d.M; j += blockDim.x) {
    const EditBiasGradAt<T> r = edit_bias_grad_at(g, e, d, h, i, j);
    dE[row * d.M + j] = r.dE;
    within += r.within;
    cross += r.cross;
  }
  within = block_sum(within);
  cross = block_sum(cross);
  if (threadIdx.x == 0) {
    within_rows[row] = within;
    cross_rows[row] = cross;
  }
}

}  // namespace

void edit_bias_forward(const Tensor& E, const Tensor& within, const Tensor& cross, const Tensor& e, const Tensor& out,
                       EditBiasDims d) {
  edit_bias_forward_with(Loop{"edit_bias"}, E, within, cross, e, out, d);
}

void edit_bias_backward(const Tensor& g, const Tensor& e, const Tensor& dE, const Tensor& within_rows,
                        const Tensor& cross_rows, EditBiasDims d) {
  if (d.H * d.M == 0) return;
  TG_DISPATCH_FLOAT(g.dtype(), T, [&] {
    edit_bias_backward_kernel<<<static_cast<unsigned>(d.H * d.M), 256, 0, stream()>>>(
        g.data<T>(), e.data<T>(), dE.data<T>(), within_rows.data<T>(), cross_rows.data<T>(), d);
  });
  check_launch("edit_bias_backward");
}

}  // namespace tg::cuda
