// The C API (include/tapegrad/c_api.h) over tg::fused::region_attention_backward_into.
// Every failure is caught here and turned into a nonzero return with the
// reason kept for tg_last_error(); nothing is written before the checks pass.
#include "include/tapegrad/c_api.h"

#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "capi/c_api_internal.h"
#include "core/cuda.h"
#include "core/error.h"
#include "ops/fused_attention.h"

namespace {

thread_local std::string last_error;

constexpr int kInputs = 19, kOutputs = 8;

struct Sizes {
  int64_t B, S, C, H, M;
};

Sizes check_sizes(int64_t B, int64_t S, int64_t C, int64_t H, int64_t M) {
  const char* op = "tg_region_attention_backward";
  TG_CHECK(B > 0 && S > 0 && C > 0 && H > 0 && M > 0, op, ": sizes must be positive (batch ", B, ", seq_len ", S,
           ", hidden ", C, ", heads ", H, ", max_positions ", M, ")");
  TG_CHECK(C % H == 0, op, ": hidden ", C, " is not divisible by heads ", H);
  TG_CHECK(S <= M, op, ": seq_len ", S, " exceeds max_positions ", M);
  return {B, S, C, H, M};
}

// Repeated calls with the same arguments replay a CUDA graph (GraphReplay in core/cuda.h).
tg::cuda::GraphReplay& replay() {
  static auto* r = new tg::cuda::GraphReplay;  // never destroyed: its graph may be in flight at exit
  return *r;
}

// Everything a call reads besides the contents of device memory.
std::string replay_key(const float* const* in, float* const* out, float scale, float p, Sizes z,
                       tg_precision precision, void* stream) {
  std::string key;
  const auto add = [&](const auto& v) { key.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  for (int i = 0; i < kInputs; ++i) add(in[i]);
  for (int i = 0; i < kOutputs; ++i) add(out[i]);
  add(scale);
  add(p);
  add(z);
  add(precision);
  add(stream);
  add(tg::cuda::warpgroup_attention_enabled());  // which backward kernel the graph holds
  add(tg::cuda::warpgroup_gemm_enabled());        // and which split products ("highest")
  add(tg::cuda::overlapped_launch_enabled());     // and whether its kernels overlap (captured into its edges)
  return key;
}

tg::Tensor on_device(const float* p, const tg::Shape& shape) {
  return tg::from_blob(const_cast<float*>(p), shape, {tg::DType::Float32, tg::Device::CUDA});
}

void run(const float* const* in, float scale, float p, Sizes z, float* const* out, tg_precision precision,
         void* stream) {
  const char* op = "tg_region_attention_backward";
  TG_CHECK(in && out, op, ": the inputs and outputs arrays must not be null");
  for (int i = 0; i < kInputs; ++i)
    TG_CHECK(in[i], op, ": input ", i, " (", tg::fused::kInputNames[i], ") is a null pointer");
  for (int i = 0; i < kOutputs; ++i)
    TG_CHECK(out[i], op, ": output ", i, " (", tg::fused::kOutputNames[i], ") is a null pointer");
  TG_CHECK(precision == TG_PRECISION_HIGHEST || precision == TG_PRECISION_HIGH, op, ": unknown precision ",
           static_cast<int>(precision));
  TG_CHECK(tg::cuda::is_available(), op, ": no CUDA device is available");
  const int64_t B = z.B, S = z.S, C = z.C, H = z.H, M = z.M, D = C / H;
  tg::fused::BackwardInputs x;
  x.grad_output = on_device(in[0], {B, S, C});
  x.hidden_states = on_device(in[1], {B, S, C});
  x.edit_region_mask = on_device(in[2], {B, S});
  x.qkv_weight = on_device(in[3], {3 * C, C});
  x.qkv_bias = on_device(in[4], {3 * C});
  x.out_weight = on_device(in[5], {C, C});
  x.out_bias = on_device(in[6], {C});
  x.edit_region_bias = on_device(in[7], {H, M, M});
  x.within_edit_bias = on_device(in[8], {H, 1, 1});
  x.cross_edit_bias = on_device(in[9], {H, 1, 1});
  x.attention_mask = on_device(in[10], {B, S});
  x.query = on_device(in[11], {B, H, S, D});
  x.key = on_device(in[12], {B, H, S, D});
  x.value = on_device(in[13], {B, H, S, D});
  x.attention_scores = on_device(in[14], {B, H, S, S});
  x.attention_probs = on_device(in[15], {B, H, S, S});
  x.attention_probs_dropped = on_device(in[16], {B, H, S, S});
  x.attention_output = on_device(in[17], {B, S, C});
  x.dropout_mask = on_device(in[18], {B, H, S, S});
  tg::fused::Gradients g;
  g.hidden_states = on_device(out[0], {B, S, C});
  g.qkv_weight = on_device(out[1], {3 * C, C});
  g.qkv_bias = on_device(out[2], {3 * C});
  g.out_weight = on_device(out[3], {C, C});
  g.out_bias = on_device(out[4], {C});
  g.edit_region_bias = on_device(out[5], {H, M, M});
  g.within_edit_bias = on_device(out[6], {H, 1, 1});
  g.cross_edit_bias = on_device(out[7], {H, 1, 1});
  const tg::MatmulPrecision mp = precision == TG_PRECISION_HIGH ? tg::MatmulPrecision::High : tg::MatmulPrecision::Highest;
  // One call at a time: the calls share tapegrad's cuBLAS handle, whose stream each GEMM sets.
  static std::mutex one_call;
  const std::lock_guard<std::mutex> lock(one_call);
  replay().run(replay_key(in, out, scale, p, z, precision, stream), stream,
               [&] { tg::fused::region_attention_backward_into(x, scale, p, mp, g); });
}

}  // namespace

std::size_t tg::capi::graph_launches() { return replay().launches(); }

extern "C" int tg_region_attention_backward(const float* const* inputs, float scale, float dropout_p, int64_t batch,
                                            int64_t seq_len, int64_t hidden, int64_t heads, int64_t max_positions,
                                            float* const* outputs, tg_precision precision, void* cuda_stream) {
  try {
    last_error.clear();
    run(inputs, scale, dropout_p, check_sizes(batch, seq_len, hidden, heads, max_positions), outputs, precision,
        cuda_stream);
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" const char* tg_last_error(void) { return last_error.c_str(); }

extern "C" const char* tg_version(void) { return "tapegrad 0.3.0"; }
