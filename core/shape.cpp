#include "core/shape.h"

#include <sstream>

#include "core/error.h"

namespace tg {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t checked_numel(const char* op, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    TG_CHECK(d >= 0, op, ": negative dimension in shape ", shape);
    TG_CHECK(!__builtin_mul_overflow(n, d, &n), op, ": shape ", shape, " has more elements than int64 can count");
  }
  return n;
}

int64_t checked_nbytes(const char* op, const Shape& shape, std::size_t element_size) {
  int64_t bytes = 0;
  TG_CHECK(!__builtin_mul_overflow(checked_numel(op, shape), static_cast<int64_t>(element_size), &bytes), op,
           ": shape ", shape, " needs more bytes than int64 can count");
  return bytes;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

std::string to_string(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << ']';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Shape& shape) { return os << to_string(shape); }

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    TG_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
             " cannot be broadcast (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int normalize_dim(const char* op, int64_t dim, int64_t rank) {
  const int64_t d = dim < 0 ? dim + rank : dim;
  TG_CHECK(d >= 0 && d < rank, op, ": dim ", dim, " is out of range for a tensor of rank ", rank);
  return static_cast<int>(d);
}

ElementSpan element_span(const Shape& shape, const Shape& strides, int64_t offset) {
  ElementSpan span{offset, offset + 1};
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return {offset, offset};
    const int64_t reach = (shape[d] - 1) * strides[d];
    (reach < 0 ? span.begin : span.end) += reach;
  }
  return span;
}

bool has_internal_overlap(const Shape& shape, const Shape& strides) {
  if (numel(shape) == 0) return false;  // no elements, none shared
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 1 && strides[d] == 0) return true;
  return false;
}

}  // namespace tg
