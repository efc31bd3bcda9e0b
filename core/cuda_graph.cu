// GraphReplay (core/cuda.h): repeated calls replayed from a CUDA graph.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/cuda.h"
#include "core/cuda_allocator.h"
#include "core/cuda_context.h"
#include "core/error.h"

namespace tg::cuda {

struct GraphReplay::State {
  std::mutex mutex;
  std::string key;                 // the key of the calls in a row
  int calls = 0;                   // how many calls in a row had it
  bool direct = false;             // its capture failed: run directly
  cudaGraphExec_t exec = nullptr;  // its graph, once captured
  std::size_t releases = 0;        // cache_releases() when captured
  std::size_t launches = 0;
  cudaStream_t side = nullptr;     // the private stream
  cudaEvent_t fork = nullptr, join = nullptr;

  void drop_graph() {
    if (exec) cudaGraphExecDestroy(exec);  // a launch in flight completes first
    exec = nullptr;
  }
  void make_stream() {
    if (side) return;
    TG_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "graph replay");
    TG_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "graph replay");
    TG_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "graph replay");
  }
  // Captures `work` on the private stream into `exec`; false (nothing
  // captured, no error left behind) where the capture or instantiation fails.
  bool capture(const std::function<void()>& work) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamBeginCapture(side, cudaStreamCaptureModeRelaxed) != cudaSuccess) return cudaGetLastError(), false;
    bool ok = true;
    try {
      const StreamGuard guard(side);
      work();
    } catch (...) {  // e.g. a call that capture does not allow
      ok = false;
    }
    ok = cudaStreamEndCapture(side, &graph) == cudaSuccess && ok;
    ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // a failed capture's error is not the caller's
    if (!ok) exec = nullptr;
    releases = cache_releases();
    return ok;
  }
  // The second call warms the private stream's cache; the third captures
  // (or, where that fails, runs directly from then on); later ones launch.
  void run_on_side(const std::function<void()>& work) {
    if (calls == 2 || (!exec && !capture(work))) {
      direct = calls > 2;
      const StreamGuard guard(side);
      return work();
    }
    TG_CUDA_CHECK(cudaGraphLaunch(exec, side), "graph replay");
    ++launches;
  }
};

namespace {

bool graphs_allowed(cudaStream_t stream) {
  static const bool off = [] {
    const char* v = std::getenv("TG_CUDA_GRAPHS");
    return v && std::string(v) == "0";
  }();
  if (off || !caching_enabled() || sync_debug()) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) return cudaGetLastError(), false;
  return status == cudaStreamCaptureStatusNone;
}

}  // namespace

GraphReplay::GraphReplay() : state_(std::make_unique<State>()) {}
GraphReplay::~GraphReplay() = default;  // the stream, events and graph stay: launches may be in flight

std::size_t GraphReplay::launches() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->launches;
}

void GraphReplay::run(const std::string& key, void* stream, const std::function<void()>& work) {
  const auto caller = static_cast<cudaStream_t>(stream);
  const auto direct = [&] {
    const StreamGuard guard(stream);
    work();
  };
  if (!graphs_allowed(caller)) return direct();
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (key != s.key || (s.exec && s.releases != cache_releases())) {
    s.drop_graph();
    s.calls = key != s.key ? 0 : 1;  // a new key starts over; a stale graph warms the cache again
    s.direct = false;
    s.key = key;
  }
  s.calls = std::min(s.calls + 1, 3);
  if (s.calls == 1 || s.direct) return direct();
  s.make_stream();
  // The private stream's work after the caller's stream's so far, and the caller's stream's next work after it.
  TG_CUDA_CHECK(cudaEventRecord(s.fork, caller), "graph replay");
  TG_CUDA_CHECK(cudaStreamWaitEvent(s.side, s.fork, 0), "graph replay");
  try {
    s.run_on_side(work);
  } catch (...) {
    cudaEventRecord(s.join, s.side);
    cudaStreamWaitEvent(caller, s.join, 0);
    throw;
  }
  TG_CUDA_CHECK(cudaEventRecord(s.join, s.side), "graph replay");
  TG_CUDA_CHECK(cudaStreamWaitEvent(caller, s.join, 0), "graph replay");
}

}  // namespace tg::cuda
