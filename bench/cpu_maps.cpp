// bench/cpu_maps: the CPU's elementwise maps (core/cpu_loops.h) at the toy
// model's activation size (32 x 64 x 128 floats) in the three ways its
// operands are read: both contiguous, one broadcast along a dim, and a
// permuted view copied out. The peer is Eigen (the CPU backend's library)
// doing the same work on the same inputs in the same run, single-threaded as
// Eigen's coefficient-wise expressions are; the floor is the bytes each case
// must move at the copy bandwidth measured here (one tensor copied cold by
// std::memcpy on each of tapegrad's threads).
//
// Method: 10 warm-up runs, 50 timed runs (a steady clock), the caches flushed
// before each (a 64 MiB buffer written), the median reported.
//
// Usage: cpu_maps
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "tapegrad.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

constexpr int kWarmup = 10, kRuns = 50;
constexpr size_t kFlushFloats = size_t(16) << 20;  // 64 MiB, beyond the caches

std::vector<float> flush_buffer(kFlushFloats);

double median_us(const std::function<void()>& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  std::vector<double> us;
  for (int i = 0; i < kRuns; ++i) {
    std::fill(flush_buffer.begin(), flush_buffer.end(), float(i));
    const auto start = std::chrono::steady_clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(us.begin(), us.begin() + kRuns / 2, us.end());
  return us[kRuns / 2];
}

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

int cpu_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace

int main() {
  tg::NoGradGuard no_grad;
  const int64_t B = 32, S = 64, C = 128, n = B * S * C;
  const tg::Tensor a = tg::randn({B, S, C}), b = tg::randn({B, S, C}), row = tg::randn({B, 1, C});
  const tg::Tensor permuted = tg::randn({B, C, S}).permute({0, 2, 1});  // [B, S, C], inner stride S
  std::vector<float> out(static_cast<size_t>(n)), source(static_cast<size_t>(n), 1.f);
  // The floor's bandwidth: one tensor copied cold, a memcpy per thread, as tapegrad's maps run.
  const int64_t chunk = (n + cpu_threads() - 1) / cpu_threads();
  const auto copy = [&] {
#pragma omp parallel for
    for (int64_t c = 0; c < n; c += chunk)
      std::memcpy(out.data() + c, source.data() + c, static_cast<size_t>(std::min(chunk, n - c)) * 4);
  };
  const double copy_gbs = 8.0 * double(n) / (median_us(copy) * 1e3);
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
      {"copy of a permuted view", 8.0 * double(n), [&] { permuted.contiguous(); },
       [&] {
         for (int64_t i = 0; i < B; ++i)
           Eigen::Map<RowMajor>(out.data() + i * S * C, S, C) =
               Eigen::Map<const RowMajor>(pperm + i * S * C, C, S).transpose();
       }},
  };
  std::printf("cpu_maps: %lld floats per tensor, %d threads (tapegrad, copy); copy bandwidth %.1f GB/s\n",
              static_cast<long long>(n), cpu_threads(), copy_gbs);
  std::printf("%-32s %12s %10s %12s %8s %10s\n", "case", "tapegrad us", "Eigen us", "Eigen/tg", "GB/s", "of copy");
  for (const Case& c : cases) {
    const double t = median_us(c.tapegrad), e = median_us(c.eigen), gbs = c.bytes / (t * 1e3);
    std::printf("%-32s %12.1f %10.1f %12.2f %8.1f %9.0f%%\n", c.name, t, e, e / t, gbs, 100 * gbs / copy_gbs);
  }
}
