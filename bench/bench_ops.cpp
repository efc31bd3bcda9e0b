// bench/ops: every CUDA op's forward and backward at attention sizes
// (B=8, S=512, C=1024, H=16), against ceilings measured in the same run:
// device-to-device copy bandwidth and the cuBLAS GEMM rate (fp32 and TF32).
//
// Bytes count the traffic of the kernels an op launches (a composite backward
// such as div's runs three maps), so % of copy bandwidth measures the kernels.
//
// Method: CUDA events on tapegrad's stream, 10 warm-up runs, 50 timed runs,
// the L2 flushed (a 512 MiB memset) before every timed run, the median reported.
// Backward times are of the op's own backward closure, called on the saved
// tensors exactly as the tape calls it.
//
// Usage: bench_ops [--json FILE]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/cuda_context.h"
#include "tapegrad.h"

namespace {

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
  double median_ms(const std::function<void()>& fn) {
    for (int i = 0; i < kWarmup; ++i) fn();
    std::vector<double> ms;
    for (int i = 0; i < kRuns; ++i) {
      TG_CUDA_CHECK(cudaMemsetAsync(flush_.raw_data(), i, kFlushBytes, tg::cuda::stream()), "bench flush");
      TG_CUDA_CHECK(cudaEventRecord(start_, tg::cuda::stream()), "bench");
      fn();
      TG_CUDA_CHECK(cudaEventRecord(stop_, tg::cuda::stream()), "bench");
      TG_CUDA_CHECK(cudaEventSynchronize(stop_), "bench");
      float t = 0;
      TG_CUDA_CHECK(cudaEventElapsedTime(&t, start_, stop_), "bench");
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  cudaEvent_t start_{}, stop_{};
  tg::Tensor flush_;
};

struct Row {
  std::string op, pass;
  double ms, bytes, flops;
};

// Times the forward of `forward` and the backward closure of the node it
// records; a pass with 0 bytes (a view: no kernel) is not timed.
void time_op(Timer& timer, std::vector<Row>& rows, const std::string& name, const std::function<tg::Tensor()>& forward,
             double fwd_bytes, double bwd_bytes, double fwd_flops = 0, double bwd_flops = 0) {
  if (fwd_bytes > 0) rows.push_back({name, "forward", timer.median_ms([&] { tg::NoGradGuard g; forward(); }), fwd_bytes, fwd_flops});
  const tg::Tensor out = forward();
  if (!out.grad_fn() || bwd_bytes == 0) return;
  const tg::Tensor grad = tg::randn(out.shape()).cuda();
  auto& node = *out.grad_fn();
  rows.push_back({name, "backward", timer.median_ms([&] { tg::NoGradGuard g; node.backward(grad, node.saved); }), bwd_bytes,
                  bwd_flops});
}

tg::Tensor on_gpu(tg::Tensor t, bool grad = true) { return t.cuda().requires_grad_(grad); }

}  // namespace

int main(int argc, char** argv) {
  if (!tg::cuda::is_available()) {
    std::printf("bench_ops: no CUDA device\n");
    return 1;
  }
  std::string json_path;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--json") json_path = argv[i + 1];

  tg::manual_seed(0);
  Timer timer;
  const int64_t B = 8, S = 512, C = 1024, H = 16, D = C / H, M = 1024;
  const double f = 4;  // bytes per float32

  // ---- ceilings
  const int64_t copy_n = int64_t(1) << 29;  // 2 GiB
  tg::Tensor src = tg::empty({copy_n}, {tg::DType::Float32, tg::Device::CUDA}), dst = tg::empty_like(src);
  src.fill_(1.0);
  const double copy_ms = timer.median_ms([&] {
    TG_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), copy_n * f, cudaMemcpyDeviceToDevice, tg::cuda::stream()), "bench");
  });
  const double copy_gbs = 2 * copy_n * f / copy_ms / 1e6;
  src = dst = tg::Tensor();
  const int64_t g = 8192;
  const tg::Tensor ga = tg::randn({g, g}).cuda(), gb = tg::randn({g, g}).cuda();
  const double gemm_ms = timer.median_ms([&] { tg::matmul(ga, gb, tg::MatmulPrecision::Highest); });
  const double tf32_ms = timer.median_ms([&] { tg::matmul(ga, gb, tg::MatmulPrecision::High); });
  const double fp32_tflops = 2.0 * g * g * g / gemm_ms / 1e9, tf32_tflops = 2.0 * g * g * g / tf32_ms / 1e9;

  // ---- ops
  std::vector<Row> rows;
  const double N4 = double(B) * H * S * S, NC = double(B) * S * C, N4C = 4 * NC;
  const tg::Tensor scores = on_gpu(tg::randn({B, H, S, S})), scores2 = on_gpu(tg::randn({B, H, S, S}));
  const tg::Tensor wide = on_gpu(tg::randn({B, S, 4 * C}));
  const tg::Tensor wide_positive = on_gpu(tg::add(tg::rand({B, S, 4 * C}), 0.5));
  const tg::Tensor positive = on_gpu(tg::add(tg::rand({B, H, S, S}), 0.5));
  const tg::Tensor hidden = on_gpu(tg::randn({B, S, C})), hidden2 = on_gpu(tg::randn({B, S, C}));
  const tg::Tensor key_mask = tg::dropout_mask({B, 1, 1, S}, 0.1, {1, 1}).cuda();
  const tg::Tensor E = on_gpu(tg::mul(tg::randn({H, M, M}), 0.02)), w_in = on_gpu(tg::randn({H, 1, 1})),
                   w_x = on_gpu(tg::randn({H, 1, 1}));
  const tg::Tensor edit = tg::dropout_mask({B, S}, 0.5, {2, 2}).cuda();
  const tg::Tensor q = on_gpu(tg::randn({B, H, S, D})), k = on_gpu(tg::randn({B, H, S, D}));
  const tg::Tensor W = on_gpu(tg::mul(tg::randn({3 * C, C}), 0.02)), bias = on_gpu(tg::zeros({3 * C}));
  const tg::Tensor ln_w = on_gpu(tg::ones({C})), ln_b = on_gpu(tg::zeros({C}));
  const tg::Tensor qkv_out = on_gpu(tg::randn({B, S, 3 * C}));

  time_op(timer, rows, "add [B,H,S,S]", [&] { return tg::add(scores, scores2); }, 3 * N4 * f, 0);
  time_op(timer, rows, "mul [B,H,S,S]", [&] { return tg::mul(scores, scores2); }, 3 * N4 * f, 6 * N4 * f);
  time_op(timer, rows, "sub [B,H,S,S]", [&] { return tg::sub(scores, scores2); }, 3 * N4 * f, 2 * N4 * f);
  time_op(timer, rows, "div [B,H,S,S]", [&] { return tg::div(scores, positive); }, 3 * N4 * f, 8 * N4 * f);
  time_op(timer, rows, "exp [B,S,4C]", [&] { return tg::exp(wide); }, 2 * N4C * f, 3 * N4C * f);
  time_op(timer, rows, "log [B,S,4C]", [&] { return tg::log(wide_positive); }, 2 * N4C * f, 3 * N4C * f);
  time_op(timer, rows, "tanh [B,S,4C]", [&] { return tg::tanh(wide); }, 2 * N4C * f, 3 * N4C * f);
  time_op(timer, rows, "relu [B,S,4C]", [&] { return tg::relu(wide); }, 2 * N4C * f, 3 * N4C * f);
  time_op(timer, rows, "gelu [B,S,4C]", [&] { return tg::gelu(wide); }, 2 * N4C * f, 3 * N4C * f);
  time_op(timer, rows, "silu [B,S,4C]", [&] { return tg::silu(wide); }, 2 * N4C * f, 3 * N4C * f);
  time_op(timer, rows, "softmax [B,H,S,S]", [&] { return tg::softmax(scores); }, 2 * N4 * f, 3 * N4 * f);
  time_op(timer, rows, "softmax cuDNN [B,H,S,S]", [&] { return tg::softmax(scores, tg::SoftmaxImpl::Cudnn); }, 2 * N4 * f,
          3 * N4 * f);
  time_op(timer, rows, "dropout p=0.1 [B,H,S,S]", [&] { return tg::dropout(scores, {0.1, tg::PhiloxState{5, 5}}); },
          2 * N4 * f, 2 * N4 * f);
  time_op(timer, rows, "masked_fill [B,H,S,S]", [&] { return tg::masked_fill(scores, key_mask, -1e30); }, 2 * N4 * f,
          2 * N4 * f);
  time_op(timer, rows, "edit_bias [B,H,S,S]", [&] { return tg::edit_bias(E, w_in, w_x, edit); }, (N4 + H * S * S) * f,
          (N4 + double(H) * M * M) * f);
  time_op(timer, rows, "layer_norm [B*S,C]", [&] { return tg::layer_norm(hidden, ln_w, ln_b); }, 2 * NC * f, 3 * NC * f);
    // The backward of sum and of a permuted copy is a view: no kernel, not timed.
  time_op(timer, rows, "sum over tokens [B*S,C]->[C]", [&] { return tg::sum(hidden, {0, 1}); }, NC * f, 0);
  time_op(timer, rows, "sum last dim [B,H,S,S]", [&] { return tg::sum(scores, {3}); }, N4 * f, 0);
  time_op(timer, rows, "mean over tokens [B*S,C]->[C]", [&] { return tg::mean(hidden, {0, 1}); }, NC * f, NC * f);
  // narrow's forward is a view; its backward writes zeros (3NC), then copies the slice (2NC).
  time_op(timer, rows, "narrow [B,S,3C] -> [B,S,C]", [&] { return qkv_out.narrow(2, C, C); }, 0, 5 * NC * f);
  time_op(timer, rows, "mse_loss [B,S,C]", [&] { return tg::mse_loss(hidden, hidden2); }, 2 * NC * f, 3 * NC * f);
  time_op(timer, rows, "contiguous(permute) [B,S,H,D]", [&] { return hidden.view({B, S, H, D}).permute({0, 2, 1, 3}).contiguous(); },
          2 * NC * f, 0);
  const double qk_flops = 2.0 * B * H * S * S * D;
  time_op(timer, rows, "matmul q k^T [B,H,S,D]", [&] { return tg::matmul(q, k.transpose(-1, -2)); },
          (2 * NC + N4) * f, (2 * NC + N4) * 2 * f, qk_flops, 2 * qk_flops);
  const double lin_flops = 2.0 * B * S * C * 3 * C;
  time_op(timer, rows, "linear qkv [B*S,C]x[3C,C]", [&] { return tg::linear(hidden, W, bias); },
          (NC + 3.0 * C * C + 3 * NC) * f, (3 * NC * 2 + 3.0 * C * C + 2 * NC) * f, lin_flops, 2 * lin_flops);

  // ---- report
  std::printf("ceilings: copy %.0f GB/s (read + write), cuBLAS GEMM 8192^3 fp32 %.1f TFLOP/s, TF32 %.1f TFLOP/s\n",
              copy_gbs, fp32_tflops, tf32_tflops);
  std::printf("%-32s %-9s %10s %10s %8s %10s %8s\n", "op", "pass", "median us", "GB/s", "% copy", "TFLOP/s", "% fp32");
  for (const Row& r : rows) {
    const double gbs = r.bytes / r.ms / 1e6, tflops = r.flops / r.ms / 1e9;
    std::printf("%-32s %-9s %10.1f %10.0f %7.0f%% %10.2f %7.0f%%\n", r.op.c_str(), r.pass.c_str(), r.ms * 1e3, gbs,
                100 * gbs / copy_gbs, tflops, r.flops ? 100 * tflops / fp32_tflops : 0.0);
  }
  if (!json_path.empty()) {
    std::ofstream js(json_path);
    js << "{\"copy_gbs\": " << copy_gbs << ", \"gemm_fp32_tflops\": " << fp32_tflops << ", \"gemm_tf32_tflops\": " << tf32_tflops
       << ", \"sizes\": {\"B\": " << B << ", \"S\": " << S << ", \"C\": " << C << ", \"H\": " << H << "}, \"ops\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      js << (i ? ", " : "") << "{\"op\": \"" << r.op << "\", \"pass\": \"" << r.pass << "\", \"median_us\": " << r.ms * 1e3
         << ", \"bytes\": " << r.bytes << ", \"flops\": " << r.flops << ", \"gbs\": " << r.bytes / r.ms / 1e6 << "}";
    }
    js << "]}\n";
  }
  return 0;
}
