#include "runtime/Graph.h"

#include "runtime/Device.h"
#include "runtime/DriverApi.h"
#include "runtime/DriverError.h"
#include "runtime/Stream.h"

#include <atomic>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

namespace flextile::runtime {

namespace {

const cu::Api& graphApi(const char* what) {
  const cu::Api& api = cu::api();
  if (!api.streamBeginCapture || !api.streamEndCapture || !api.graphInstantiate || !api.graphLaunch ||
      !api.graphExecDestroy || !api.graphDestroy)
    throw DriverError(std::string(what) +
                      ": this CUDA driver has no stream capture or graph launch (cuStreamBeginCapture_v2, "
                      "cuStreamEndCapture, cuGraphInstantiateWithFlags, cuGraphLaunch): run the calls without a "
                      "graph");
  return api;
}

std::atomic<bool> gCaptured{false};

constexpr const char* kAdvice =
    " (a captured call must only launch: run the same calls once before capturing them, so that their "
    "kernels, lists and scratch exist, and give every call of the capture the capturing stream)";

}  // namespace

Graph Graph::capture(Stream& stream, const std::function<void()>& record) {
  const cu::Api& api = graphApi("Graph::capture");
  if (!stream.handle())
    throw DriverError(
        "Graph::capture: the legacy default stream cannot be captured; create a runtime::Stream (or borrow a "
        "framework's) and give it to every call of the capture");
  Device* device = stream.device();
  device->makeCurrent();
  gCaptured.store(true, std::memory_order_relaxed);
  const auto handle = static_cast<cu::Stream>(stream.handle());
  cu::check(api.streamBeginCapture(handle, cu::kStreamCaptureModeThreadLocal), "cuStreamBeginCapture_v2",
            "starting a capture on a stream of device " + std::to_string(device->ordinal()));
  cu::Graph graph = nullptr;
  // The stream must leave capture mode whatever `record` threw, or every later use of it fails.
  auto abandon = [&] {
    if (api.streamEndCapture(handle, &graph) == cu::kSuccess && graph) api.graphDestroy(graph);
  };
  try {
    record();
  } catch (const DriverError& e) {
    abandon();
    // A driver call the capture refused (an upload, a synchronous copy or wait): say why.
    throw DriverError(std::string(e.what()) + "; while capturing a graph" + kAdvice);
  } catch (...) {
    abandon();
    throw;
  }
  const cu::Result ended = api.streamEndCapture(handle, &graph);
  if (ended != cu::kSuccess) {
    if (graph) api.graphDestroy(graph);
    cu::check(ended, "cuStreamEndCapture", std::string("the captured work could not become a graph") + kAdvice);
  }
  Graph out;
  out.device_ = device;
  out.graph_ = graph;
  cu::GraphExec exec = nullptr;
  cu::check(api.graphInstantiate(&exec, graph, 0), "cuGraphInstantiateWithFlags", "instantiating a captured graph");
  out.exec_ = exec;
  return out;
}

void Graph::launch(Stream& stream) const {
  if (!exec_) throw DriverError("Graph::launch: an empty graph (default-constructed or moved from)");
  const cu::Api& api = graphApi("Graph::launch");
  if (stream.device() != device_)
    throw DriverError("Graph::launch: the graph was captured on device " + std::to_string(device_->ordinal()) +
                      ", the stream is on device " + std::to_string(stream.device()->ordinal()));
  device_->makeCurrent();
  cu::check(api.graphLaunch(static_cast<cu::GraphExec>(exec_), static_cast<cu::Stream>(stream.handle())),
            "cuGraphLaunch", "replaying a captured graph");
}

bool anyGraphCaptured() { return gCaptured.load(std::memory_order_relaxed); }

Graph::~Graph() { destroy(); }

Graph::Graph(Graph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)),
      exec_(std::exchange(other.exec_, nullptr)),
      device_(std::exchange(other.device_, nullptr)) {}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    destroy();
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
    device_ = std::exchange(other.device_, nullptr);
  }
  return *this;
}

void Graph::destroy() {
  if (!graph_ && !exec_) return;
  const cu::Api& api = cu::api();
  const char* failed = "cuCtxSetCurrent";
  cu::Result result = api.ctxSetCurrent(static_cast<cu::Context>(device_->context()));
  if (result == cu::kSuccess && exec_) {
    failed = "cuGraphExecDestroy";
    result = api.graphExecDestroy(static_cast<cu::GraphExec>(exec_));
  }
  if (result == cu::kSuccess && graph_) {
    failed = "cuGraphDestroy";
    result = api.graphDestroy(static_cast<cu::Graph>(graph_));
  }
  if (result != cu::kSuccess && result != cu::kErrorDeinitialized)
    std::fprintf(stderr, "flextile: %s\n", DriverError::format(failed, result, "").c_str());
  graph_ = exec_ = nullptr;
}

}  // namespace flextile::runtime
