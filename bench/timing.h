// The benchmarks' timer: CUDA events on tapegrad's stream, 10 warm-up runs,
// 50 timed runs with the L2 flushed (a 512 MiB memset) before each, the median.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/cuda_context.h"
#include "tapegrad.h"

namespace tgbench {

// False, after saying so, where there is no GPU to measure.
inline bool cuda_present(const char* bench) {
  if (tg::cuda::is_available()) return true;
  std::printf("%s: no CUDA device\n", bench);
  return false;
}

constexpr int kWarmup = 10, kRuns = 50;
constexpr size_t kFlushBytes = size_t(512) << 20;  // > the H200's 60 MB L2

class Timer {
 public:
  Timer() {
    TG_CUDA_CHECK(cudaEventCreate(&start_), "bench");
    TG_CUDA_CHECK(cudaEventCreate(&stop_), "bench");
    flush_ = tg::empty({static_cast<int64_t>(kFlushBytes / 4)}, {tg::DType::Float32, tg::Device::CUDA});
  }
  // Median milliseconds of fn over kRuns cold-L2 runs.
  // `prepare`, if given, runs before each flush, untimed.
  double median_ms(const std::function<void()>& fn, const std::function<void()>& prepare = {}) {
    for (int i = 0; i < kWarmup; ++i) fn();
    std::vector<double> ms, host;
    for (int i = 0; i < kRuns; ++i) {
      if (prepare) prepare();
      TG_CUDA_CHECK(cudaMemsetAsync(flush_.raw_data(), i, kFlushBytes, tg::cuda::stream()), "bench flush");
      TG_CUDA_CHECK(cudaEventRecord(start_, tg::cuda::stream()), "bench");
      const auto host_start = std::chrono::steady_clock::now();
      fn();
      host.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start).count());
      TG_CUDA_CHECK(cudaEventRecord(stop_, tg::cuda::stream()), "bench");
      TG_CUDA_CHECK(cudaEventSynchronize(stop_), "bench");
      float t = 0;
      TG_CUDA_CHECK(cudaEventElapsedTime(&t, start_, stop_), "bench");
      ms.push_back(t);
    }
    host_ms_ = median(host);
    return median(ms);
  }
  // The median host time of the last median_ms's calls of fn: the time to
  // queue its work (a call whose GPU time is shorter than this is host-bound).
  double host_ms() const { return host_ms_; }

 private:
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  cudaEvent_t start_{}, stop_{};
  tg::Tensor flush_;
  double host_ms_ = 0;
};

// The ceilings the benchmarks report against, measured in the same run: a
// 2 GiB device-to-device copy (bytes read + written) and cuBLAS 8192^3 GEMMs.
struct Ceilings {
  double copy_gbs, fp32_tflops, tf32_tflops;
};

inline Ceilings measure_ceilings(Timer& timer) {
  const int64_t n = int64_t(1) << 29;
  tg::Tensor src = tg::empty({n}, {tg::DType::Float32, tg::Device::CUDA}), dst = tg::empty_like(src);
  src.fill_(1.0);
  const double copy_ms = timer.median_ms([&] {
    TG_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), n * 4, cudaMemcpyDeviceToDevice, tg::cuda::stream()),
                  "bench");
  });
  src = dst = tg::Tensor();
  const int64_t g = 8192;
  const tg::Tensor a = tg::randn({g, g}).cuda(), b = tg::randn({g, g}).cuda();
  const double fp32_ms = timer.median_ms([&] { tg::matmul(a, b, tg::MatmulPrecision::Highest); });
  const double tf32_ms = timer.median_ms([&] { tg::matmul(a, b, tg::MatmulPrecision::High); });
  const double flop = 2.0 * g * g * g;
  return {2.0 * n * 4 / copy_ms / 1e6, flop / fp32_ms / 1e9, flop / tf32_ms / 1e9};
}

}  // namespace tgbench
