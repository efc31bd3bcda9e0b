// The per-device CUDA context (one stream, cuBLAS and cuBLASLt handles, a cuDNN handle),
// created lazily, and the checks that turn every failing CUDA, cuBLAS and cuDNN
// call into a tg::Error naming the op and the call.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <mutex>

#include "core/dtype.h"

// Raises a tg::Error naming op and the call when a CUDA, cuBLAS or cuDNN call fails (tg::cuda::check, below).
#define TG_CUDA_CHECK(call, op) ::tg::cuda::check((call), (op), #call)

namespace tg::cuda {

struct Context {
  int device = 0;
  int sm_count = 0;
  int major = 0, minor = 0;  // compute capability
  int l2_bytes = 0;          // the L2 cache's size
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;  // for the GEMMs with an epilogue (ops/matmul.cu)
  cudnnHandle_t cudnn = nullptr;
  void* cublas_workspace = nullptr;  // fixed, so that cuBLAS allocates nothing (CUDA graph capture)
  void* side_cublas_workspace = nullptr;  // for cuBLAS in Fork side work, one fork at a time (cublas_workspace())
};

Context& context();
// The stream tapegrad's work goes to on this thread: a StreamGuard's, else the context's.
cudaStream_t stream();
// The handles, bound to stream() for the call that follows, cuBLAS's with
// cublas_workspace().
cublasHandle_t cublas();
// The workspace cuBLAS calls get: the context's, or inside a Fork's side
// work the side workspace, which asking takes: the fork holds it from its
// side work's first cublas() (or cublas_workspace()) call to its join (or
// destructor; released even where the rejoin fails). The next fork to take
// it must be made after that join, so that its side stream follows the last
// holder's work (core/cuda.h). Anything else is an error: a fork asking
// while another holds it, or made before that join, or made inside another
// fork's side work (which the origin's wait does not order).
// As with the context's workspace, work on streams that the caller does not
// order (a fork from another stream, another thread's) must not overlap:
// the one cuBLAS handle, the cuBLASLt handle and the two workspaces they
// share serve one thread at a time.
void* cublas_workspace();
// The size of each cuBLAS workspace.
constexpr size_t kCublasWorkspace = size_t(32) << 20;
// The cuBLASLt handle; its calls take stream() and cublas_workspace() themselves.
cublasLtHandle_t cublas_lt();
cudnnHandle_t cudnn();

// Whether the environment variable `name` is set to exactly `value` (the
// TG_* switches: TG_CUDA_SYNC, TG_CUDA_GRAPHS, TG_CUDA_NO_CACHING, TG_OVERLAPPED_LAUNCH).
bool env_is(const char* name, const char* value);

// True inside a Fork's side work, which must not allocate (the allocator checks).
bool allocation_forbidden();

// A second stream and the two events that order it after another stream
// (follow) and that stream after it (rejoin): Fork's side streams and
// GraphReplay's private stream. A Fork's side stream has the device's least
// priority (CUDA's default, that of the streams callers pass), the private
// stream one step above it: a graph captured there and instantiated with
// node priorities (each kernel node keeps its capture stream's) schedules
// the critical path's pending blocks before the side work's.
enum class StreamPriority { kSide, kCritical };
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t forked = nullptr, done = nullptr;
  static SideStream create(const char* op, StreamPriority priority);
  void follow(cudaStream_t origin, const char* op) const;  // its next work after origin's so far
  void rejoin(cudaStream_t origin, const char* op) const;  // origin's next work after its so far
  void rejoin_reporting(cudaStream_t origin, const char* op) const;  // the same where it cannot throw
};

void check(cudaError_t status, const char* op, const char* call);
// Where a failure cannot be thrown (destructors, clean-up on an error path):
// printed to stderr as "tapegrad: <op>: <call> failed: <reason>".
void report_failure(cudaError_t status, const char* op, const char* call);
void check(cublasStatus_t status, const char* op, const char* call);
void report_failure(cublasStatus_t status, const char* op, const char* call);
void check(cudnnStatus_t status, const char* op, const char* call);

// A host scalar (alpha, beta) in the precision that cuBLAS and cuDNN expect for
// a tensor of `dtype`: double for float64, float for float32.
class HostScalar {
 public:
  HostScalar(double value, DType dtype) : f32_(static_cast<float>(value)), f64_(value), dtype_(dtype) {}
  const void* get() const { return dtype_ == DType::Float64 ? static_cast<const void*>(&f64_) : &f32_; }

 private:
  float f32_;
  double f64_;
  DType dtype_;
};

// After a kernel launch: raises launch errors, and in sync-debug mode waits
// for the kernel so that a fault inside it is reported against `op`.
void check_launch(const char* op);

// Whether `kernel`'s code on this device was compiled for compute
// capability 9.0 or later (cudaFuncGetAttributes' ptxVersion), so that its
// after_previous_kernels() waits (core/cuda_launch.cuh). A build for earlier
// architectures also runs on a 9.0 device, through the driver's JIT, and
// there the wait is compiled out. Asked once per kernel.
bool kernel_waits(const void* kernel, const char* op);

// Raises kKernel's dynamic shared memory limit to `bytes` (above the 48 KiB
// a launch gets without asking), once per kernel (not again inside a CUDA
// graph capture of a later call).
template <auto kKernel>
void allow_shared_memory(size_t bytes, const char* op) {
  static std::once_flag once;
  std::call_once(once, [&] {
    TG_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                  op);
  });
}

}  // namespace tg::cuda

