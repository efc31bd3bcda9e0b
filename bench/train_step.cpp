// bench/train_step: one training step of the region-aware attention layer
// (forward + backward of the whole layer, projections included, dropout
// p = 0.1) at the spec's sizes, decomposed and fused, at "highest" (fp32) and
// "high" (TF32), with the step's peak device memory. bench/train_step.py measures PyTorch eager on
// the same layer and sizes, the same way, in the same GPU script.
//
// Method: 3 warm-up steps, then 20 steps each timed with the host clock
// between two stream synchronisations; the median. Peak memory is the
// allocator's high-water mark over one step, parameters and inputs included.
//
// Usage: train_step [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/timing.h"
#include "tapegrad.h"

namespace {

struct Size {
  int64_t B, S;
};

struct Result {
  std::string impl, precision;
  Size size;
  double ms, peak_mib;
};

constexpr int kWarmup = 3, kRuns = 20;

tg::RegionAttentionParams on_cuda(const tg::RegionAttentionParams& p) {
  tg::RegionAttentionParams q = p;
  for (tg::Tensor* t : {&q.qkv_weight, &q.qkv_bias, &q.out_weight, &q.out_bias, &q.edit_region_bias, &q.within_edit_bias,
                        &q.cross_edit_bias})
    *t = t->detach().cuda().requires_grad_();
  return q;
}

Result measure(const tg::RegionAttentionParams& params, Size size, const std::string& precision, tg::AttentionImpl impl) {
  tg::set_float32_matmul_precision(precision);
  const int64_t C = params.qkv_weight.size(1);
  const tg::Tensor x = tg::randn({size.B, size.S, C}).cuda().requires_grad_();
  const tg::Tensor e = tg::dropout_mask({size.B, size.S}, 0.5, tg::default_generator().next()).cuda();
  const tg::Tensor a = tg::ones({size.B, size.S}).cuda();
  const tg::Tensor dy = tg::randn({size.B, size.S, C}).cuda();
  tg::RegionAttentionParams p = params;
  auto step = [&] {
    tg::region_attention(x, e, a, p, {0.1}, impl).backward(dy);
    for (tg::Tensor& t : p.parameters()) t.zero_grad();
    tg::Tensor(x).zero_grad();
  };
  for (int i = 0; i < kWarmup; ++i) step();
  std::vector<double> ms;
  for (int i = 0; i < kRuns; ++i) {
    tg::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    tg::cuda::synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  tg::cuda::reset_peak_memory_stats();
  step();
  tg::cuda::synchronize();
  const double peak = static_cast<double>(tg::cuda::memory_stats().peak_allocated) / (1 << 20);
  return {impl == tg::AttentionImpl::Fused ? "fused" : "decomposed", precision, size, ms[ms.size() / 2], peak};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One training step of the attention layer, decomposed vs fused: time and peak memory"};
  std::string json_path;
  app.add_option("--json", json_path, "write the results here");
  CLI11_PARSE(app, argc, argv);
  if (!tgbench::cuda_present("train_step")) return 1;
  tg::manual_seed(0);
  const tg::RegionAttentionParams params = on_cuda(tg::RegionAttentionParams::init({1024, 16, 1024}));
  std::vector<Result> results;
  for (const tg::AttentionImpl impl : {tg::AttentionImpl::Decomposed, tg::AttentionImpl::Fused})
    for (const std::string precision : {"highest", "high"})
      for (const Size size : {Size{8, 1024}, Size{32, 773}, Size{64, 128}})
        results.push_back(measure(params, size, precision, impl));

  std::printf("%-12s %-9s %5s %6s %10s %14s\n", "impl", "precision", "B", "S", "median ms", "peak MiB");
  for (const Result& r : results)
    std::printf("%-12s %-9s %5ld %6ld %10.3f %14.0f\n", r.impl.c_str(), r.precision.c_str(), static_cast<long>(r.size.B),
                static_cast<long>(r.size.S), r.ms, r.peak_mib);
  if (!json_path.empty()) {
    std::ofstream js(json_path);
    js << "[";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      js << (i ? ", " : "") << "{\"impl\": \"tapegrad " << r.impl << "\", \"precision\": \"" << r.precision
         << "\", \"B\": " << r.size.B << ", \"S\": " << r.size.S << ", \"median_ms\": " << r.ms
         << ", \"peak_mib\": " << r.peak_mib << "}";
    }
    js << "]\n";
  }
  return 0;
}
