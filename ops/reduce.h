// Reductions over dims. Gradient rules:
//
//   sum(x, dims)     x <- expand(g with dims kept as 1, x.shape)
//   mean(x, dims)    x <- expand(g with dims kept as 1, x.shape) / n
//   sum_to(x, s)     x <- expand(g, x.shape)       (the adjoint of broadcasting)
#pragma once
#include <vector>

#include "core/hd.h"
#include "core/tensor.h"

namespace tg {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor sum(const Tensor& x);  // every element, a 0-d tensor
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
// Sums x down to `shape`, which x's shape broadcasts from.
Tensor sum_to(const Tensor& x, const Shape& shape);

// Column sums out[c] = sum_r value(r, c), so that tall-narrow and short-wide
// problems both fill the device: partial sums over chunks of kColumnChunk rows,
// one work item per (chunk, column) — neighbouring items read neighbouring
// columns, so loads coalesce — then the same again over the partials, until
// one chunk is left.
constexpr int64_t kColumnChunk = 16;

template <class T, class Value>
struct ColumnChunkSum {
  Value value;
  T* partial;  // [chunks, cols]
  int64_t rows, cols;
  TG_HD void operator()(int64_t i) const {
    const int64_t c = i % cols, first = (i / cols) * kColumnChunk;
    const int64_t last = first + kColumnChunk < rows ? first + kColumnChunk : rows;
    T acc = 0;
    for (int64_t r = first; r < last; ++r) acc += value(r, c);
    partial[i] = acc;
  }
};

template <class T>
struct ReadValue {  // value(r, c) = x[r, c] of a contiguous [rows, cols]
  const T* x;
  int64_t cols;
  TG_HD T operator()(int64_t r, int64_t c) const { return x[r * cols + c]; }
};

template <class T, class Loop, class Value>
void column_sums_with(const Loop& loop, const Value& value, int64_t rows, int64_t cols, T* out, Device device) {
  if (rows <= kColumnChunk) {
    loop(cols, ColumnChunkSum<T, Value>{value, out, rows, cols});
    return;
  }
  const int64_t chunks = (rows + kColumnChunk - 1) / kColumnChunk;
  const Tensor partial = empty({chunks, cols}, {dtype_of<T>(), device});
  loop(chunks * cols, ColumnChunkSum<T, Value>{value, partial.data<T>(), rows, cols});
  column_sums_with(loop, ReadValue<T>{partial.data<T>(), cols}, chunks, cols, out, device);
}

// Kernels on a contiguous x viewed as [rows, cols]:
// sum_rows: out[r] = sum_j x[r, j];  sum_columns: out[c] = sum_r x[r, c].
namespace cpu {
void sum_rows(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols);
void sum_columns(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols);
}  // namespace cpu
namespace cuda {
void sum_rows(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols);
void sum_columns(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols);
}  // namespace cuda

}  // namespace tg
