// The benchmark interface's backward at "high" on Hopper's warpgroup MMA:
// the kernel of ops/fused_attention_backward.cuh with core/wgmma.cuh's
// Fp16Warpgroup products, in a translation unit of its own because wgmma
// exists in the architecture-specific target sm_90a alone (the library is
// built for sm_90). ops/fused_attention.cu dispatches to it on a device of
// compute capability 9.0 (uses_warpgroup_kernel).
#include "core/wgmma.cuh"  // before the kernel template, whose calls find the warpgroup products by ordinary lookup
#include "ops/fused_attention_backward.cuh"

namespace tg::cuda {

void launch_interface_backward_warpgroup(const AttentionInputs& in, const AttentionGradTensors& g) {
  launch_backward<mma::Fp16Warpgroup, true>(in, g);
}

}  // namespace tg::cuda
