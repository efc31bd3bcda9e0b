// Shapes, strides and NumPy broadcasting.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace tg {

using Shape = std::vector<int64_t>;

// The number of elements of a shape already known to be valid.
int64_t numel(const Shape& shape);
// The number of elements, checked: throws naming `op` and the shape when a
// dimension is negative or the product overflows int64.
int64_t checked_numel(const char* op, const Shape& shape);
// numel * element_size, checked for overflow the same way.
int64_t checked_nbytes(const char* op, const Shape& shape, std::size_t element_size);

Shape contiguous_strides(const Shape& shape);
std::string to_string(const Shape& shape);  // "[2,3]"
std::ostream& operator<<(std::ostream& os, const Shape& shape);

// Broadcast two shapes (NumPy rules); throws naming `op` when they do not agree.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

// Wraps a possibly negative dim into [0, rank); throws naming `op` when out of range.
int normalize_dim(const char* op, int64_t dim, int64_t rank);

// The first and one past the last element offset that a view (shape, strides,
// offset) touches; {offset, offset} when it has no elements.
struct ElementSpan {
  int64_t begin, end;
};
ElementSpan element_span(const Shape& shape, const Shape& strides, int64_t offset);

// Several elements of the view share one memory location (a stride-0 dim of
// size > 1, as expand() makes, in a view with elements): writing through it
// is ambiguous.
bool has_internal_overlap(const Shape& shape, const Shape& strides);

}  // namespace tg
