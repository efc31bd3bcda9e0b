// Power-of-two scales for fp16 copies of float data, and the split of a
// scaled value into two fp16 parts: the fp16 conversion (ops/matmul.cu), the
// fused attention backward's fp16 key gradients (ops/fused_attention.cu) and
// its split operands (core/mma.cuh's Fp16x3) do both alike.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tg::cuda {

// |v| for a finite v, else 0: an Inf or NaN converts to fp16 Inf or NaN at
// any scale, so it must not set the scale of the finite elements.
__device__ __forceinline__ float finite_abs(float v) { return isfinite(v) ? fabsf(v) : 0.f; }

// The largest finite_abs of a quad.
__device__ __forceinline__ float finite_abs_max(float4 v) {
  return fmaxf(fmaxf(finite_abs(v.x), finite_abs(v.y)), fmaxf(finite_abs(v.z), finite_abs(v.w)));
}

// e with amax 2^e in [2^(top - 1), 2^top) (0 for amax = 0), clamped to
// [-63, 63] so that a pair's alpha 2^-(e_i + e_j) stays a normal float.
__device__ __forceinline__ int scale_exponent(float amax, int top) {
  if (amax == 0.f) return 0;
  int exponent;
  frexpf(amax, &exponent);  // amax = f 2^exponent, f in [0.5, 1)
  return max(-63, min(top - exponent, 63));
}

// A scaled value y as fp16 hi + 2^-11 lo (to_fp16_split's form, 22 bits of
// y): lo = kLowPartFactor (y - hi), exact before it is rounded (NaN for an
// Inf: Inf - Inf).
constexpr float kLowPartFactor = 2048.f;
__device__ __forceinline__ float low_part(float y, float hi) { return kLowPartFactor * (y - hi); }

// The pair (y0, y1) split so: hi rounded to nearest, then lo rounded to nearest.
struct Half2Split {
  __half2 hi, lo;
};
__device__ __forceinline__ Half2Split split_half2(float y0, float y1) {
  const __half2 hi = __floats2half2_rn(y0, y1);
  const float2 h = __half22float2(hi);
  return {hi, __floats2half2_rn(low_part(y0, h.x), low_part(y1, h.y))};
}

// The pair (y0, y1) as fp16 rounded to nearest, and with kLow its low parts
// too (split_half2; lo is left unset without).
template <bool kLow>
__device__ __forceinline__ Half2Split half_pair(float y0, float y1) {
  if constexpr (kLow) return split_half2(y0, y1);
  else return {__floats2half2_rn(y0, y1), {}};
}

// 2^scale_exponent(amax, top).
__device__ __forceinline__ float scale_below(float amax, int top) { return ldexpf(1.f, scale_exponent(amax, top)); }

}  // namespace tg::cuda
