// The benchmark interface's backward on Hopper's warpgroup MMA: the kernel
// of ops/fused_attention_backward.cuh with core/wgmma.cuh's products, those
// of Fp16Warpgroup at "high" and of Fp16x3Warpgroup at "highest", in a
// translation unit of its own because wgmma exists in the
// architecture-specific target sm_90a alone (the library is built for
// sm_90). ops/fused_attention.cu dispatches to it on a device of compute
// capability 9.0 (uses_warpgroup_kernel).
#include "core/wgmma.cuh"  // before the kernel template, whose calls find the warpgroup products by ordinary lookup
#include "ops/fused_attention_backward.cuh"

namespace tg::cuda {

namespace {
// f(policy): Fp16Warpgroup at "high", Fp16x3Warpgroup at "highest".
template <class F>
decltype(auto) with_warpgroup_policy(MatmulPrecision precision, F&& f) {
  if (precision == MatmulPrecision::High) return f(mma::Fp16Warpgroup{});
  return f(mma::Fp16x3Warpgroup{});
}
}  // namespace

void launch_interface_backward_warpgroup(const AttentionInputs& in, const AttentionGradTensors& g,
                                         MatmulPrecision precision) {
  with_warpgroup_policy(precision, [&](auto mma) { launch_backward<decltype(mma), true>(in, g); });
}

KernelResidency interface_backward_warpgroup_residency(MatmulPrecision precision) {
  return with_warpgroup_policy(precision, [](auto mma) { return backward_residency<decltype(mma), true>(); });
}

}  // namespace tg::cuda
