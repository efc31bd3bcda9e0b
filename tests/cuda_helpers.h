// Helpers of the GPU suite: run the same graph on the CPU and on CUDA and
// compare the output and every input gradient.
#pragma once
#include "helpers.h"
#include "op_table.h"
#ifdef TG_CUDA
#include "core/cuda_context.h"
#endif

namespace tgtest {

inline const bool kNoGpu = !tg::cuda::is_available();

// The device's compute capability is 9.0 (H100, H200: the warpgroup-MMA
// kernels run there) and its SM count; without the CUDA backend (a CPU-only
// build, whose GPU tests are all skipped) false and 0.
inline bool on_sm90() {
#ifdef TG_CUDA
  return tg::cuda::context().major == 9 && tg::cuda::context().minor == 0;
#else
  return false;
#endif
}
inline int sm_count() {
#ifdef TG_CUDA
  return tg::cuda::context().sm_count;
#else
  return 0;
#endif
}
// Whether a kernel may start before the one before it completes
// (core/cuda_launch.cuh): the setting on, compute capability 9.0 or later,
// and not sync-debug mode (where every launch completes before the next).
inline bool launches_overlap() {
#ifdef TG_CUDA
  return tg::cuda::overlapped_launch_enabled() && tg::cuda::context().major >= 9 && !tg::cuda::sync_debug();
#else
  return false;
#endif
}
#ifdef TG_CUDA
bool wgmma_supported();  // tests/wgmma_probe.cu: the device runs the warpgroup MMA probe's products
// tests/launch_probe.cu: x[0 .. n) = value ~20 ms after a launch that lets
// the next kernel start at once; out = x by a kernel launched through
// tg::cuda::launch that does not wait for the kernel before it.
void write_late(float* x, int64_t n, float value);
void copy_without_waiting(const float* x, float* out, int64_t n);
void launch_too_many_threads(const float* x, float* out, int64_t n);  // the copy with a block of 2048 threads
#else
inline bool wgmma_supported() { return false; }
inline void write_late(float*, int64_t, float) {}
inline void copy_without_waiting(const float*, float*, int64_t) {}
inline void launch_too_many_threads(const float*, float*, int64_t) {}
#endif

// Sets the float32 matmul precision for a scope and restores the previous one.
class PrecisionScope {
 public:
  explicit PrecisionScope(const std::string& precision) : previous_(tg::float32_matmul_precision()) {
    tg::set_float32_matmul_precision(precision);
  }
  ~PrecisionScope() { tg::set_float32_matmul_precision(previous_ == tg::MatmulPrecision::High ? "high" : "highest"); }

 private:
  tg::MatmulPrecision previous_;
};

// For a scope: one of core/cuda.h's on-by-default settings off, back on
// however the scope ends.
template <void (*kEnable)(bool)>
struct SettingOff {
  SettingOff() { kEnable(false); }
  ~SettingOff() { kEnable(true); }
};
// gemm_fp16's split products on cuBLAS's k slices instead of the warpgroup kernel.
using CublasSplitProducts = SettingOff<tg::cuda::enable_warpgroup_gemm>;
// linear_to_fp16 through the float product and to_fp16 (the path its fp16 GEMM replaced).
using FloatProductCopies = SettingOff<tg::cuda::enable_fp16_product_output>;
// The fused attention on its mma.sync kernels where the warpgroup-MMA ones would run (compute capability 9.0).
using MmaSyncAttention = SettingOff<tg::cuda::enable_warpgroup_attention>;
// Every kernel dispatched only once the kernel before it has completed.
using SerialLaunches = SettingOff<tg::cuda::enable_overlapped_launch>;

// max over elements of |gpu - cpu| / (atol + rtol |cpu|): <= 1 passes. NaN fails.
inline double parity_error(const tg::Tensor& gpu, const tg::Tensor& cpu, Tolerance tol) {
  REQUIRE(gpu.shape() == cpu.shape());
  const auto g = gpu.to_vector(), c = cpu.to_vector();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) || std::isnan(c[i])) return INFINITY;
    if (std::isinf(c[i]) && g[i] == c[i]) continue;
    worst = std::max(worst, std::abs(g[i] - c[i]) / (tol.atol + tol.rtol * std::abs(c[i])));
  }
  return worst;
}

// Runs fn on float32 CPU leaves and on CUDA copies of them, backward with the
// same random seed gradient, and compares the outputs and all gradients.
inline void expect_parity(const std::function<tg::Tensor(const std::vector<tg::Tensor>&)>& fn,
                          const std::vector<tg::Tensor>& inputs, Tolerance tol) {
  std::vector<tg::Tensor> cpu, gpu;
  for (const tg::Tensor& t : inputs) {
    cpu.push_back(t.detach().clone().requires_grad_(t.requires_grad()));
    gpu.push_back(t.detach().cuda().requires_grad_(t.requires_grad()));
  }
  const tg::Tensor out_cpu = fn(cpu), out_gpu = fn(gpu);
  REQUIRE(out_gpu.is_cuda());
  CHECK(parity_error(out_gpu, out_cpu, tol) <= 1.0);
  if (!out_cpu.requires_grad()) return;
  const tg::Tensor seed = tg::randn(out_cpu.shape(), {out_cpu.dtype()});
  out_cpu.backward(seed);
  out_gpu.backward(seed.cuda());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    CAPTURE(i);
    REQUIRE(gpu[i].grad().defined());
    CHECK(gpu[i].grad().is_cuda());
    CHECK(parity_error(gpu[i].grad(), cpu[i].grad(), tol) <= 1.0);
  }
}

inline tg::Tensor randn32(const tg::Shape& s, bool grad = true) { return tg::randn(s).requires_grad_(grad); }
inline tg::Tensor uniform32(const tg::Shape& s, double lo, double hi, bool grad = true) {
  return tg::add(tg::mul(tg::rand(s), hi - lo), lo).requires_grad_(grad);
}

}  // namespace tgtest
