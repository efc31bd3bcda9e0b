// The GPU suite's main: runs the cuda/ tests; where no GPU is present they are
// marked skipped and the process exits 77, which CTest reports as "Skipped".
// With a GPU, every device allocation is poisoned with NaN first.
// `--fault-probe=sync|async` instead launches a faulting kernel (the child
// process of the sync-debug test) and reports where the fault was caught.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>
#include <iostream>

#include "core/cuda.h"
#include "core/error.h"

namespace {
#ifdef TG_CUDA
}  // namespace
namespace tgtest {
void launch_faulting_kernel();  // tests/fault_probe.cu
}
namespace {

int fault_probe(bool sync) {
  tg::cuda::set_sync_debug(sync);
  try {
    tgtest::launch_faulting_kernel();
  } catch (const tg::Error& e) {
    std::cout << "caught at the launch: " << e.what() << "\n";
    return sync ? 0 : 1;
  }
  if (sync) {
    std::cout << "the launch did not report the fault\n";
    return 1;
  }
  try {
    tg::cuda::synchronize();
  } catch (const tg::Error& e) {
    std::cout << "launch returned; caught later: " << e.what() << "\n";
    return 0;
  }
  std::cout << "no fault seen\n";
  return 1;
}
#else
int fault_probe(bool) {
  std::cout << "built without CUDA\n";
  return 1;
}
#endif
}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fault-probe=sync") == 0) return fault_probe(true);
    if (std::strcmp(argv[i], "--fault-probe=async") == 0) return fault_probe(false);
  }
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
