// bench/cpu_matmul: the CPU's products (ops/matmul.cpp, Eigen's GEMM) at the
// toy model's sizes: a batch of attention's per-head products (32 x 2 of
// 64 x 64 x 64, run one product per thread), and one linear layer's product
// x W^T (2048 x 128 by 128 x 384, W read transposed in place, on Eigen's own
// threads). The peer is Eigen on the same inputs in the same run, called as
// a user would: the batch one product after another, the linear layer as
// one product of maps. The floor is the flops at the rate of a large
// product (1024^3 on Eigen's threads) measured here.
//
// Method: bench/cpu_timing.h (10 warm-up runs, 50 timed runs, the caches
// flushed before each, the median).
//
// Usage: cpu_matmul
#include <Eigen/Core>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench/cpu_timing.h"
#include "core/cpu_loops.h"
#include "tapegrad.h"

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMajor>;
using Map = Eigen::Map<RowMajor>;

}  // namespace

int main() {
  tg::NoGradGuard no_grad;
  const int64_t big = 1024;
  const RowMajor pa = RowMajor::Random(big, big), pb = RowMajor::Random(big, big);
  RowMajor pc(big, big);
  const double peak_gflops = 2.0 * big * big * big / (tgbench::cpu_median_us([&] { pc.noalias() = pa * pb; }) * 1e3);

  const int64_t batch = 32 * 2, S = 64, D = 64, rows = 2048, in = 128, out = 384;
  const tg::Tensor q = tg::randn({32, 2, S, D}), kt = tg::randn({32, 2, D, S});
  const tg::Tensor x = tg::randn({rows, in}), w = tg::randn({out, in});
  std::vector<float> scores(static_cast<size_t>(batch * S * S)), y(static_cast<size_t>(rows * out));
  struct Case {
    const char* name;
    double flops;
    std::function<void()> tapegrad, eigen;
  };
  const std::vector<Case> cases = {
      {"batch of 64 x (64x64 @ 64x64)", 2.0 * batch * S * S * D, [&] { tg::matmul(q, kt); },
       [&] {
         for (int64_t i = 0; i < batch; ++i)
           Map(scores.data() + i * S * S, S, S).noalias() =
               ConstMap(q.data<float>() + i * S * D, S, D) * ConstMap(kt.data<float>() + i * D * S, D, S);
       }},
      {"x W^T, 2048x128 @ (384x128)^T", 2.0 * rows * in * out, [&] { tg::matmul(x, w.transpose(0, 1)); },
       [&] {
         Map(y.data(), rows, out).noalias() =
             ConstMap(x.data<float>(), rows, in) * ConstMap(w.data<float>(), out, in).transpose();
       }},
  };
  std::printf("cpu_matmul: %d threads; a 1024^3 product at %.1f GFLOP/s (the floor's rate)\n", tg::cpu::threads(),
              peak_gflops);
  std::printf("%-32s %12s %10s %12s %8s %10s\n", "case", "tapegrad us", "Eigen us", "Eigen/tg", "GFLOP/s", "of peak");
  for (const Case& c : cases) {
    const double t = tgbench::cpu_median_us(c.tapegrad), e = tgbench::cpu_median_us(c.eigen);
    const double gflops = c.flops / (t * 1e3);
    std::printf("%-32s %12.1f %10.1f %12.2f %8.1f %9.0f%%\n", c.name, t, e, e / t, gflops, 100 * gflops / peak_gflops);
  }
}
