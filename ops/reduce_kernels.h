// Reduction kernels: row sums, and column sums written once for both devices.
#pragma once
#include "core/dispatch.h"
#include "core/hd.h"
#include "core/tensor.h"

namespace tg {

// Column sums out[c] = sum_r value(r, c), so that tall-narrow and short-wide
// problems both fill the device: partial sums over chunks of kColumnChunk rows,
// one work item per (chunk, column) — neighbouring items read neighbouring
// columns, so loads coalesce — then the same again over the partials, until
// one chunk is left.
constexpr int64_t kColumnChunk = 16;

// The sum of f(r) over rows first .. last - 1 of a chunk, in row order; a
// full chunk unrolled, so that its loads are all in flight at once.
template <class T, class F>
TG_HD T chunk_sum(int64_t first, int64_t last, const F& f) {
  T acc = 0;
  if (last - first == kColumnChunk) {
    TG_UNROLL(kColumnChunk)
    for (int64_t k = 0; k < kColumnChunk; ++k) acc += f(first + k);
  } else {
    for (int64_t r = first; r < last; ++r) acc += f(r);
  }
  return acc;
}

// `Out` is where the sums go: a T* of [chunks, cols], or for the last level
// any type whose out[c] can be assigned a T (several output tensors behind one index).
template <class T, class Value, class Out = T*>
struct ColumnChunkSum {
  Value value;
  Out partial;  // [chunks, cols]
  int64_t rows, cols;
  TG_HD void operator()(int64_t i) const {
    const int64_t c = i % cols, first = (i / cols) * kColumnChunk;
    const int64_t last = first + kColumnChunk < rows ? first + kColumnChunk : rows;
    partial[i] = chunk_sum<T>(first, last, [&](int64_t r) { return value(r, c); });
  }
};

// The same over rows that come as B batches of S: chunks do not straddle
// batches, and value.column(b, c) sets up column c of batch b once, so the
// chunk's rows s are a plain loop over column(s).
template <class T, class Value, class Out = T*>
struct BatchChunkSum {
  Value value;
  Out partial;  // [B * per_batch, cols]
  int64_t S, per_batch, cols;
  TG_HD void operator()(int64_t i) const {
    const int64_t c = i % cols, chunk = i / cols, b = chunk / per_batch;
    const int64_t first = (chunk - b * per_batch) * kColumnChunk;
    const int64_t last = first + kColumnChunk < S ? first + kColumnChunk : S;
    partial[i] = chunk_sum<T>(first, last, value.column(b, c));
  }
};

template <class T>
struct ReadValue {  // value(r, c) = x[r, c] of a contiguous [rows, cols]
  const T* x;
  int64_t cols;
  TG_HD T operator()(int64_t r, int64_t c) const { return x[r * cols + c]; }
};

// The partial sums of column_sums_with over `rows`: [chunks, cols] per
// level, until one chunk is left.
inline int64_t column_sums_scratch(int64_t rows, int64_t cols) {
  int64_t n = 0;
  for (; rows > kColumnChunk; rows = (rows + kColumnChunk - 1) / kColumnChunk)
    n += (rows + kColumnChunk - 1) / kColumnChunk * cols;
  return n;
}

// out[c] = sum_r value(r, c), its partial sums in scratch (column_sums_scratch
// elements), for work queued where nothing may be allocated.
template <class T, class Loop, class Value, class Out>
void column_sums_with(const Loop& loop, const Value& value, int64_t rows, int64_t cols, const Out& out, T* scratch) {
  if (rows <= kColumnChunk) {
    loop(cols, ColumnChunkSum<T, Value, Out>{value, out, rows, cols});
    return;
  }
  const int64_t chunks = (rows + kColumnChunk - 1) / kColumnChunk;
  loop(chunks * cols, ColumnChunkSum<T, Value>{value, scratch, rows, cols});
  column_sums_with<T>(loop, ReadValue<T>{scratch, cols}, chunks, cols, out, scratch + chunks * cols);
}

// The same with its scratch (if it needs any) allocated on `device`.
template <class T, class Loop, class Value, class Out>
void column_sums_into(const Loop& loop, const Value& value, int64_t rows, int64_t cols, const Out& out, Device device) {
  const int64_t n = column_sums_scratch(rows, cols);
  const Tensor scratch = n > 0 ? empty({n}, {dtype_of<T>(), device}) : Tensor();
  column_sums_with<T>(loop, value, rows, cols, out, n > 0 ? scratch.data<T>() : nullptr);
}

// The partial sums of batch_column_sums_with over B batches of S rows.
inline int64_t batch_column_sums_scratch(int64_t B, int64_t S, int64_t cols) {
  const int64_t chunks = B * ((S + kColumnChunk - 1) / kColumnChunk);
  return chunks == 1 ? 0 : chunks * cols + column_sums_scratch(chunks, cols);
}

// out[c] = sum over (b, s) of value.column(b, c)(s), b < B, s < S; its
// partial sums in scratch (batch_column_sums_scratch elements).
template <class T, class Loop, class Value, class Out>
void batch_column_sums_with(const Loop& loop, const Value& value, int64_t B, int64_t S, int64_t cols, const Out& out,
                            T* scratch) {
  const int64_t per_batch = (S + kColumnChunk - 1) / kColumnChunk, chunks = B * per_batch;
  if (chunks == 1) {
    loop(cols, BatchChunkSum<T, Value, Out>{value, out, S, per_batch, cols});
    return;
  }
  loop(chunks * cols, BatchChunkSum<T, Value>{value, scratch, S, per_batch, cols});
  column_sums_with<T>(loop, ReadValue<T>{scratch, cols}, chunks, cols, out, scratch + chunks * cols);
}

// Kernels on a contiguous x viewed as [rows, cols]:
// sum_rows: out[r] = sum_j x[r, j];  sum_columns: out[c] = sum_r x[r, c],
// its partial sums in scratch (column_sums_scratch(rows, cols) elements of
// x's dtype, undefined where that is 0), so that it allocates nothing.
template <Device D>
struct ReduceKernels {
  static void sum_rows(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols);
  static void sum_columns(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols, const Tensor& scratch);
};
TG_EXTERN_CUDA_KERNELS(ReduceKernels);

template <Device D>
void ReduceKernels<D>::sum_columns(const Tensor& x, const Tensor& out, int64_t rows, int64_t cols,
                                   const Tensor& scratch) {
  const int64_t n = column_sums_scratch(rows, cols);
  TG_CHECK(n == 0 || (scratch.defined() && scratch.dtype() == x.dtype() && scratch.device() == x.device() &&
                      scratch.is_contiguous() && scratch.numel() >= n),
           "sum: the column sums of [", rows, ", ", cols, "] need ", n, " contiguous ", dtype_name(x.dtype()),
           " elements of scratch on ", x.device(), ", got ",
           scratch.defined() ? std::string(dtype_name(scratch.dtype())) + " " + to_string(scratch.shape()) : "none");
  TG_DISPATCH_FLOAT(x.dtype(), T, [&] {
    column_sums_with<T>(Loop<D>{"sum"}, ReadValue<T>{x.data<T>(), cols}, rows, cols, out.data<T>(),
                        scratch.defined() ? scratch.data<T>() : nullptr);
  });
}

}  // namespace tg
