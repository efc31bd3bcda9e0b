// bench/train_step: one training step of the region-aware attention layer
// (forward + backward of the whole layer, projections included, dropout
// p = 0.1) at the spec's sizes, decomposed and fused, at "highest" (fp32) and
// "high" (TF32), with the step's peak device memory. bench/train_step.py measures PyTorch eager on
// the same layer and sizes, the same way, in the same GPU script.
// Then one training step of the toy edit-diffusion model (the demo's EditDiT:
// loss, backward, clipping and AdamW) on the GPU, decomposed vs fused, at "high".
//
// Method: 3 warm-up steps, then 20 steps each timed with the host clock
// between two stream synchronisations; the median. Peak memory is the
// allocator's high-water mark over one step, parameters and inputs included.
//
// Usage: train_step [--json FILE] [--impl decomposed|fused] [--precision highest|high] [--size BxS] [--no-toy]
//                   [--mma-sync]
// (the filters pick a configuration to profile, e.g. under ncu; default: all;
// --size takes any B >= 1 and 1 <= S <= 1024, the layer's positions, in
// place of the spec's three sizes)
#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/timing.h"
#include "tapegrad.h"

namespace {

struct Size {
  int64_t B, S;
};

constexpr int64_t kPositions = 1024;  // the layer's max_positions M

// The spec's sizes, run when --size names none.
const std::vector<Size> kSpecSizes = {{8, 1024}, {32, 773}, {64, 128}};

// "BxS" (digits only) as a Size; B < 1, S outside 1 .. kPositions, a number
// past int64_t or any other text gives none. (A size the layer cannot take
// on the device, a B past the CUDA grid's or memory's limit, is the op's
// tg::Error, which main reports.)
std::optional<Size> parse_size(const std::string& text) {
  Size s{};
  const char *begin = text.data(), *end = begin + text.size();
  const auto [x, b_error] = std::from_chars(begin, end, s.B);
  if (b_error != std::errc() || x == end || *x != 'x' || !std::isdigit(static_cast<unsigned char>(*begin)))
    return std::nullopt;
  const auto [last, s_error] = std::from_chars(x + 1, end, s.S);
  if (s_error != std::errc() || last != end || !std::isdigit(static_cast<unsigned char>(x[1]))) return std::nullopt;
  if (s.B < 1 || s.S < 1 || s.S > kPositions) return std::nullopt;
  return s;
}

struct Result {
  std::string impl, precision;
  Size size;
  double ms, peak_mib;
};

constexpr int kWarmup = 3, kRuns = 20;

// The median time of kRuns calls of step() after kWarmup, each between two
// synchronisations, and the peak memory of one more call.
template <typename Step>
std::pair<double, double> time_and_peak(Step&& step) {
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
  return {ms[ms.size() / 2], static_cast<double>(tg::cuda::memory_stats().peak_allocated) / (1 << 20)};
}

const char* impl_name(tg::AttentionImpl impl) { return impl == tg::AttentionImpl::Fused ? "fused" : "decomposed"; }

Result measure_layer(const tg::RegionAttentionParams& params, Size size, const std::string& precision,
                     tg::AttentionImpl impl) {
  tg::set_float32_matmul_precision(precision);
  const int64_t C = params.qkv_weight.size(1);
  const tg::Tensor x = tg::randn({size.B, size.S, C}).cuda().requires_grad_();
  const tg::Tensor e = tg::dropout_mask({size.B, size.S}, 0.5, tg::default_generator().next()).cuda();
  const tg::Tensor a = tg::ones({size.B, size.S}).cuda();
  const tg::Tensor dy = tg::randn({size.B, size.S, C}).cuda();
  tg::RegionAttentionParams p = params;
  const auto [ms, peak] = time_and_peak([&] {
    tg::region_attention(x, e, a, p, {0.1}, impl).backward(dy);
    for (tg::Tensor& t : p.parameters()) t.zero_grad();
    tg::Tensor(x).zero_grad();
  });
  return {impl_name(impl), precision, size, ms, peak};
}

// One step of the demo's model (hidden 128, depth 4, 2 heads of 64, 64
// tokens) on a batch of B edits, as examples/train_edit_diffusion runs it.
Result measure_toy(int64_t B, tg::AttentionImpl impl) {
  tg::set_float32_matmul_precision("high");
  const tg::TensorOptions opts{tg::DType::Float32, tg::Device::CUDA};
  tg::manual_seed(0);
  tg::toy::EditDiT model({.attention = impl}, opts);
  tg::optim::AdamW optimizer(model.parameters(), {});
  const tg::toy::EditBatch batch = tg::toy::make_edit_batch(0, 0, B, opts);
  const auto [ms, peak] = time_and_peak([&] { tg::toy::train_step(model, optimizer, batch); });
  return {std::string("toy EditDiT ") + impl_name(impl), "high", {B, tg::toy::kTokens}, ms, peak};
}

void print(const std::vector<Result>& results) {
  std::printf("%-24s %-9s %5s %6s %10s %10s\n", "impl", "precision", "B", "S", "median ms", "peak MiB");
  for (const Result& r : results)
    std::printf("%-24s %-9s %5ld %6ld %10.3f %10.0f\n", r.impl.c_str(), r.precision.c_str(),
                static_cast<long>(r.size.B), static_cast<long>(r.size.S), r.ms, r.peak_mib);
}

void write_json(const std::string& path, const std::vector<Result>& results) {
  std::ofstream js(path);
  js << "[";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    js << (i ? ", " : "") << "{\"impl\": \"tapegrad " << r.impl << "\", \"precision\": \"" << r.precision
       << "\", \"B\": " << r.size.B << ", \"S\": " << r.size.S << ", \"median_ms\": " << r.ms
       << ", \"peak_mib\": " << r.peak_mib << "}";
  }
  js << "]\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One training step of the attention layer and of the toy model, decomposed vs fused"};
  std::string json_path, only_impl, only_precision, only_size;
  bool no_toy = false;
  app.add_option("--json", json_path, "write the results here");
  app.add_option("--impl", only_impl, "only this implementation")->check(CLI::IsMember({"decomposed", "fused"}));
  app.add_option("--precision", only_precision, "only this precision")->check(CLI::IsMember({"highest", "high"}));
  app.add_option("--size", only_size,
                 "only this layer size (BxS, S up to 1024; default: the spec's 8x1024, 32x773 and 64x128)")
      ->check([](const std::string& text) {
        if (parse_size(text)) return std::string();
        return "a size is BxS with B >= 1 and 1 <= S <= " + std::to_string(kPositions);
      });
  app.add_flag("--no-toy", no_toy, "skip the toy model's step");
  bool mma_sync = false;
  app.add_flag("--mma-sync", mma_sync,
               "the mma.sync attention kernels where the warpgroup-MMA ones would run (compute capability 9.0)");
  CLI11_PARSE(app, argc, argv);
  const auto wanted = [](const std::string& only, const std::string& value) { return only.empty() || only == value; };
  const std::vector<Size> sizes = only_size.empty() ? kSpecSizes : std::vector<Size>{*parse_size(only_size)};
  if (!tgbench::cuda_present("train_step")) return 1;
  tg::cuda::enable_warpgroup_attention(!mma_sync);
  tg::manual_seed(0);
  const tg::RegionAttentionParams params =
      tg::RegionAttentionParams::init({1024, 16, kPositions}).trainable_copy(tg::Device::CUDA);
  std::vector<Result> layer, toy;
  try {
    for (const tg::AttentionImpl impl : {tg::AttentionImpl::Decomposed, tg::AttentionImpl::Fused}) {
      if (!wanted(only_impl, impl_name(impl))) continue;
      for (const std::string precision : {"highest", "high"})
        for (const Size size : sizes)
          if (wanted(only_precision, precision)) layer.push_back(measure_layer(params, size, precision, impl));
      if (!no_toy)
        for (const int64_t B : {64, 512}) toy.push_back(measure_toy(B, impl));
    }
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "train_step: %s\n", e.what());
    return 1;
  }
  std::printf("one training step of the attention layer (hidden 1024, 16 heads, p = 0.1):\n");
  print(layer);
  std::printf("\none training step of the toy edit-diffusion model (EditDiT, 64 tokens, AdamW):\n");
  print(toy);
  layer.insert(layer.end(), toy.begin(), toy.end());
  if (!json_path.empty()) write_json(json_path, layer);
  return 0;
}
