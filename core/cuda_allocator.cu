#include <cstdio>
#include <cstdlib>
#include <vector>
#include <string>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "core/cuda.h"
#include "core/cuda_allocator.h"
#include "core/cuda_context.h"
#include "core/error.h"

namespace tg::cuda {

namespace {

constexpr std::size_t kSmallRound = 512;             // small blocks: multiples of 512 B
constexpr std::size_t kLargeRound = 2 << 20;         // large blocks: multiples of 2 MiB
constexpr std::size_t kLargeThreshold = 1 << 20;

std::size_t round_size(std::size_t n) {
  const std::size_t r = n < kLargeThreshold ? kSmallRound : kLargeRound;
  return (std::max<std::size_t>(n, 1) + r - 1) / r * r;
}

class CachingAllocator {
 public:
  void* allocate(std::size_t nbytes) {
    TG_CHECK(!allocation_forbidden(), "cuda allocator: ", nbytes,
             " bytes requested inside a cuda::Fork's side work, which must not allocate (allocate on the forking stream first)");
    const std::size_t size = block_size(nbytes);
    const cudaStream_t s = stream();
    std::lock_guard<std::mutex> lock(mutex_);
    void* p = caching_ ? take_cached({s, size}) : nullptr;
    if (!p) p = device_malloc(size);
    live_[p] = {s, size};
    stats_.live_blocks = live_.size();
    stats_.allocated += size;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    if (poison_) TG_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, size, s), "cuda allocator (poison)");
    return p;
  }

  void deallocate(void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = live_.find(p);
    if (it == live_.end()) return;
    const Bucket bucket = it->second;
    stats_.allocated -= bucket.size;
    if (caching_) {
      free_[bucket].push_back(p);
    } else {
      // Runs from destructors, so failures are reported, not thrown.
      report_failure(cudaStreamSynchronize(bucket.stream), "cuda allocator", "cudaStreamSynchronize");  // the last user may still run
      report_failure(cudaFree(p), "cuda allocator", "cudaFree");
      stats_.reserved -= bucket.size;
    }
    live_.erase(it);
    stats_.live_blocks = live_.size();
  }

  void set_poison(bool on) { poison_ = on; }
  bool caching() const { return caching_; }
  std::size_t block_size(std::size_t nbytes) const { return caching_ ? round_size(nbytes) : std::max<std::size_t>(nbytes, 1); }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    TG_CUDA_CHECK(cudaDeviceSynchronize(), "empty_cache");
    release_cached();
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated = stats_.allocated;
  }
  void pin(cudaStream_t s, bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (on) pinned_.insert(s);
    else pinned_.erase(s);
  }

 private:
  // Blocks are cached per (stream, size): the stream orders a block's old
  // user before its next one, so reuse needs no event.
  struct Bucket {
    cudaStream_t stream;
    std::size_t size;
    bool operator==(const Bucket& o) const { return stream == o.stream && size == o.size; }
  };
  struct BucketHash {
    std::size_t operator()(const Bucket& b) const { return std::hash<const void*>()(b.stream) ^ (b.size * 0x9E3779B97F4A7C15ull); }
  };

  void* take_cached(Bucket bucket) {
    const auto it = free_.find(bucket);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }

  void release_cached() {
    for (auto it = free_.begin(); it != free_.end();) {
      const auto& [bucket, blocks] = *it;
      if (pinned_.count(bucket.stream)) {
        ++it;
        continue;
      }
      for (void* p : blocks) {
        TG_CUDA_CHECK(cudaFree(p), "cuda allocator (release cache)");
        stats_.reserved -= bucket.size;
      }
      it = free_.erase(it);
    }
  }

  void* device_malloc(std::size_t size) {
    context();
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, size);
    if (status == cudaErrorMemoryAllocation) {  // release the cache and try once more
      cudaGetLastError();
      TG_CUDA_CHECK(cudaDeviceSynchronize(), "cuda allocator");
      release_cached();
      status = cudaMalloc(&p, size);
    }
    TG_CHECK(status == cudaSuccess, "cuda allocator: cudaMalloc of ", size, " bytes failed: ",
             cudaGetErrorString(status), " (allocated ", stats_.allocated, ", reserved ",
             stats_.reserved, ")");
    stats_.reserved += size;
    ++stats_.device_allocs;
    return p;
  }

  const bool caching_ = !env_is("TG_CUDA_NO_CACHING", "1");
  bool poison_ = false;
  std::mutex mutex_;
  std::unordered_map<Bucket, std::vector<void*>, BucketHash> free_;
  std::unordered_map<void*, Bucket> live_;
  MemoryStats stats_;
  std::unordered_set<cudaStream_t> pinned_;  // see pin_stream
};

// Never destroyed: tensors freed during static destruction still return here.
CachingAllocator& allocator() {
  static auto* a = new CachingAllocator;
  return *a;
}

}  // namespace

void* allocate(std::size_t nbytes) { return allocator().allocate(nbytes); }
void deallocate(void* p) { allocator().deallocate(p); }
void pin_stream(void* s) { allocator().pin(static_cast<cudaStream_t>(s), true); }
void unpin_stream(void* s) { allocator().pin(static_cast<cudaStream_t>(s), false); }
MemoryStats memory_stats() { return allocator().stats(); }
void empty_cache() { allocator().empty_cache(); }
void reset_peak_memory_stats() { allocator().reset_peak(); }
void set_poison_allocations(bool on) { allocator().set_poison(on); }
bool caching_enabled() { return allocator().caching(); }
std::size_t allocation_size(std::size_t nbytes) { return allocator().block_size(nbytes); }

}  // namespace tg::cuda
