// The CUDA device as seen from code that does not include CUDA headers. Every
// function here exists in CPU-only builds too: is_available() is then false.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace tg::cuda {

bool is_available();
int device_count();
void synchronize();

struct MemoryStats {
  std::size_t allocated = 0;       // bytes held by live tensors
  std::size_t reserved = 0;        // bytes obtained with cudaMalloc (live + cached)
  std::size_t peak_allocated = 0;  // high-water mark of `allocated`
  std::size_t device_allocs = 0;   // number of cudaMalloc calls so far
  std::size_t live_blocks = 0;     // blocks held by live tensors (and other users)
};
// The bytes a request of `nbytes` takes from the allocator (its bucket size).
std::size_t allocation_size(std::size_t nbytes);
MemoryStats memory_stats();
void empty_cache();  // returns cached blocks to the driver
void reset_peak_memory_stats();

// Poisoning: fill every block the allocator hands out with 0xFF bytes (NaN in
// float32 and float64), so an output element a kernel forgot to write shows up.
void set_poison_allocations(bool on);
// TG_CUDA_NO_CACHING=1 turns the cache off (exact cudaMalloc/cudaFree per
// tensor), so compute-sanitizer sees every allocation's true bounds.
bool caching_enabled();

// Runs tapegrad's CUDA work of this thread on `stream` (a cudaStream_t; null
// is CUDA's legacy default stream) for the guard's lifetime, like PyTorch's
// CUDAStreamGuard. The caching allocator keeps blocks per stream, so memory
// freed on one stream is never handed to work on another.
class StreamGuard {
 public:
  explicit StreamGuard(void* stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  void* previous_;
  bool had_previous_;
};

// Work queued beside this thread's stream, as with a second CUDA stream
// forked from it by an event and joined back by another: the constructor
// marks where stream() stands; run(work) queues work's tapegrad calls on a
// side stream after that mark; join() (or the destructor) makes the stream
// forked from wait for them. The side work must not allocate (the caching
// allocator keeps blocks per stream; an allocation there is an error): what
// it writes is allocated before, on stream(), and kept alive until the join.
// It may call cuBLAS (a GEMM that allocates nothing, or gets its workspace
// allocated before) on the side workspace, one fork at a time, each made
// after the last holder's join, none inside side work (core/cuda_context.h,
// cublas_workspace()).
// Inside a CUDA graph capture the side work becomes a parallel branch of the
// graph (and its side stream serves no work outside that capture until the
// capture ends); the side stream has the device's least priority, so that in
// GraphReplay's graphs the side work's pending blocks wait for the critical
// path's. Fork(false), for CPU tensors, runs the work in place.
class Fork {
 public:
  explicit Fork(bool on);
  ~Fork();
  Fork(const Fork&) = delete;
  Fork& operator=(const Fork&) = delete;
  void run(const std::function<void()>& work);
  void join();
  struct Lane;  // the side stream and its events (core/cuda_context.cu)

 private:
  std::unique_ptr<Lane> lane_;  // null when off or joined
};

// Repeated calls replayed from a CUDA graph (the C API's backward, whose
// small cases take as long to queue as to run). run(key, stream, work) queues
// `work` (tapegrad calls, on cuda::stream()) on `stream`: the first call with
// a key runs it there; the second on a private stream, joined to `stream` by
// events, which fills the allocator's cache of that stream; the third
// captures it there into a graph and launches the graph, and later calls with
// the same key launch it again. The key must name everything the work reads
// besides the contents of device memory (pointers, sizes, scalars), the work
// must write only memory the key names, and it must free every tensor it
// allocates before it returns (checked: otherwise the key is never captured).
// The graph's temporaries are the private stream's cached blocks, pinned
// while the graph lives (allocator pin_stream): only later work on that
// stream reuses them, after the graph's launches in that stream's order.
// `work` runs directly on `stream`, never captured, while `stream` is itself
// being captured, when graph_replay_enabled() is false, from another device
// than the private stream's, and for a key whose capture failed three times.
// The calls that reach the private stream are serialised by a lock. The
// check that the work frees its blocks counts the whole allocator's: another
// thread allocating meanwhile can only keep a key from being captured.
bool graph_replay_enabled();  // not with TG_CUDA_GRAPHS=0, TG_CUDA_SYNC=1 or TG_CUDA_NO_CACHING=1
class GraphReplay {
 public:
  GraphReplay();
  ~GraphReplay();
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;
  void run(const std::string& key, void* stream, const std::function<void()>& work);
  std::size_t launches() const;  // calls served by launching a graph

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Synchronous debug mode: synchronise after every op so that an asynchronous
// fault is blamed on the op that caused it. Also on when TG_CUDA_SYNC=1.
void set_sync_debug(bool on);
bool sync_debug();

// Like torch.backends.cuda.enable_flash_sdp: whether the fused attention may
// run its warpgroup-MMA kernels (Hopper's wgmma, on a device of compute
// capability 9.0: the training forward and backward at "high", the benchmark
// interface's backward at "high" and "highest"). On by default; off, the
// mma.sync kernels run everywhere (to compare them).
void enable_warpgroup_attention(bool on);
bool warpgroup_attention_enabled();

// The same for the "highest" projections' split GEMM (gemm_fp16 of a split
// group on compute capability 9.0, ops/matmul_warpgroup.cu): on by default;
// off, cuBLAS's fp16 GEMMs in k slices run everywhere.
void enable_warpgroup_gemm(bool on);
bool warpgroup_gemm_enabled();

// The same for linear_to_fp16's fp16 GEMM (the training path's qkv
// projection at "high" writing the core's fp16 copy): on by default; off,
// the float product and its conversion (to_fp16), the path it replaced.
void enable_fp16_product_output(bool on);
bool fp16_product_output_enabled();

// Whether tapegrad's kernels may be dispatched while the kernel before them
// finishes (programmatic dependent launch, compute capability 9.0; each
// waits for that kernel's results: core/cuda_launch.cuh). On by default;
// TG_OVERLAPPED_LAUNCH=0 starts with it off; off, every kernel launched
// after the change is dispatched only once the previous one has completed
// (to compare the two; the C API keeps a graph per setting).
void enable_overlapped_launch(bool on);
bool overlapped_launch_enabled();

}  // namespace tg::cuda

namespace tg {

// Like torch.set_float32_matmul_precision: "highest" = fp32 FMA (default),
// "high" = TF32 tensor cores. CPU GEMMs are always fp32/fp64.
enum class MatmulPrecision { Default, Highest, High };
void set_float32_matmul_precision(const std::string& precision);
MatmulPrecision float32_matmul_precision();
// A per-call precision, or the global one when `requested` is Default.
MatmulPrecision resolve_precision(MatmulPrecision requested);

}  // namespace tg
