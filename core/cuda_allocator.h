// The caching device allocator. Sizes are rounded up to buckets (512 B steps
// below 1 MiB, 2 MiB steps above); a freed block goes to its bucket's free list
// and serves only requests of that bucket on the same stream (cuda::stream()
// when it was allocated). A step that repeats the previous one's sequence of
// sizes therefore finds every block it needs in the cache: a training step
// does no cudaMalloc after the first. Reuse on the same stream is safe
// without events: the stream orders the old user's kernels before the new
// user's.
#pragma once
#include <cstddef>

namespace tg::cuda {

void* allocate(std::size_t nbytes);
void deallocate(void* ptr);
// How many times the cache was returned to the driver (empty_cache, or a
// cudaMalloc that failed): a CUDA graph over cached blocks is stale after one.
std::size_t cache_releases();

}  // namespace tg::cuda
