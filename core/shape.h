// Shapes, strides and NumPy broadcasting.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace tg {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
std::string to_string(const Shape& shape);  // "[2,3]"
std::ostream& operator<<(std::ostream& os, const Shape& shape);

// Broadcast two shapes (NumPy rules); throws naming `op` when they do not agree.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

// Wraps a possibly negative dim into [0, rank); throws naming `op` when out of range.
int normalize_dim(const char* op, int64_t dim, int64_t rank);

}  // namespace tg
