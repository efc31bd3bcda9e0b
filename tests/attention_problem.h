// The benchmark interface's problem (shared/spec/region-attention.md): the
// spec's input distribution, the decomposed forward that makes the saved
// tensors, and the spec's backward formulas as plain ops (the reference).
// Shared by the GPU tests and bench/region_attention.
#pragma once
#include <vector>

#include "tapegrad.h"

namespace tgtest {

struct Spec {
  int64_t B, S, C = 1024, H = 16, M = 1024;
  double p = 0.1;
};

using tg::fused::inputs_of;
using tg::fused::outputs_of;

// float32 on CUDA; edit / attn / keep, when given, replace the drawn edit mask, the all-ones attention mask
// and the dropout keep-mask drawn at rate 1 - p (Pd is P keep / (1 - p) either way).
tg::fused::BackwardInputs make_backward_inputs(const Spec& s, tg::Tensor edit = {}, tg::Tensor attn = {},
                                               tg::Tensor keep = {});

// The spec's backward from the saved tensors, in `dtype` (fp32 GEMMs at "highest", or fp64).
tg::fused::Gradients reference_backward(const tg::fused::BackwardInputs& in, double scale, double p, tg::DType dtype);

}  // namespace tgtest
