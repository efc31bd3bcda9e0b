// Untracked helpers for implementing ops: copies and views that record
// nothing on the tape. Ops and kernels use them; user code wants the tracked
// ops (clone, contiguous, expand, ...) instead.
#pragma once
#include "core/tensor.h"

namespace tg {

// dst = src elementwise; same shape, any dtypes and devices. Correct when the
// two overlap in memory (the source is staged through a copy).
void copy_into(const Tensor& dst, const Tensor& src);
void fill_into(const Tensor& dst, double value);
// dst += b, b broadcast to dst's shape (same dtype and device); dst contiguous.
void add_into(const Tensor& dst, const Tensor& b);
// x itself when contiguous, else a contiguous copy.
Tensor materialize(const Tensor& x);
// The same, and also a copy when x does not start on a 16-byte boundary (for
// kernels that read 16-byte vectors).
Tensor materialize_aligned(const Tensor& x);

// x broadcast to `shape` with stride-0 dims; throws naming `op` when it does not broadcast.
Tensor broadcast_view(const char* op, const Tensor& x, const Shape& shape);
// x with its last two dims swapped.
Tensor transposed_view(const Tensor& x);
// Contiguous x seen as [rows, cols], cols its last dim.
Tensor rows_view(const Tensor& x, int64_t cols);

}  // namespace tg
