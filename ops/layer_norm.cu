#include "core/cuda_loops.cuh"
#include "core/cuda_reduce.cuh"
#include "ops/layer_norm.h"

namespace tg::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row

template <class T>
__global__ void layer_norm_forward_kernel(const T* x, const T* w, const T* b, T eps, T* y, T* mean, T* rstd,
                                          LayerNormDims d) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= d.rows) return;
  const T* xr = x + row * d.cols;
  T sum = 0;
  for (int64_t c = lane; c < d.cols; c += 32) sum += xr[c];
  const T mu = warp_sum(sum) / T(d.cols);
  T sq = 0;  // second pass over the (cached) row: no cancellation in the variance
  for (int64_t c = lane; c < d.cols; c += 32) sq += (xr[c] - mu) * (xr[c] - mu);
  const T rs = T(1) / sqrt(warp_sum(sq) / T(d.cols) + eps);
  for (int64_t c = lane; c < d.cols; c += 32)
    y[row * d.cols + c] = (xr[c] - mu) * rs * (w ? w[c] : T(1)) + (b ? b[c] : T(0));
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

template <class T>
__global__ void layer_norm_backward_kernel(const T* x, const T* w, const T* mean, const T* rstd, const T* g, T* gx,
                                           LayerNormDims d) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= d.rows) return;
  const int64_t base = row * d.cols;
  const T mu = mean[row], rs = rstd[row];
  T sum_gw = 0, sum_gw_xh = 0;
  for (int64_t c = lane; c < d.cols; c += 32) {
    const T gw = g[base + c] * (w ? w[c] : T(1));
    sum_gw += gw;
    sum_gw_xh += gw * (x[base + c] - mu) * rs;
  }
  const T mean_gw = warp_sum(sum_gw) / T(d.cols), mean_gw_xh = warp_sum(sum_gw_xh) / T(d.cols);
  for (int64_t c = lane; c < d.cols; c += 32) {
    const T gw = g[base + c] * (w ? w[c] : T(1)), xh = (x[base + c] - mu) * rs;
    gx[base + c] = rs * (gw - mean_gw - xh * mean_gw_xh);
  }
}

int row_blocks(int64_t rows) { return static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

template <class T>
const T* optional_data(const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, LayerNormDims d) {
  if (d.rows == 0) return;
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    layer_norm_forward_kernel<<<row_blocks(d.rows), 32 * kRowsPerBlock, 0, stream()>>>(
        x.data<T>(), optional_data<T>(w), optional_data<T>(b), static_cast<T>(eps), y.data<T>(), mean.data<T>(),
        rstd.data<T>(), d);
  });
  check_launch("layer_norm");
}

void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& g,
                         const Tensor& gx, const Tensor& dw, const Tensor& db, LayerNormDims d) {
  if (d.rows == 0) return;
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    layer_norm_backward_kernel<<<row_blocks(d.rows), 32 * kRowsPerBlock, 0, stream()>>>(
        x.data<T>(), optional_data<T>(w), mean.data<T>(), rstd.data<T>(), g.data<T>(), gx.data<T>(), d);
  });
  check_launch("layer_norm_backward");
  layer_norm_param_grad_with(Loop{"layer_norm_backward"}, x, g, mean, rstd, dw, db, d);
}

}  // namespace tg::cuda
