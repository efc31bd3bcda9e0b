// bench/cpu_maps: the CPU's elementwise maps (core/cpu_loops.h) at the toy
// model's activation size (32 x 64 x 128 floats) in the three ways its
// operands are read: both contiguous, one broadcast along a dim, and a
// permuted view copied out; and GELU, the MLP's activation, whose tanh runs
// in lanes of Eigen arrays (ops/elementwise.cpp). The peer is Eigen (the
// CPU backend's library) doing the same work on the same inputs in the same
// run, single-threaded as Eigen's coefficient-wise expressions are; the floor
// is the bytes each case must move at the copy bandwidth measured here (one
// tensor copied cold by std::memcpy on each of tapegrad's threads).
//
// Method: bench/cpu_timing.h (10 warm-up runs, 50 timed runs, the caches
// flushed before each, the median).
//
// Usage: cpu_maps
#include <Eigen/Core>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "bench/cpu_timing.h"
#include "core/cpu_loops.h"
#include "ops/elementwise_kernels.h"
#include "tapegrad.h"

namespace {

using tgbench::cpu_median_us;
using tg::cpu::threads;
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

}  // namespace

int main() {
  tg::NoGradGuard no_grad;
  const int64_t B = 32, S = 64, C = 128, n = B * S * C;
  const tg::Tensor a = tg::randn({B, S, C}), b = tg::randn({B, S, C}), row = tg::randn({B, 1, C});
  const tg::Tensor permuted = tg::randn({B, C, S}).permute({0, 2, 1});  // [B, S, C], inner stride S
  std::vector<float> out(static_cast<size_t>(n)), source(static_cast<size_t>(n), 1.f);
  // The floor's bandwidth: one tensor copied cold, a memcpy per thread, as tapegrad's maps run.
  const int64_t chunk = (n + threads() - 1) / threads();
  const auto copy = [&] {
#pragma omp parallel for
    for (int64_t c = 0; c < n; c += chunk)
      std::memcpy(out.data() + c, source.data() + c, static_cast<size_t>(std::min(chunk, n - c)) * 4);
  };
  const double copy_gbs = 8.0 * double(n) / (cpu_median_us(copy) * 1e3);
  const auto* pa = a.data<float>();
  const auto* pb = b.data<float>();
  const auto* prow = row.data<float>();
  const auto* pperm = permuted.data<float>();  // the storage of the [B, C, S] tensor
  struct Case {
    const char* name;
    double bytes;  // compulsory: each input read once, the output written once
    std::function<void()> tapegrad, eigen;
  };
  const std::vector<Case> cases = {
      {"add, both contiguous", 12.0 * double(n), [&] { tg::add(a, b); },
       [&] {
         Eigen::Map<Eigen::ArrayXf>(out.data(), n) =
             Eigen::Map<const Eigen::ArrayXf>(pa, n) + Eigen::Map<const Eigen::ArrayXf>(pb, n);
       }},
      {"add, [B,1,C] broadcast over S", 8.0 * double(n) + 4.0 * double(B * C), [&] { tg::add(a, row); },
       [&] {
         for (int64_t i = 0; i < B; ++i)  // column-major [C, S] blocks: each column is a token
           Eigen::Map<Eigen::ArrayXXf>(out.data() + i * S * C, C, S) =
               Eigen::Map<const Eigen::ArrayXXf>(pa + i * S * C, C, S).colwise() +
               Eigen::Map<const Eigen::ArrayXf>(prow + i * C, C);
       }},
      {"gelu, contiguous", 8.0 * double(n), [&] { tg::gelu(a); },
       [&] {
         const auto x = Eigen::Map<const Eigen::ArrayXf>(pa, n);
         const float k0 = tg::math::kGeluK0, k1 = tg::math::kGeluK1;
         Eigen::Map<Eigen::ArrayXf>(out.data(), n) = 0.5f * x * (1.f + (k0 * (x + k1 * x.cube())).tanh());
       }},
      {"copy of a permuted view", 8.0 * double(n), [&] { permuted.contiguous(); },
       [&] {
         for (int64_t i = 0; i < B; ++i)
           Eigen::Map<RowMajor>(out.data() + i * S * C, S, C) =
               Eigen::Map<const RowMajor>(pperm + i * S * C, C, S).transpose();
       }},
  };
  std::printf("cpu_maps: %lld floats per tensor, %d threads (tapegrad, copy); copy bandwidth %.1f GB/s\n",
              static_cast<long long>(n), threads(), copy_gbs);
  std::printf("%-32s %12s %10s %12s %8s %10s\n", "case", "tapegrad us", "Eigen us", "Eigen/tg", "GB/s", "of copy");
  for (const Case& c : cases) {
    const double t = cpu_median_us(c.tapegrad), e = cpu_median_us(c.eigen), gbs = c.bytes / (t * 1e3);
    std::printf("%-32s %12.1f %10.1f %12.2f %8.1f %9.0f%%\n", c.name, t, e, e / t, gbs, 100 * gbs / copy_gbs);
  }
}
