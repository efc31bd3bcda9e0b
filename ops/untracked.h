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
// out [cols] = the column sums of a contiguous x2 [rows, cols] (as sum(x2,
// {0}) gives them for 32 columns or more), through partial sums in scratch:
// sum_columns_scratch(x2) elements of x2's dtype on its device. Given
// scratch (allocated before), it allocates nothing, so that a cuda::Fork's
// side work may run it; undefined scratch is allocated here.
int64_t sum_columns_scratch(const Tensor& x2);
void sum_columns_into(const Tensor& out, const Tensor& x2, const Tensor& scratch);
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
