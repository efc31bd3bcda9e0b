// bench/region_attention: the benchmark interface of
// shared/spec/region-attention.md (the layer's backward from its saved
// tensors) on its 16 cases: fused "high", fused "highest" and the decomposed
// graph's backward, each case against its floor.
//
// Timing: the spec's rules (bench/timing.h: L2 flushed, 10 warm-up, 50 timed,
// median), CUDA events around the whole call, so the gaps between its kernels
// count. The decomposed row times the tape's backward over the decomposed
// graph built from the same inputs (the explicit dropout mask).
//
// Floor per case, at the rates measured in this run: max(flops / TF32 GEMM
// rate, bytes / copy bandwidth), with flops = 16 B S C^2 (the four projection
// GEMMs) + 8 B H S^2 D (four S x S products) and bytes = one pass over a
// [B,H,S,S] tensor + the 64 MiB dE write + eight [B,S,C] tensors + the
// weights.
//
// Usage: region_attention [--json FILE] [--cases N | --case K...] [--high-only | --fused-only] [--mma-sync]
//        [--cublas-split]
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/cases.h"
#include "bench/timing.h"
#include "tests/attention_problem.h"

namespace {

using tgbench::Case;
using tgbench::kCases;

struct Row {
  Case c;
  double floor_us, high_us, high_host_us, highest_us, decomposed_us;  // high_host_us: the time to queue a call
};

double floor_us(Case c, const tgbench::Ceilings& ceil) {
  const double C = 1024, H = 16, D = 64, M = 1024, B = double(c.B), S = double(c.S);
  const double flops = 16 * B * S * C * C + 8 * B * H * S * S * D;
  const double bytes = 4 * (B * H * S * S + H * M * M + 8 * B * S * C + 4 * C * C * 2);
  return std::max(flops / (ceil.tf32_tflops * 1e12), bytes / (ceil.copy_gbs * 1e9)) * 1e6;
}

// The decomposed graph over the interface's inputs, ready for backward(dy).
struct DecomposedGraph {
  tg::Tensor y;
  std::vector<tg::Tensor> leaves;
};

DecomposedGraph decomposed_graph(const tg::fused::BackwardInputs& in, double p) {
  tg::RegionAttentionParams params{in.qkv_weight.detach().requires_grad_(), in.qkv_bias.detach().requires_grad_(),
                                   in.out_weight.detach().requires_grad_(), in.out_bias.detach().requires_grad_(),
                                   in.edit_region_bias.detach().requires_grad_(),
                                   in.within_edit_bias.detach().requires_grad_(),
                                   in.cross_edit_bias.detach().requires_grad_(), in.edit_region_bias.size(0)};
  const tg::Tensor x = in.hidden_states.detach().requires_grad_();
  DecomposedGraph g;
  g.y = tg::region_attention_decomposed(x, in.edit_region_mask, in.attention_mask, params,
                                        {p, std::nullopt, in.dropout_mask});
  g.leaves = params.parameters();
  g.leaves.push_back(x);
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The spec's 16 backward cases: fused (high, highest) vs the decomposed graph, against the floor"};
  std::string json_path;
  size_t n_cases = std::size(kCases);
  app.add_option("--json", json_path, "write the results here");
  std::vector<size_t> only;
  bool high_only = false;
  app.add_option("--cases", n_cases, "run only the first N cases")->check(CLI::Range(size_t(1), n_cases));
  app.add_option("--case", only, "run only these cases (1 = the first)")->check(CLI::Range(size_t(1), n_cases));
  app.add_flag("--high-only", high_only, "time fused \"high\" alone (for profiling)");
  bool fused_only = false;
  app.add_flag("--fused-only", fused_only, "time fused \"high\" and \"highest\", not the decomposed graph");
  bool mma_sync = false;
  app.add_flag("--mma-sync", mma_sync,
               "the mma.sync attention kernels where the warpgroup-MMA ones would run (compute capability 9.0)");
  bool cublas_split = false;
  app.add_flag("--cublas-split", cublas_split,
               "\"highest\"'s projections on cuBLAS's k slices where the warpgroup split GEMM would run");
  CLI11_PARSE(app, argc, argv);
  if (only.empty())
    for (size_t k = 1; k <= n_cases; ++k) only.push_back(k);
  if (!tgbench::cuda_present("region_attention")) return 1;
  tg::cuda::enable_warpgroup_attention(!mma_sync);
  tg::cuda::enable_warpgroup_gemm(!cublas_split);
  tg::manual_seed(0);
  tgbench::Timer timer;
  const tgbench::Ceilings ceil = tgbench::measure_ceilings(timer);
  std::printf("ceilings: copy %.0f GB/s, TF32 GEMM %.1f TFLOP/s, fp32 GEMM %.1f TFLOP/s\n", ceil.copy_gbs,
              ceil.tf32_tflops, ceil.fp32_tflops);
  std::vector<Row> rows;
  for (const size_t k : only) {
    const Case c = kCases[k - 1];
    const tgtest::Spec spec{c.B, c.S};
    const tg::fused::BackwardInputs in = tgtest::make_backward_inputs(spec);
    const double scale = 1 / std::sqrt(64.0);
    const tg::fused::Gradients out = tg::fused::region_attention_backward(in, scale, spec.p);
    auto fused = [&](tg::MatmulPrecision precision) {
      return 1e3 * timer.median_ms([&] { tg::fused::region_attention_backward_into(in, scale, spec.p, precision, out); });
    };
    Row r{c, floor_us(c, ceil), fused(tg::MatmulPrecision::High), 1e3 * timer.host_ms(), 0, 0};
    if (!high_only) r.highest_us = fused(tg::MatmulPrecision::Highest);
    if (!high_only && !fused_only) {
      const DecomposedGraph g = decomposed_graph(in, spec.p);
      r.decomposed_us = 1e3 * timer.median_ms([&] { g.y.backward(in.grad_output, /*retain_graph=*/true); },
                                              [&] {
                                                for (tg::Tensor t : g.leaves) t.zero_grad();
                                              });
    }
    rows.push_back(r);
    std::printf("S=%4ld B=%3ld  floor %7.1f us  fused high %8.1f us (%4.2fx floor, queued in %6.1f us)  highest %8.1f us  "
                "decomposed %8.1f us\n",
                long(c.S), long(c.B), r.floor_us, r.high_us, r.high_us / r.floor_us, r.high_host_us, r.highest_us,
                r.decomposed_us);
    std::fflush(stdout);
  }
  double floor = 0, high = 0, highest = 0, dec = 0;
  for (const Row& r : rows) floor += r.floor_us, high += r.high_us, highest += r.highest_us, dec += r.decomposed_us;
  const double n = double(rows.size());
  std::printf("mean of %zu cases: floor %.1f us, fused high %.1f us, fused highest %.1f us, decomposed %.1f us\n",
              rows.size(), floor / n, high / n, highest / n, dec / n);
  if (!json_path.empty()) {
    std::ofstream js(json_path);
    js << "{\"copy_gbs\": " << ceil.copy_gbs << ", \"tf32_tflops\": " << ceil.tf32_tflops << ", \"cases\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      js << (i ? ", " : "") << "{\"S\": " << r.c.S << ", \"B\": " << r.c.B << ", \"floor_us\": " << r.floor_us
         << ", \"fused_high_us\": " << r.high_us << ", \"fused_high_host_us\": " << r.high_host_us
         << ", \"fused_highest_us\": " << r.highest_us
         << ", \"decomposed_us\": " << r.decomposed_us << "}";
    }
    js << "]}\n";
  }
  return 0;
}
