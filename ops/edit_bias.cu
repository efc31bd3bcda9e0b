#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/edit_bias.h"

namespace tg::cuda {

namespace {

// One block per row (h, i) of [H, M, M]: each thread takes four columns
// j0 .. j0+3, sums over the batch (Quad loads of g along j), writes its dE
// quad, and the block reduces the within/cross shares into one value per row.
// Rows and columns past S are written as zeros.
template <class T>
__global__ void edit_bias_backward_kernel(const T* g, const T* e, T* dE, T* within_rows, T* cross_rows,
                                          EditBiasDims d, bool vector) {
  const int64_t row = blockIdx.x, h = row / d.M, i = row % d.M;
  T within = 0, cross = 0;
  for (int64_t j0 = 4 * threadIdx.x; j0 < d.M; j0 += 4 * blockDim.x) {
    const EditBiasGradQuad<T> r = edit_bias_grad_quad(g, e, d, h, i, j0, vector);
    store_edit_bias_quad(dE + row * d.M, j0, r.dE, d.M, vector);
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
  const bool vector = edit_bias_backward_vector(g, dE, d);
  const int threads = d.M <= 4 * 128 ? 128 : 256;
  TG_DISPATCH_FLOAT(g.dtype(), T, [&] {
    edit_bias_backward_kernel<<<static_cast<unsigned>(d.H * d.M), threads, 0, stream()>>>(
        g.data<T>(), e.data<T>(), dE.data<T>(), within_rows.data<T>(), cross_rows.data<T>(), d, vector);
  });
  check_launch("edit_bias_backward");
}

}  // namespace tg::cuda
