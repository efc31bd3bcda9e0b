// Element types. Every kernel is a template over float and double.
#pragma once
#include <cstddef>
#include <ostream>

#include "core/error.h"

namespace tg {

enum class DType { Float32, Float64 };

inline std::size_t element_size(DType t) { return t == DType::Float32 ? 4 : 8; }
inline const char* dtype_name(DType t) { return t == DType::Float32 ? "float32" : "float64"; }
inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }

}  // namespace tg

// TG_DISPATCH_FLOAT(dtype, T, body): runs body with T = float or double.
#define TG_DISPATCH_FLOAT(dtype, T, ...)          \
  [&] {                                           \
    if ((dtype) == ::tg::DType::Float32) {        \
      using T = float;                            \
      return __VA_ARGS__();                       \
    } else {                                      \
      using T = double;                           \
      return __VA_ARGS__();                       \
    }                                             \
  }()
