// The CPU benchmarks' timer: 10 warm-up runs, 50 timed runs (a steady clock)
// with the caches flushed before each (a 64 MiB buffer written), the median.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace tgbench {

constexpr int kCpuWarmup = 10, kCpuRuns = 50;

inline double cpu_median_us(const std::function<void()>& fn) {
  static std::vector<float> flush(size_t(16) << 20);  // 64 MiB, beyond the caches
  for (int i = 0; i < kCpuWarmup; ++i) fn();
  std::vector<double> us;
  for (int i = 0; i < kCpuRuns; ++i) {
    std::fill(flush.begin(), flush.end(), float(i));
    const auto start = std::chrono::steady_clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(us.begin(), us.begin() + kCpuRuns / 2, us.end());
  return us[kCpuRuns / 2];
}

}  // namespace tgbench
