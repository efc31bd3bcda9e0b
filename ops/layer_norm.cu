#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/layer_norm_kernels.h"

namespace tg::cuda {

namespace {

// Mean sweep, variance sweep (around the mean: no cancellation), write sweep;
// with the row in registers (K > 0) x is read from memory once.
template <class T, int K>
__global__ void layer_norm_forward_kernel(const T* x, const T* w, const T* b, T eps, T* y, T* mean, T* rstd,
                                          LayerNormDims d) {
  after_previous_kernels();
  const int64_t row = warp_row();
  if (row >= d.rows) return;
  WarpRow<T, K> r{x + row * d.cols, d.cols, static_cast<int>(threadIdx.x % 32)};
  T sum = 0;
  r.sweep([&](int k, int64_t j) { sum += r.load(k, j); });
  const T mu = warp_sum(sum) / T(d.cols);
  T sq = 0;
  r.sweep([&](int k, int64_t j) { sq += (r.get(k, j) - mu) * (r.get(k, j) - mu); });
  const T rs = T(1) / sqrt(warp_sum(sq) / T(d.cols) + eps);
  r.sweep([&](int k, int64_t j) {
    y[row * d.cols + j] = (r.get(k, j) - mu) * rs * (w ? w[j] : T(1)) + (b ? b[j] : T(0));
  });
  if (r.lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// dx = rstd (gw - mean(gw) - xh mean(gw xh)), gw = g w: a sums sweep, a write sweep.
template <class T, int K>
__global__ void layer_norm_backward_kernel(const T* x, const T* w, const T* mean, const T* rstd, const T* g, T* gx,
                                           LayerNormDims d) {
  after_previous_kernels();
  const int64_t row = warp_row();
  if (row >= d.rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  WarpRow<T, K> xr{x + row * d.cols, d.cols, lane}, gr{g + row * d.cols, d.cols, lane};
  const T mu = mean[row], rs = rstd[row];
  T sum_gw = 0, sum_gw_xh = 0;
  xr.sweep([&](int k, int64_t j) {
    const T gw = gr.load(k, j) * (w ? w[j] : T(1));
    sum_gw += gw;
    sum_gw_xh += gw * (xr.load(k, j) - mu) * rs;
  });
  const T mean_gw = warp_sum(sum_gw) / T(d.cols), mean_gw_xh = warp_sum(sum_gw_xh) / T(d.cols);
  xr.sweep([&](int k, int64_t j) {
    const T gw = gr.get(k, j) * (w ? w[j] : T(1)), xh = (xr.get(k, j) - mu) * rs;
    gx[row * d.cols + j] = rs * (gw - mean_gw - xh * mean_gw_xh);
  });
}

}  // namespace

}  // namespace tg::cuda

namespace tg {

template <>
void LayerNormKernels<Device::CUDA>::forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps,
                                             const Tensor& y, const Tensor& mean, const Tensor& rstd, LayerNormDims d) {
  using namespace cuda;
  if (d.rows == 0) return;
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    // K = 32 takes 125 registers here (2 blocks per SM): rows over 512 stream instead.
    with_row_registers<16>(d.cols, [&](auto k) {
      launch("layer_norm", layer_norm_forward_kernel<T, decltype(k)::value>, row_blocks(d.rows), 32 * kRowsPerBlock, 0,
             x.data<T>(), data_or_null<T>(w), data_or_null<T>(b), static_cast<T>(eps), y.data<T>(), mean.data<T>(),
             rstd.data<T>(), d);
    });
  });
}

template <>
void LayerNormKernels<Device::CUDA>::backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                              const Tensor& g, const Tensor& gx, const Tensor& dw, const Tensor& db,
                                              LayerNormDims d) {
  using namespace cuda;
  if (d.rows == 0) return;
  if (gx.defined()) TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    with_row_registers(d.cols, [&](auto k) {
      launch("layer_norm_backward", layer_norm_backward_kernel<T, decltype(k)::value>, row_blocks(d.rows),
             32 * kRowsPerBlock, 0, x.data<T>(), data_or_null<T>(w), mean.data<T>(), rstd.data<T>(), g.data<T>(),
             gx.data<T>(), d);
    });
  });
  layer_norm_param_grad_with(Loop<Device::CUDA>{"layer_norm_backward"}, x, g, mean, rstd, dw, db, d);
}

}  // namespace tg
