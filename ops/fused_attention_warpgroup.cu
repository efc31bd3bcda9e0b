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

void launch_interface_backward_warpgroup(const AttentionInputs& in, const AttentionGradTensors& g,
                                         MatmulPrecision precision) {
  if (precision == MatmulPrecision::High) launch_backward<mma::Fp16Warpgroup, true>(in, g);
  else launch_backward<mma::Fp16x3Warpgroup, true>(in, g);
}

}  // namespace tg::cuda
