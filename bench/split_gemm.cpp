// bench/split_gemm: the "highest" projections' split products (gemm_fp16 of
// a to_fp16_split group: hi hi + 2^-11 (hi lo + lo hi)) on the warpgroup
// split GEMM (ops/matmul_warpgroup.cu) against cuBLAS's fp16 GEMMs in k
// slices of 512 (enable_warpgroup_gemm(false)), on the layer backward's
// four projection products, do = dy Wo ([T, C] x [C, C]), dx = dqkv Wqkv
// ([T, 3C] x [3C, C]), dWo = dy^T o ([C, T] x [T, C]) and dWqkv = dqkv^T x
// ([3C, T] x [T, C]), at the token counts T = B S of the spec's 16 cases
// (where gemm_fp16 does not take the kernel, ops/matmul.cu's
// split_gemm_splits, both columns time cuBLAS).
//
// Timing: bench/timing.h (L2 flushed, 10 warm-up, 50 timed, median), the
// same converted operands for both. Floor: three plain fp16 products, each
// timed as one cuBLAS fp16 GEMM of the same shape in this run (the rate
// the split form could reach at best); TFLOP/s count the three products.
//
// Usage: split_gemm [--json FILE]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/cases.h"
#include "bench/timing.h"
#include "ops/matmul_kernels.h"

namespace {

struct Row {
  std::string product;
  int64_t tokens, depth;
  double kernel_us, cublas_us, floor_us;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The split fp16 GEMM of the \"highest\" projections: warpgroup kernel vs cuBLAS k slices"};
  std::string json_path;
  app.add_option("--json", json_path, "write the results here");
  CLI11_PARSE(app, argc, argv);
  if (!tgbench::cuda_present("split_gemm")) return 1;
  tg::manual_seed(0);
  tgbench::Timer timer;
  const int64_t C = 1024;
  std::vector<Row> rows;
  struct Product {
    const char* name;
    int64_t a_cols;  // A [T, a_cols]
    bool weight;     // c = A^T B (B [T, C]), else c = A B (B [a_cols, C])
  };
  const Product products[] = {{"do = dy Wo", C, false}, {"dx = dqkv Wqkv", 3 * C, false},
                              {"dWo = dy^T o", C, true}, {"dWqkv = dqkv^T x", 3 * C, true}};
  std::vector<int64_t> token_counts;  // B S of the spec's 16 cases, in order of size
  for (const tgbench::Case& c : tgbench::kCases) token_counts.push_back(c.B * c.S);
  std::sort(token_counts.begin(), token_counts.end());
  for (const int64_t tokens : token_counts)
    for (const Product& p : products) {
      const tg::Tensor a = tg::randn({tokens, p.a_cols}).cuda();
      const tg::Tensor b = tg::mul(tg::randn({p.weight ? tokens : p.a_cols, C}), 0.02).cuda();
      const tg::Fp16Group split = tg::to_fp16_split({a, b}), plain = tg::to_fp16({a, b});
      const tg::Tensor c = tg::empty({p.weight ? p.a_cols : tokens, C}, {tg::DType::Float32, tg::Device::CUDA});
      const auto time_us = [&](const tg::Fp16Group& group, bool warpgroup) {
        tg::cuda::enable_warpgroup_gemm(warpgroup);
        const double us = 1e3 * timer.median_ms([&] { tg::gemm_fp16_into(group, 0, p.weight, 1, false, c); });
        tg::cuda::enable_warpgroup_gemm(true);
        return us;
      };
      Row r{p.name, tokens, p.weight ? tokens : p.a_cols, time_us(split, true), time_us(split, false),
            3 * time_us(plain, false)};
      rows.push_back(r);
      const double tflop = 3 * 2.0 * tokens * p.a_cols * C / 1e12;
      std::printf("%-16s T=%6ld  kernel %8.1f us (%5.1f TFLOP/s, %4.2fx floor)  cuBLAS slices %8.1f us "
                  "(%5.1f TFLOP/s)  x %4.2f  floor %8.1f us\n",
                  r.product.c_str(), long(tokens), r.kernel_us, tflop / r.kernel_us * 1e6, r.kernel_us / r.floor_us,
                  r.cublas_us, tflop / r.cublas_us * 1e6, r.cublas_us / r.kernel_us, r.floor_us);
      std::fflush(stdout);
    }
  if (!json_path.empty()) {
    nlohmann::json out = nlohmann::json::array();
    for (const Row& r : rows)
      out.push_back({{"product", r.product}, {"tokens", r.tokens}, {"depth", r.depth}, {"kernel_us", r.kernel_us},
                     {"cublas_us", r.cublas_us}, {"floor_us", r.floor_us}});
    std::ofstream(json_path) << out.dump(2) << "\n";
  }
  return 0;
}
