// The one rule for 0/1 masks (edit-region masks, attention masks, explicit
// dropout keep masks): every value is exactly 0 or 1. A mask that breaks it
// is a tg::Error naming the op, the argument, the first offending element and
// its value. The check counts on the mask's device and reads the counts back
// (one device sync on CUDA for all the masks of one call), so it runs where
// masks enter the layers and ops (edit_bias, dropout, the attention layer,
// fused_attention); the benchmark interface (fused::region_attention_backward
// and the C API) promises no host synchronisation and takes its masks as given.
// A CUDA mask found binary is remembered (its storage, version and view), and
// the same mask is not counted again, nor the device synchronised, until
// tapegrad writes into its storage (its in-place ops and the ops that write
// into given tensors bump the storage's version) or the storage is freed: a
// training loop that passes the same masks every step pays for the sync
// once. Device memory written behind tapegrad's back (a cudaMemcpy to
// raw_data(), say) is not seen, as autograd's version check does not see it;
// masks over tg::from_blob's borrowed memory are therefore counted every
// time, and so are CPU masks (no sync to save; often refilled by data<T>()).
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
