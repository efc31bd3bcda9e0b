#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda.h"
#include "core/cuda_context.h"
#include "core/error.h"

namespace tg::cuda {

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::string(v) == value;
}

namespace {
bool sync_debug_flag = env_is("TG_CUDA_SYNC", "1");

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
  uint64_t serial = 0;            // this thread's forks in the order made, from 1
  bool nested = false;            // made inside another fork's side work
};

namespace {
thread_local const Fork::Lane* running_lane = nullptr;  // whose side work runs now (null: none)
thread_local uint64_t forks_made = 0;

// Sets running_lane for a scope and restores the outer one (a fork inside side work).
class RunningLane {
 public:
  explicit RunningLane(const Fork::Lane* lane) : outer_(running_lane) { running_lane = lane; }
  ~RunningLane() { running_lane = outer_; }
  RunningLane(const RunningLane&) = delete;
  RunningLane& operator=(const RunningLane&) = delete;

 private:
  const Fork::Lane* outer_;
};

// The side cuBLAS workspace (cublas_workspace, below): the fork holding it
// (its serial; 0: none), and the first fork that may take it next: one made
// after the last holder's join, so that its side stream follows the origin's
// wait for the last holder's work.
struct SideWorkspace {
  uint64_t holder = 0;
  uint64_t first_free_serial = 0;
};
thread_local SideWorkspace side_workspace;

void release_side_workspace(const Fork::Lane& lane) {
  if (side_workspace.holder == lane.serial) side_workspace = {0, forks_made + 1};
}

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

bool allocation_forbidden() { return running_lane != nullptr; }

Fork::Fork(bool on) {
  if (!on) return;
  context();
  Lane lane = take_lane(stream());
  lane.serial = ++forks_made;
  lane.nested = running_lane != nullptr;
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
  const RunningLane running(lane_.get());
  work();
}

// The origin waits for the side work, and the side workspace is free again,
// even where the rejoin fails: in an invalidated graph capture (whose work
// never runs) or on a broken context.
void Fork::join() {
  if (!lane_) return;
  const Lane lane = *lane_;
  lane_.reset();
  lanes.free.push_back(lane);
  release_side_workspace(lane);
  lane.side.rejoin(lane.origin, "cuda fork (join)");
}

Fork::~Fork() {
  if (!lane_) return;
  release_side_workspace(*lane_);
  lane_->side.rejoin_reporting(lane_->origin, "cuda fork (join)");
  lanes.free.push_back(*lane_);
}

void* cublas_workspace() {
  Context& ctx = context();
  if (running_lane == nullptr) return ctx.cublas_workspace;
  const Fork::Lane& lane = *running_lane;
  TG_CHECK(!lane.nested, "cuda fork: cuBLAS called in the side work of a fork made inside another fork's side work "
                         "(the side workspace serves forks made outside side work)");
  const bool available = side_workspace.holder == 0 && lane.serial >= side_workspace.first_free_serial;
  TG_CHECK(side_workspace.holder == lane.serial || available,
           "cuda fork: cuBLAS called in side work while the side workspace is ",
           side_workspace.holder != 0 ? "held by another fork" : "free only for forks made after its last holder's join",
           " (one fork at a time may call cuBLAS, each made after the last holder's join)");
  side_workspace.holder = lane.serial;
  return ctx.side_cublas_workspace;
}

cublasHandle_t cublas() {
  Context& ctx = context();
  void* workspace = cublas_workspace();
  // Setting the stream also drops the workspace, so both are set together.
  TG_CUDA_CHECK(cublasSetStream(ctx.cublas, stream()), "cuda context");
  TG_CUDA_CHECK(cublasSetWorkspace(ctx.cublas, workspace, kCublasWorkspace), "cuda context");
  return ctx.cublas;
}

cublasLtHandle_t cublas_lt() { return context().cublas_lt; }

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
std::atomic<bool> warpgroup_attention{true}, warpgroup_gemm{true}, fp16_product_output{true};
std::atomic<bool> overlapped_launch{!env_is("TG_OVERLAPPED_LAUNCH", "0")};
}  // namespace
void enable_warpgroup_attention(bool on) { warpgroup_attention = on; }
bool warpgroup_attention_enabled() { return warpgroup_attention; }
void enable_warpgroup_gemm(bool on) { warpgroup_gemm = on; }
bool warpgroup_gemm_enabled() { return warpgroup_gemm; }
void enable_fp16_product_output(bool on) { fp16_product_output = on; }
bool fp16_product_output_enabled() { return fp16_product_output; }
void enable_overlapped_launch(bool on) { overlapped_launch = on; }
bool overlapped_launch_enabled() { return overlapped_launch; }

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
    TG_CUDA_CHECK(cudaDeviceGetAttribute(&ctx.l2_bytes, cudaDevAttrL2CacheSize, ctx.device), "cuda context");
    TG_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking), "cuda context");
    TG_CUDA_CHECK(cublasCreate(&ctx.cublas), "cuda context");
    TG_CUDA_CHECK(cublasLtCreate(&ctx.cublas_lt), "cuda context");
    for (void** workspace : {&ctx.cublas_workspace, &ctx.side_cublas_workspace})
      TG_CUDA_CHECK(cudaMalloc(workspace, kCublasWorkspace), "cuda context");
    // Zeroed once: cuBLAS's split-k reduction (splitKreduce_kernel) reads
    // parts of a workspace that its GEMM did not write, reads
    // compute-sanitizer's initcheck reports as uninitialized; zeroed, they
    // are defined. The memsets run on the legacy stream, which tapegrad's
    // non-blocking streams do not wait for: the device sync orders them
    // before any GEMM.
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

void report_failure(cublasStatus_t status, const char* op, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    std::fprintf(stderr, "tapegrad: %s: %s failed: %s\n", op, call, cublasGetStatusName(status));
}

bool kernel_waits(const void* kernel, const char* op) {
  static std::mutex mutex;
  static std::unordered_map<const void*, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find(kernel);
  if (found != known.end()) return found->second;
  cudaFuncAttributes attributes{};
  TG_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel), op);
  return known[kernel] = attributes.ptxVersion >= 90;
}

void check_launch(const char* op) {
  check(cudaGetLastError(), op, "kernel launch");
  if (sync_debug_flag) check(cudaStreamSynchronize(stream()), op, "kernel (TG_CUDA_SYNC=1)");
}

}  // namespace tg::cuda
