// The spec's 16 benchmark cases (shared/spec/region-attention.md), in the
// spec's order, for the C++ benchmarks.
#pragma once
#include <cstdint>

namespace tgbench {

struct Case {
  int64_t S, B;
};
inline constexpr Case kCases[] = {{128, 64}, {176, 16}, {211, 16}, {256, 64}, {288, 4}, {293, 32}, {352, 2}, {373, 1},
                                  {448, 8},  {449, 2},  {640, 4},  {691, 16}, {768, 2}, {773, 32}, {853, 1}, {1024, 1}};

}  // namespace tgbench
