// bench/bench_ops: the forward and the backward of every op-table row marked
// kBench (tests/op_table.cpp) on CUDA at attention sizes (B=8, S=512, C=1024,
// H=16), against ceilings measured in the same run: device-to-device copy
// bandwidth and the cuBLAS GEMM rate (fp32 and TF32).
//
// Bytes are compulsory traffic: the forward reads each input and writes the
// output once; the backward reads g and the tensors its node saved and writes
// each input gradient once. A pass that makes no kernel (a view, or a backward
// that hands g on as it is) is not timed. Backward rows time the closure of the
// row's last node, called on its saved tensors exactly as the engine calls it.
//
// Method: CUDA events on tapegrad's stream, 10 warm-up runs, 50 timed runs,
// the L2 flushed (a 512 MiB memset) before every timed run, the median reported.
//
// Usage: bench_ops [--json FILE]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "autograd/node.h"
#include "core/cuda_context.h"
#include "tapegrad.h"
#include "bench/timing.h"
#include "tests/op_table.h"

namespace {

using tgbench::Timer;

struct Row {
  std::string op, pass;
  double ms, bytes, flops;
};

double bytes_of(const tg::Tensor& t) { return t.defined() ? static_cast<double>(t.numel()) * 4 : 0.0; }

bool is_view_of(const tg::Tensor& t, const std::vector<tg::Tensor>& of) {
  return std::any_of(of.begin(), of.end(), [&](const tg::Tensor& o) { return t.defined() && t.same_storage(o); });
}

// 2 n m k per product (times the batch) for the GEMM rows, 0 elsewhere.
double forward_flops(const tgtest::OpCase& c, const tgtest::V& in, const tg::Tensor& out) {
  if (c.op == tg::OpId::matmul) return 2.0 * static_cast<double>(out.numel()) * static_cast<double>(in[0].shape().back());
  if (c.op == tg::OpId::linear || c.op == tg::OpId::linear_fp16) return 2.0 * static_cast<double>(out.numel()) * static_cast<double>(in[1].shape()[1]);
  return 0.0;
}

void time_case(Timer& timer, std::vector<Row>& rows, const tgtest::OpCase& c) {
  const tgtest::Dims dims = tgtest::dims_for(tgtest::kBench);
  tgtest::V in = tgtest::make_inputs(c, tgtest::kBench, tg::DType::Float32);
  for (tg::Tensor& t : in) t = t.detach().cuda().requires_grad_(t.requires_grad());
  const tg::Tensor out = c.run(in, dims);
  const std::string name = tgtest::case_name(c);
  const double flops = forward_flops(c, in, out);
  if (!is_view_of(out, in)) {
    double bytes = bytes_of(out);
    for (const tg::Tensor& t : in) bytes += bytes_of(t);
    rows.push_back({name, "forward", timer.median_ms([&] { tg::NoGradGuard g; c.run(in, dims); }), bytes, flops});
  }
  if (!out.grad_fn()) return;
  auto& node = *out.grad_fn();
  const tg::Tensor grad = tg::randn(out.shape()).cuda();
  const std::vector<tg::Tensor> grads = node.backward(grad, node.saved, node.needs);
  if (std::all_of(grads.begin(), grads.end(), [&](const tg::Tensor& g) { return !g.defined() || is_view_of(g, {grad}); }))
    return;
  double bytes = bytes_of(grad);
  for (size_t i = 0; i < node.saved.size(); ++i) bytes += bytes_of(node.saved[i]);
  for (const tg::Tensor& g : grads) bytes += bytes_of(g);
  rows.push_back({name, "backward",
                  timer.median_ms([&] { tg::NoGradGuard g; node.backward(grad, node.saved, node.needs); }), bytes,
                  2 * flops});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Every op of the op table on the GPU, forward and backward, against its floor"};
  std::string json_path;
  app.add_option("--json", json_path, "write the results here");
  CLI11_PARSE(app, argc, argv);
  if (!tgbench::cuda_present("bench_ops")) return 1;

  tg::manual_seed(0);
  Timer timer;
  const tgbench::Ceilings ceil = tgbench::measure_ceilings(timer);
  const double copy_gbs = ceil.copy_gbs, fp32_tflops = ceil.fp32_tflops, tf32_tflops = ceil.tf32_tflops;

  // ---- the op table's bench rows
  std::vector<Row> rows;
  for (const tgtest::OpCase& c : tgtest::op_cases())
    if (c.uses & tgtest::kBench) time_case(timer, rows, c);

  // ---- report
  const tgtest::Dims d = tgtest::dims_for(tgtest::kBench);
  std::printf("ceilings: copy %.0f GB/s (read + write), cuBLAS GEMM 8192^3 fp32 %.1f TFLOP/s, TF32 %.1f TFLOP/s\n",
              copy_gbs, fp32_tflops, tf32_tflops);
  std::printf("%-64s %-9s %10s %10s %8s %10s %8s\n", "op (row)", "pass", "median us", "GB/s", "% copy", "TFLOP/s", "% fp32");
  for (const Row& r : rows) {
    const double gbs = r.bytes / r.ms / 1e6, tflops = r.flops / r.ms / 1e9;
    std::printf("%-64s %-9s %10.1f %10.0f %7.0f%% %10.2f %7.0f%%\n", r.op.c_str(), r.pass.c_str(), r.ms * 1e3, gbs,
                100 * gbs / copy_gbs, tflops, r.flops ? 100 * tflops / fp32_tflops : 0.0);
  }
  if (!json_path.empty()) {
    std::ofstream js(json_path);
    js << "{\"copy_gbs\": " << copy_gbs << ", \"gemm_fp32_tflops\": " << fp32_tflops << ", \"gemm_tf32_tflops\": " << tf32_tflops
       << ", \"sizes\": {\"B\": " << d.B << ", \"S\": " << d.S << ", \"C\": " << d.C << ", \"H\": " << d.H << "}, \"ops\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      js << (i ? ", " : "") << "{\"op\": \"" << r.op << "\", \"pass\": \"" << r.pass << "\", \"median_us\": " << r.ms * 1e3
         << ", \"bytes\": " << r.bytes << ", \"flops\": " << r.flops << ", \"gbs\": " << r.bytes / r.ms / 1e6 << "}";
    }
    js << "]}\n";
  }
  return 0;
}
