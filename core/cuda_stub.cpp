// The tg::cuda entry points of a build without CUDA.
#include "core/cuda.h"
#include "core/dispatch.h"

namespace tg::cuda {

bool is_available() { return false; }
int device_count() { return 0; }
void synchronize() { no_cuda_backend(); }
MemoryStats memory_stats() { return no_cuda_backend<MemoryStats>(); }
void empty_cache() { no_cuda_backend(); }
void reset_peak_memory_stats() { no_cuda_backend(); }
void set_sync_debug(bool) { no_cuda_backend(); }
void set_poison_allocations(bool) { no_cuda_backend(); }
bool caching_enabled() { return false; }
std::size_t allocation_size(std::size_t) { return no_cuda_backend<std::size_t>(); }
bool sync_debug() { return false; }
void enable_warpgroup_attention(bool) { no_cuda_backend(); }
bool warpgroup_attention_enabled() { return false; }
void enable_warpgroup_gemm(bool) { no_cuda_backend(); }
bool warpgroup_gemm_enabled() { return false; }
void enable_fp16_product_output(bool) { no_cuda_backend(); }
bool fp16_product_output_enabled() { return false; }
void enable_overlapped_launch(bool) { no_cuda_backend(); }
bool overlapped_launch_enabled() { return false; }
StreamGuard::StreamGuard(void*) : previous_(nullptr), had_previous_(false) { no_cuda_backend(); }
StreamGuard::~StreamGuard() = default;
struct Fork::Lane {};
Fork::Fork(bool on) {
  if (on) no_cuda_backend();
}
Fork::~Fork() = default;
void Fork::run(const std::function<void()>& work) { work(); }
void Fork::join() {}
bool graph_replay_enabled() { return false; }
struct GraphReplay::State {};
GraphReplay::GraphReplay() = default;
GraphReplay::~GraphReplay() = default;
void GraphReplay::run(const std::string&, void*, const std::function<void()>&) { no_cuda_backend(); }
std::size_t GraphReplay::launches() const { return 0; }

}  // namespace tg::cuda
