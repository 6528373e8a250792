// A CUDA graph of work captured from a stream, replayed with one launch.
#pragma once

#include <functional>

namespace flextile::runtime {

class Device;
class Stream;

// Move-only. `Graph::capture(stream, record)` runs `record`, which queues work on `stream` (FlexTile
// calls given that stream, say a decode step), without running it: the driver records the
// launches and copies into a graph, instantiated here. `launch` then queues all of it again with
// one driver call — the arguments, addresses and grid each launch had at capture, so what changes
// from replay to replay must live in device memory the kernels read (a serving loop's query
// offsets, page table and lengths, the new tokens' queries), not in host values.
//
// A capture must not allocate, upload or synchronize: run the same calls once before capturing
// them, so that their kernels are compiled and loaded and their lists and scratch exist (a decode
// call then only launches). The stream must be one FlexTile created or borrowed, not the legacy
// default stream, which cannot be captured. Capture is thread-local: other threads' calls are not
// recorded and are not refused.
class Graph {
 public:
  static Graph capture(Stream& stream, const std::function<void()>& record);
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Queues the captured work on `stream`: it runs after what the stream already holds, and what is
  // queued next runs after it. Replay on the stream of the capture: FlexTile's calls keep their
  // scratch per stream, and the graph uses that stream's, which another stream's replay would share
  // with the capture stream's own work at the same time.
  void launch(Stream& stream) const;
  bool empty() const { return exec_ == nullptr; }

 private:
  void destroy();
  void* graph_ = nullptr;  // CUgraph
  void* exec_ = nullptr;   // CUgraphExec
  Device* device_ = nullptr;
};

// Whether this process has captured a graph: a buffer replaced after that may be one a graph
// replays, and is kept instead of freed (attention_templates' scratch).
bool anyGraphCaptured();

}  // namespace flextile::runtime
