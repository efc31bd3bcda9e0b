// Element types. Every kernel is a template over float and double; a dtype
// that no switch below names is a compile-time warning (-Wswitch, an error in
// this build) and a clear tg::Error at run time.
#pragma once
#include <cstddef>
#include <ostream>

#include "core/error.h"

namespace tg {

enum class DType { Float32, Float64 };

[[noreturn]] void unknown_dtype(const char* where, DType t);

inline std::size_t element_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
  }
  unknown_dtype("element_size", t);
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  unknown_dtype("dtype_name", t);
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }

}  // namespace tg

// TG_DISPATCH_FLOAT(dtype, T, body): runs body with T = float or double.
#define TG_DISPATCH_FLOAT(dtype, T, ...)                       \
  [&] {                                                        \
    switch (dtype) {                                           \
      case ::tg::DType::Float32: {                             \
        using T = float;                                       \
        return __VA_ARGS__();                                  \
      }                                                        \
      case ::tg::DType::Float64: {                             \
        using T = double;                                      \
        return __VA_ARGS__();                                  \
      }                                                        \
    }                                                          \
    ::tg::unknown_dtype("TG_DISPATCH_FLOAT", dtype);           \
  }()
