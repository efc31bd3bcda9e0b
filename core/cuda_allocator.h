// The caching device allocator. Sizes are rounded up to buckets (512 B steps
// below 1 MiB, 2 MiB steps above); a freed block goes to its bucket's free list
// and serves only requests of that bucket on the same stream (cuda::stream()
// when it was allocated). A step that repeats the previous one's sequence of
// sizes therefore finds every block it needs in the cache: a training step
// does no cudaMalloc after the first. Reuse on the same stream is safe
// without events: the stream orders the old user's kernels before the new
// user's (with overlapped launches too: a kernel may start early, but every
// thread waits for the kernels before it first, core/cuda_launch.cuh).
#pragma once
#include <cstddef>

namespace tg::cuda {

void* allocate(std::size_t nbytes);
void deallocate(void* ptr);
// Blocks cached for a pinned stream stay cached through empty_cache and the
// retry after a failed cudaMalloc: a CUDA graph captured on that stream
// writes them (GraphReplay pins its private stream while it holds a graph).
void pin_stream(void* stream);
void unpin_stream(void* stream);

}  // namespace tg::cuda
