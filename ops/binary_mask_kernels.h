// Counts the elements of a mask that are neither 0 nor 1 (NaN included).
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/tensor.h"

namespace tg {

template <class T>
TG_HD bool non_binary(T m) {
  return !(m == T(0) || m == T(1));
}

template <Device D>
struct BinaryMaskKernels {
  // counts[slot] += the number of non_binary elements of mask (contiguous);
  // counts is a float64 vector on mask's device.
  static void count_non_binary(const Tensor& mask, const Tensor& counts, int64_t slot);
};
TG_EXTERN_CUDA_KERNELS(BinaryMaskKernels);

}  // namespace tg
