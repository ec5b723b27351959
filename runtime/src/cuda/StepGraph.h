// A function's instruction loop captured once as a CUDA graph and replayed,
// with the kernels that depend on the step brought up to date before each
// replay.
#ifndef MTRT_SRC_CUDA_STEPGRAPH_H
#define MTRT_SRC_CUDA_STEPGRAPH_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace mtrt::cuda {

/// What the executor replays instead of enqueuing its instructions one by
/// one (ContextOptions::cudaGraphs).
///
/// The graph holds the pointers and arguments of the run it was captured
/// from. What changes between runs must therefore be in device memory the
/// graph reads (inputs are uploaded into the same slots before the launch,
/// outputs copied after it) or be updated in the graph: the instructions
/// marked `stepped` (dropout keys are arguments, keyed on the step) are
/// recaptured on the side before a replay at a new step, and their kernels'
/// arguments copied into the executable graph
/// (cudaGraphExecKernelNodeSetParams), so that kernel signatures stay as
/// they are. Each instruction's nodes are told apart by the capture's
/// dependency set before and after it (one stream: a chain).
///
/// Every CUDA call is checked; a failure throws Error naming `what` and the
/// call, and leaves the stream out of capture (the graph is then reset).
///
/// Thread-safety: none; one executor's runs.
class StepGraph {
public:
  /// Enqueues instruction `position` on the stream being captured.
  using Enqueue = std::function<void(size_t position)>;

  StepGraph() = default;
  ~StepGraph();
  StepGraph(const StepGraph &) = delete;
  StepGraph &operator=(const StepGraph &) = delete;

  /// Captures enqueue(0), ..., enqueue(count - 1) on `stream` (nothing
  /// runs; instantiate() makes it launchable); `stepped[p]` marks the
  /// instructions
  /// refresh() updates. `before`, if given, is called before each
  /// enqueue(p) with p and once more with `count` at the end: the joins of
  /// work forked onto other streams (an executor's communication stream),
  /// kept out of the stepped instructions' nodes.
  void capture(cudaStream_t stream, size_t count,
               const std::vector<bool> &stepped, const Enqueue &enqueue,
               const std::string &what, const Enqueue &before = nullptr);
  /// Instantiates the captured graph (captured() is true after).
  void instantiate(const std::string &what);
  /// Recaptures the stepped instructions as enqueue gives them now and
  /// copies their kernels' arguments into the executable graph. Throws
  /// Error (INTERNAL) if an instruction no longer captures the same kernels.
  void refresh(cudaStream_t stream, const Enqueue &enqueue,
               const std::string &what);
  /// Enqueues one replay on `stream`.
  void launch(cudaStream_t stream, const std::string &what);
  /// Uploads the executable graph on `stream` without running it, which
  /// the first launch does otherwise (cudaGraphUpload): a launch that must
  /// not wait on the host (PeerGroup's gated launches) is then only an
  /// enqueue.
  void upload(cudaStream_t stream, const std::string &what);
  /// Destroys the graph (captured() is false after).
  void reset();

  bool captured() const { return exec_ != nullptr; }
  /// Nodes of the captured graph.
  size_t nodeCount() const { return nodeCount_; }
  /// Kernel nodes refresh() updates.
  size_t steppedKernelCount() const;

private:
  /// The kernel nodes of one stepped instruction, in launch order.
  struct Segment {
    size_t position;
    std::vector<cudaGraphNode_t> kernels;
  };

  /// Captures on `stream`: enqueue(p) for each p in `positions`, the
  /// stepped ones' kernel nodes into `segments` (one per stepped position).
  static cudaGraph_t
  captureInto(cudaStream_t stream, const std::vector<size_t> &positions,
              const std::vector<bool> &stepped, const Enqueue &enqueue,
              std::vector<Segment> &segments, const std::string &what,
              const Enqueue &before = nullptr, size_t end = 0);

  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodeCount_ = 0;
  std::vector<Segment> segments_;
  std::vector<size_t> steppedPositions_;
  std::vector<bool> stepped_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_STEPGRAPH_H
