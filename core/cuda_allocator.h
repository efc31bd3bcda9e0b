// The caching device allocator. Freed blocks go to a size-ordered free list of
// the (single) stream and are reused best-fit, so a training step does no
// cudaMalloc after warm-up. Reuse on the same stream is safe without events:
// the stream orders the old user's kernels before the new user's.
#pragma once
#include <cstddef>

namespace tg::cuda {

void* allocate(std::size_t nbytes);
void deallocate(void* ptr);

}  // namespace tg::cuda
