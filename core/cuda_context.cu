#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <vector>

#include "core/cuda.h"
#include "core/cuda_context.h"
#include "core/error.h"

namespace tg::cuda {

namespace {
bool sync_debug_flag = [] {
  const char* env = std::getenv("TG_CUDA_SYNC");
  return env && std::string(env) == "1";
}();

constexpr size_t kCublasWorkspace = size_t(32) << 20;

thread_local bool stream_override = false;
thread_local cudaStream_t override_stream = nullptr;
}  // namespace

StreamGuard::StreamGuard(void* s) : previous_(override_stream), had_previous_(stream_override) {
  context();
  override_stream = static_cast<cudaStream_t>(s);
  stream_override = true;
}

StreamGuard::~StreamGuard() {
  override_stream = static_cast<cudaStream_t>(previous_);
  stream_override = had_previous_;
}

cudaStream_t stream() { return stream_override ? override_stream : context().stream; }

// ---- Fork: a side stream and its two events, kept per thread (a lane taken
// by one thread's fork never joins another thread's graph capture) and reused.

SideStream SideStream::create(const char* op, StreamPriority priority) {
  int least = 0, greatest = 0;  // numerically least >= greatest: a lower number runs first
  TG_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), op);
  const int level = priority == StreamPriority::kCritical ? std::max(greatest, least - 1) : least;
  SideStream s;
  TG_CUDA_CHECK(cudaStreamCreateWithPriority(&s.stream, cudaStreamNonBlocking, level), op);
  TG_CUDA_CHECK(cudaEventCreateWithFlags(&s.forked, cudaEventDisableTiming), op);
  TG_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), op);
  return s;
}

void SideStream::follow(cudaStream_t origin, const char* op) const {
  TG_CUDA_CHECK(cudaEventRecord(forked, origin), op);
  TG_CUDA_CHECK(cudaStreamWaitEvent(stream, forked, 0), op);
}

void SideStream::rejoin(cudaStream_t origin, const char* op) const {
  TG_CUDA_CHECK(cudaEventRecord(done, stream), op);
  TG_CUDA_CHECK(cudaStreamWaitEvent(origin, done, 0), op);
}

void SideStream::rejoin_reporting(cudaStream_t origin, const char* op) const {
  report_failure(cudaEventRecord(done, stream), op, "cudaEventRecord");
  report_failure(cudaStreamWaitEvent(origin, done, 0), op, "cudaStreamWaitEvent");
}

struct Fork::Lane {
  SideStream side;
  cudaStream_t origin = nullptr;  // the stream forked from, joined back at the end
};

namespace {
thread_local bool in_side_work = false;

struct LanePool {
  std::vector<Fork::Lane> free;
  ~LanePool() {  // at thread exit; at process exit the runtime may already be gone
    for (const Fork::Lane& lane : free)
      for (const cudaError_t status : {cudaEventDestroy(lane.side.forked), cudaEventDestroy(lane.side.done),
                                       cudaStreamDestroy(lane.side.stream)})
        if (status != cudaErrorCudartUnloading) report_failure(status, "cuda fork", "destroying a side stream");
  }
};
thread_local LanePool lanes;

// A join inside a graph capture leaves the side stream in that capture until
// it ends: such a lane serves only more work of the same capture.
bool lane_serves(const Fork::Lane& lane, cudaStream_t origin) {
  cudaStreamCaptureStatus side = cudaStreamCaptureStatusNone, here = cudaStreamCaptureStatusNone;
  unsigned long long side_id = 0, here_id = 0;
  TG_CUDA_CHECK(cudaStreamGetCaptureInfo(lane.side.stream, &side, &side_id), "cuda fork");
  if (side == cudaStreamCaptureStatusNone) return true;
  TG_CUDA_CHECK(cudaStreamGetCaptureInfo(origin, &here, &here_id), "cuda fork");
  return side == cudaStreamCaptureStatusActive && here == cudaStreamCaptureStatusActive && side_id == here_id;
}

Fork::Lane take_lane(cudaStream_t origin) {
  for (auto it = lanes.free.rbegin(); it != lanes.free.rend(); ++it)
    if (lane_serves(*it, origin)) {
      Fork::Lane lane = *it;
      lanes.free.erase(std::next(it).base());
      lane.origin = origin;
      return lane;
    }
  return {SideStream::create("cuda fork", StreamPriority::kSide), origin};
}
}  // namespace

bool allocation_forbidden() { return in_side_work; }

namespace {
// The side stream that holds the side cuBLAS workspace (null: none), from its
// first cuBLAS call to its fork's join.
std::atomic<cudaStream_t> side_workspace_holder{nullptr};

void* side_workspace_for(cudaStream_t side) {
  cudaStream_t holder = nullptr;
  TG_CHECK(side_workspace_holder.compare_exchange_strong(holder, side) || holder == side,
           "cuda fork: cuBLAS called on a second side stream while another one holds the side workspace "
           "(one fork at a time may call cuBLAS)");
  return context().side_cublas_workspace;
}

void release_side_workspace(cudaStream_t side) {
  side_workspace_holder.compare_exchange_strong(side, nullptr);
}
}  // namespace

Fork::Fork(bool on) {
  if (!on) return;
  context();
  const Lane lane = take_lane(stream());
  try {
    lane.side.follow(lane.origin, "cuda fork");
  } catch (...) {
    lanes.free.push_back(lane);
    throw;
  }
  lane_ = std::make_unique<Lane>(lane);
}

void Fork::run(const std::function<void()>& work) {
  if (!lane_) return work();
  const StreamGuard guard(lane_->side.stream);
  const bool outer = in_side_work;  // a fork inside side work restores the check as it was
  in_side_work = true;
  try {
    work();
  } catch (...) {
    in_side_work = outer;
    throw;
  }
  in_side_work = outer;
}

void Fork::join() {
  if (!lane_) return;
  const Lane lane = *lane_;
  lane_.reset();
  lanes.free.push_back(lane);
  release_side_workspace(lane.side.stream);
  lane.side.rejoin(lane.origin, "cuda fork (join)");
}

Fork::~Fork() {
  if (!lane_) return;
  release_side_workspace(lane_->side.stream);
  lane_->side.rejoin_reporting(lane_->origin, "cuda fork (join)");
  lanes.free.push_back(*lane_);
}

cublasHandle_t cublas() {
  Context& ctx = context();
  // Setting the stream also drops the workspace, so both are set together.
  TG_CUDA_CHECK(cublasSetStream(ctx.cublas, stream()), "cuda context");
  void* workspace = in_side_work ? side_workspace_for(stream()) : ctx.cublas_workspace;
  TG_CUDA_CHECK(cublasSetWorkspace(ctx.cublas, workspace, kCublasWorkspace), "cuda context");
  return ctx.cublas;
}

cudnnHandle_t cudnn() {
  TG_CUDA_CHECK(cudnnSetStream(context().cudnn, stream()), "cuda context");
  return context().cudnn;
}

bool is_available() { return device_count() > 0; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

void synchronize() { TG_CUDA_CHECK(cudaStreamSynchronize(stream()), "synchronize"); }
void set_sync_debug(bool on) { sync_debug_flag = on; }
bool sync_debug() { return sync_debug_flag; }

namespace {
std::atomic<bool> warpgroup_attention{true}, warpgroup_gemm{true};
}  // namespace
void enable_warpgroup_attention(bool on) { warpgroup_attention = on; }
bool warpgroup_attention_enabled() { return warpgroup_attention; }
void enable_warpgroup_gemm(bool on) { warpgroup_gemm = on; }
bool warpgroup_gemm_enabled() { return warpgroup_gemm; }

Context& context() {
  static Context ctx;
  static std::once_flag once;
  std::call_once(once, [] {
    TG_CHECK(is_available(), "cuda: no CUDA device is available");
    TG_CUDA_CHECK(cudaGetDevice(&ctx.device), "cuda context");
    TG_CUDA_CHECK(cudaDeviceGetAttribute(&ctx.sm_count, cudaDevAttrMultiProcessorCount, ctx.device),
                  "cuda context");
    TG_CUDA_CHECK(cudaDeviceGetAttribute(&ctx.major, cudaDevAttrComputeCapabilityMajor, ctx.device), "cuda context");
    TG_CUDA_CHECK(cudaDeviceGetAttribute(&ctx.minor, cudaDevAttrComputeCapabilityMinor, ctx.device), "cuda context");
    TG_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking), "cuda context");
    TG_CUDA_CHECK(cublasCreate(&ctx.cublas), "cuda context");
    for (void** workspace : {&ctx.cublas_workspace, &ctx.side_cublas_workspace})
      TG_CUDA_CHECK(cudaMalloc(workspace, kCublasWorkspace), "cuda context");
    // Zeroed once: cuBLAS's split-k reduction (splitKreduce_kernel) reads
    // parts of a workspace that its GEMM did not write, reads
    // compute-sanitizer's initcheck reports as uninitialized; zeroed, they
    // are defined. The memsets run on the legacy stream, which tapegrad's non-blocking
    // streams do not wait for: the device sync orders it before any GEMM.
    for (void* workspace : {ctx.cublas_workspace, ctx.side_cublas_workspace})
      TG_CUDA_CHECK(cudaMemset(workspace, 0, kCublasWorkspace), "cuda context");
    TG_CUDA_CHECK(cudaDeviceSynchronize(), "cuda context");
    TG_CUDA_CHECK(cudnnCreate(&ctx.cudnn), "cuda context");
  });
  return ctx;
}

void check(cudaError_t status, const char* op, const char* call) {
  TG_CHECK(status == cudaSuccess, op, ": CUDA call ", call, " failed: ", cudaGetErrorName(status),
           " (", cudaGetErrorString(status), ")");
}

void check(cublasStatus_t status, const char* op, const char* call) {
  TG_CHECK(status == CUBLAS_STATUS_SUCCESS, op, ": cuBLAS call ", call, " failed: ",
           cublasGetStatusName(status), " (", cublasGetStatusString(status), ")");
}

void check(cudnnStatus_t status, const char* op, const char* call) {
  TG_CHECK(status == CUDNN_STATUS_SUCCESS, op, ": cuDNN call ", call, " failed: ",
           cudnnGetErrorString(status));
}

void report_failure(cudaError_t status, const char* op, const char* call) {
  if (status != cudaSuccess) std::fprintf(stderr, "tapegrad: %s: %s failed: %s\n", op, call, cudaGetErrorString(status));
}

void check_launch(const char* op) {
  check(cudaGetLastError(), op, "kernel launch");
  if (sync_debug_flag) check(cudaStreamSynchronize(stream()), op, "kernel (TG_CUDA_SYNC=1)");
}

}  // namespace tg::cuda
