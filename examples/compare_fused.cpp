// compare_fused: the fused attention op against the decomposed graph, on the
// GPU. One training step of the region-aware layer (B=4, S=256, C=1024, H=16,
// dropout 0.1 from one Philox draw, so both see the same mask); for each
// output and gradient, the fused op at "high" and "highest" against the
// decomposed graph at "highest": max abs error, max relative error
// (|diff| / max |ref|), and the fraction of elements within
// atol = 1e-3 max|ref| + rtol 1e-5 |ref|.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tapegrad.h"

namespace {

struct Step {
  std::vector<tg::Tensor> tensors;  // y, then dL/dx and the parameters' gradients
};

const char* const kNames[] = {"y", "x", "qkv_weight", "qkv_bias", "out_weight", "out_bias", "edit_region_bias",
                              "within_edit_bias", "cross_edit_bias"};

Step run(const tg::RegionAttentionParams& host, const tg::Tensor& x_host, const tg::Tensor& e, const tg::Tensor& a,
         const tg::Tensor& dy, tg::AttentionImpl impl, const std::string& precision) {
  tg::set_float32_matmul_precision(precision);
  const tg::RegionAttentionParams p = host.trainable_copy(tg::Device::CUDA);
  tg::Tensor x = x_host.cuda().requires_grad_();
  const tg::Tensor y = tg::region_attention(x, e, a, p, {0.1, tg::PhiloxState{2026, 1}}, impl);
  y.backward(dy);
  Step s{{y, x.grad()}};
  for (const tg::Tensor& t : p.parameters()) s.tensors.push_back(t.grad());
  return s;
}

void report(const char* label, const Step& got, const Step& ref) {
  std::printf("\n%s vs decomposed (highest)\n%-18s %14s %14s %12s\n", label, "tensor", "max abs err", "max rel err",
              "within tol");
  for (size_t i = 0; i < ref.tensors.size(); ++i) {
    const std::vector<double> g = got.tensors[i].to_vector(), r = ref.tensors[i].to_vector();
    double scale = 0, err = 0;
    for (double v : r) scale = std::max(scale, std::abs(v));
    size_t ok = 0;
    for (size_t k = 0; k < g.size(); ++k) {
      const double d = std::abs(g[k] - r[k]);
      err = std::max(err, d);
      ok += d <= 1e-3 * scale + 1e-5 * std::abs(r[k]);
    }
    std::printf("%-18s %14.3e %14.3e %11.4f%%\n", kNames[i], err, scale > 0 ? err / scale : err,
                100.0 * double(ok) / double(g.size()));
  }
}

}  // namespace

int main() {
  if (!tg::cuda::is_available()) {
    std::printf("compare_fused: no CUDA device here; the fused kernels need one (the CPU runs the fused algorithm as\n"
                "loops, checked against the decomposed graph by the test fused/cpu float64 ...).\n");
    return 0;
  }
  tg::manual_seed(7);
  const int64_t B = 4, S = 256, C = 1024, H = 16;
  const tg::RegionAttentionParams params = tg::RegionAttentionParams::init({C, H, 1024});
  const tg::Tensor x = tg::randn({B, S, C}), dy = tg::randn({B, S, C}).cuda();
  const tg::Tensor e = tg::dropout_mask({B, S}, 0.5, {1, 1}).cuda(), a = tg::ones({B, S}).cuda();
  const Step ref = run(params, x, e, a, dy, tg::AttentionImpl::Decomposed, "highest");
  std::printf("region-aware attention, B=%ld S=%ld C=%ld H=%ld, dropout 0.1: fused vs decomposed\n", long(B), long(S),
              long(C), long(H));
  report("fused, high (fp16)", run(params, x, e, a, dy, tg::AttentionImpl::Fused, "high"), ref);
  report("fused, highest (3xTF32)", run(params, x, e, a, dy, tg::AttentionImpl::Fused, "highest"), ref);
  return 0;
}
