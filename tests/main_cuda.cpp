// The GPU suite's main: runs the cuda/ tests; where no GPU is present they are
// marked skipped and the process exits 77, which CTest reports as "Skipped".
// With a GPU, every device allocation is poisoned with NaN first.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <iostream>

#include "core/cuda.h"

int main(int argc, char** argv) {
  if (tg::cuda::is_available()) tg::cuda::set_poison_allocations(true);  // unwritten outputs read as NaN
  doctest::Context context(argc, argv);
  const int failures = context.run();
  if (context.shouldExit()) return failures;
  if (!tg::cuda::is_available()) {
    std::cout << "no CUDA device: every cuda/ test was skipped\n";
    return failures ? failures : 77;
  }
  return failures;
}
