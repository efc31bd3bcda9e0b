// The one rule for 0/1 masks (edit-region masks, attention masks, explicit
// dropout keep masks): every value is exactly 0 or 1. A mask that breaks it
// is a tg::Error naming the op, the argument, the first offending element and
// its value. The check counts on the mask's device and reads the counts back
// (one device sync on CUDA for all the masks of one call), so it runs where
// masks enter the layers and ops (edit_bias, dropout, the attention layer,
// fused_attention); the benchmark interface (fused::region_attention_backward
// and the C API) promises no host synchronisation and takes its masks as given.
#pragma once
#include <initializer_list>

#include "core/tensor.h"

namespace tg {

struct NamedMask {
  const char* arg;
  const Tensor& mask;
};

void check_binary_masks(const char* op, std::initializer_list<NamedMask> masks);
void check_binary_mask(const char* op, const char* arg, const Tensor& mask);

}  // namespace tg
