// Dropout: y = x * keep / (1 - p). The keep mask is either regenerated from
// Philox (seed, offset, and the element's row and column in the tensor seen
// as rows of its last dim: core/philox.h, dropout_bits) — never stored — or
// given explicitly as a 0/1 tensor. keep = uniform >= p, the uniform a 16-bit
// draw over 2^16, so p acts rounded up to a multiple of 2^-16 (p is at most
// 1 - 2^-16: check_dropout_p). Dropout is linear in x, so its backward is the same op on g:
//
//   x <- g * keep / (1 - p)
//
// p = 0 is the identity, an explicit mask included (checked, not applied: as
// the spec's dP = dPd at p = 0). The CUDA kernel draws the same mask bit for bit.
#pragma once
#include <optional>

#include "core/philox.h"
#include "core/tensor.h"

namespace tg {

struct DropoutOptions {
  double p = 0.0;
  std::optional<PhiloxState> rng;  // the draw to use; none = next draw of the default generator
  Tensor mask;                     // explicit 0/1 keep mask of x's shape (checked); wins over rng
};

Tensor dropout(const Tensor& x, const DropoutOptions& options);
// p in [0, 1 - 2^-16], also as a float (with a given mask, which draws
// nothing, check_given_mask_dropout_p): every dropout keeps by the
// threshold of float(p) on 16-bit draws (core/philox.h), which keeps a
// fraction of the elements within 2^-16 of 1 - p and never less than 2^-16;
// a larger p would keep more than 1 - p and, scaled by 1 / (1 - p), inflate
// the output (at p = 1 - 10^-7 some 150-fold). Errors name op and the argument `name`.
void check_dropout_p(const char* op, const char* name, double p);
// p for a given keep mask (dropout's explicit mask, the benchmark interface's
// dropout_mask): in [0, 1) as a float, so that 1 / (1 - p) is finite.
void check_given_mask_dropout_p(const char* op, const char* name, double p);
// The 0/1 keep mask that dropout(x, {p, state}) applies to a tensor of `shape`.
Tensor dropout_mask(const Shape& shape, double p, PhiloxState state, TensorOptions opts = {});

}  // namespace tg
