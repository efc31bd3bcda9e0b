// Random fills: element i of a contiguous tensor takes draw i of one Philox
// state (core/philox.h), so the values are a pure function of (seed, offset,
// i), whatever the device and its number of threads:
//
//   uniform: philox_uniform(s, i) in [0, 1)  exact in float: CPU and CUDA agree bit for bit
//   normal:  philox_normal(s, i)             Box-Muller in double, with the device's log and cos
//                                            (CUDA's: within 1 and 2 ulp of the exact value), so
//                                            the two agree to a double's last bits, and in float
//                                            but for a rare one-ulp rounding
//
// rand and randn (core/tensor.h) fill a fresh tensor on its own device with
// these: one work item per Philox block, in parallel (bench/NOTES.md, version
// 39: drawn on the host, one block per element, the toy model's noise at batch
// 512 took ~90 ms of every step). Untracked writes, like ops/untracked.h's: for
// fresh tensors, not for tensors on the tape.
#pragma once
#include "core/philox.h"
#include "core/tensor.h"

namespace tg {

void fill_uniform_into(const Tensor& dst, PhiloxState state);
void fill_normal_into(const Tensor& dst, PhiloxState state);

}  // namespace tg
