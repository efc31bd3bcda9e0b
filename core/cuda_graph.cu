// GraphReplay (core/cuda.h): repeated calls replayed from a CUDA graph.
#include <algorithm>
#include <mutex>
#include <string>

#include "core/cuda.h"
#include "core/cuda_allocator.h"
#include "core/cuda_context.h"
#include "core/error.h"

namespace tg::cuda {

namespace {

constexpr int kMaxFailedCaptures = 3;  // then a key runs directly for good

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess) return status != cudaStreamCaptureStatusNone;
  cudaGetLastError();  // e.g. the legacy stream while another stream captures: treated as capturing
  return true;
}

int current_device() {
  int device = 0;
  TG_CUDA_CHECK(cudaGetDevice(&device), "graph replay");
  return device;
}

}  // namespace

bool graph_replay_enabled() {
  static const bool off = env_is("TG_CUDA_GRAPHS", "0");
  return !off && caching_enabled() && !sync_debug();
}

struct GraphReplay::State {
  std::mutex mutex;
  std::string key;                 // the key of the calls in a row
  int calls = 0;                   // how many calls in a row had it (counted up to 3)
  int failed_captures = 0;         // of this key
  bool keeps_memory = false;       // its work left blocks allocated: never captured
  cudaGraphExec_t exec = nullptr;  // its graph, once captured
  std::size_t launches = 0;
  int device = -1;                 // the private stream's
  SideStream side;                 // the private stream

  bool runs_directly() const { return calls == 1 || failed_captures >= kMaxFailedCaptures || keeps_memory; }

  void start(const std::string& k) {
    drop_graph();
    key = k;
    calls = failed_captures = 0;
    keeps_memory = false;
  }

  void drop_graph() {
    if (!exec) return;
    report_failure(cudaGraphExecDestroy(exec), "graph replay", "cudaGraphExecDestroy");  // a launch in flight completes first
    exec = nullptr;
    unpin_stream(side.stream);  // its blocks may go once the device is synchronised (as empty_cache does first)
  }

  void make_stream() {
    if (side.stream) return;
    side = SideStream::create("graph replay", StreamPriority::kCritical);
    device = current_device();
  }

  // The second call: fills the private stream's cache with the blocks the
  // capture will take, and checks that the work returns them all.
  void warm(const std::function<void()>& work) {
    const std::size_t live = memory_stats().live_blocks;
    {
      const StreamGuard guard(side.stream);
      work();
    }
    keeps_memory = memory_stats().live_blocks != live;
  }

  // Captures `work` on the private stream into `exec`, with the stream's
  // blocks pinned from before the work returns them; false (nothing captured,
  // nothing pinned, no error left behind) where the capture fails.
  bool capture(const std::function<void()>& work) {
    pin_stream(side.stream);
    cudaGraph_t graph = nullptr;
    bool ok = cudaStreamBeginCapture(side.stream, cudaStreamCaptureModeRelaxed) == cudaSuccess;
    if (ok) {
      try {
        const StreamGuard guard(side.stream);
        work();
      } catch (...) {  // e.g. a call that capture does not allow
        ok = false;
      }
      ok = cudaStreamEndCapture(side.stream, &graph) == cudaSuccess && ok;
    }
    // Each kernel node at its capture stream's priority: the private stream's
    // critical path before the Forks' side work (SideStream).
    ok = ok && cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority) == cudaSuccess;
    if (graph) report_failure(cudaGraphDestroy(graph), "graph replay", "cudaGraphDestroy");
    if (!ok) {
      cudaGetLastError();  // the failed capture's error, not the caller's
      exec = nullptr;
      unpin_stream(side.stream);
    }
    return ok;
  }

  // The call's work on the private stream: the second call warms, the third
  // captures (running the work directly if that fails), later ones launch.
  void run_on_side(const std::function<void()>& work) {
    if (calls == 2) return warm(work);
    if (!exec && !capture(work)) {
      ++failed_captures;
      const StreamGuard guard(side.stream);
      return work();
    }
    TG_CUDA_CHECK(cudaGraphLaunch(exec, side.stream), "graph replay");
    ++launches;
  }
};

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
  if (!graph_replay_enabled() || capturing(caller)) return direct();
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (key != s.key) s.start(key);
  s.calls = std::min(s.calls + 1, 3);
  if (s.runs_directly() || (s.side.stream && current_device() != s.device)) return direct();
  s.make_stream();
  // The private stream's work after the caller's stream's so far, and the caller's stream's next work after it.
  s.side.follow(caller, "graph replay");
  try {
    s.run_on_side(work);
  } catch (...) {
    s.side.rejoin_reporting(caller, "graph replay");
    throw;
  }
  s.side.rejoin(caller, "graph replay");
}

}  // namespace tg::cuda
