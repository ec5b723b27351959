// Capturing an instruction loop as a CUDA graph, updating its stepped
// kernels, replaying it.
#include "cuda/StepGraph.h"

#include "core/Error.h"
#include "cuda/CudaCheck.h"

#include <cuda.h>

#include <algorithm>
#include <numeric>
#include <type_traits>
#include <utility>

namespace mtrt::cuda {

namespace {

/// Ends a capture that an exception left open, dropping what it captured
/// (the error that ended it is the exception's).
class CaptureGuard {
public:
  explicit CaptureGuard(cudaStream_t stream) : stream_(stream) {}
  ~CaptureGuard() {
    if (!open_)
      return;
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream_, &partial);
    if (partial)
      cudaGraphDestroy(partial);
    (void)cudaGetLastError(); // the invalidated capture's error, if any
  }
  CaptureGuard(const CaptureGuard &) = delete;
  CaptureGuard &operator=(const CaptureGuard &) = delete;

  cudaGraph_t end(const std::string &what) {
    open_ = false;
    cudaGraph_t graph = nullptr;
    MTRT_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph),
                    what + ": ending the capture");
    return graph;
  }

private:
  cudaStream_t stream_;
  bool open_ = true;
};

/// Destroys a graph unless released.
struct GraphOwner {
  cudaGraph_t graph = nullptr;
  ~GraphOwner() {
    if (graph)
      cudaGraphDestroy(graph);
  }
  cudaGraph_t release() { return std::exchange(graph, nullptr); }
};

/// The driver's kernel-node calls, which take any kernel node (the runtime's
/// cudaGraphKernelNodeGetParams may refuse kernels not registered with it:
/// cuBLASLt's, or the generated kernels' library handles, FusedKernels).
struct KernelNodeCalls {
  CUresult (*getParams)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *) = nullptr;
  CUresult (*setParams)(CUgraphExec, CUgraphNode,
                        const CUDA_KERNEL_NODE_PARAMS *) = nullptr;
};

const KernelNodeCalls &kernelNodeCalls(const std::string &what) {
  static const KernelNodeCalls calls = [&] {
    KernelNodeCalls found;
    auto load = [&](const char *symbol, auto &pointer) {
      void *address = nullptr;
      cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSuccess;
      // Their CUDA 12.0 signatures (the _v2 calls of cuda.h).
      MTRT_CUDA_CHECK(cudaGetDriverEntryPointByVersion(
                          symbol, &address, 12000, cudaEnableDefault, &status),
                      what + ": finding the driver's " + symbol);
      if (!address || status != cudaDriverEntryPointSuccess)
        throw Error(MTRT_STATUS_UNAVAILABLE,
                    what + ": the CUDA driver has no " + symbol +
                        " (CUDA 12.0 or later)");
      pointer =
          reinterpret_cast<std::remove_reference_t<decltype(pointer)>>(address);
    };
    load("cuGraphKernelNodeGetParams", found.getParams);
    load("cuGraphExecKernelNodeSetParams", found.setParams);
    return found;
  }();
  return calls;
}

/// Checks a driver call's result.
void checkDriver(CUresult result, const char *call, const std::string &what) {
  if (result == CUDA_SUCCESS)
    return;
  throw Error(MTRT_STATUS_INTERNAL,
              what + ": " + call + " failed (CUresult " +
                  std::to_string(static_cast<int>(result)) + ")");
}

/// The nodes the capture's next node will depend on.
std::vector<cudaGraphNode_t> captureFrontier(cudaStream_t stream,
                                             const std::string &what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t *nodes = nullptr;
  const cudaGraphEdgeData *edges = nullptr;
  size_t count = 0;
  MTRT_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr,
                                           &nodes, &edges, &count),
                  what + ": reading the capture's dependencies");
  if (status != cudaStreamCaptureStatusActive)
    throw Error(MTRT_STATUS_INTERNAL,
                what + ": the stream's capture was invalidated");
  return std::vector<cudaGraphNode_t>(nodes, nodes + count);
}

/// The kernel nodes captured between frontiers `before` and `after`, in
/// launch order: walked back from `after` to `before` (one stream's capture
/// is a chain; anything else is refused).
std::vector<cudaGraphNode_t>
kernelsBetween(const std::vector<cudaGraphNode_t> &before,
               const std::vector<cudaGraphNode_t> &after,
               const std::string &what) {
  std::vector<cudaGraphNode_t> kernels;
  if (after == before)
    return kernels; // nothing captured
  auto notAChain = [&](size_t count) {
    return Error(MTRT_STATUS_UNIMPLEMENTED,
                 what + ": a captured node has " + std::to_string(count) +
                     " neighbours where a chain has one (work forked off "
                     "the stream); its kernels cannot be told apart");
  };
  if (after.size() != 1)
    throw notAChain(after.size());
  auto captured = [&](cudaGraphNode_t node) { // after `before`
    return std::find(before.begin(), before.end(), node) == before.end();
  };
  cudaGraphNode_t node = after[0];
  for (;;) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    MTRT_CUDA_CHECK(cudaGraphNodeGetType(node, &type), what);
    if (type == cudaGraphNodeTypeKernel)
      kernels.push_back(node);
    constexpr size_t kMost = 8;
    cudaGraphNode_t dependencies[kMost] = {};
    cudaGraphEdgeData edges[kMost] = {};
    size_t count = kMost;
    MTRT_CUDA_CHECK(
        cudaGraphNodeGetDependencies(node, dependencies, edges, &count), what);
    if (count == 0 && before.empty())
      break; // the graph's first node
    if (count > 0 && count < kMost &&
        std::none_of(dependencies, dependencies + count, captured))
      break; // the instruction's first node
    if (count != 1)
      throw notAChain(count);
    node = dependencies[0];
  }
  std::reverse(kernels.begin(), kernels.end());
  return kernels;
}

} // namespace

StepGraph::~StepGraph() { reset(); }

void StepGraph::reset() {
  if (exec_)
    cudaGraphExecDestroy(exec_);
  if (graph_)
    cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
  nodeCount_ = 0;
  segments_.clear();
  steppedPositions_.clear();
  stepped_.clear();
}

size_t StepGraph::steppedKernelCount() const {
  size_t count = 0;
  for (const Segment &segment : segments_)
    count += segment.kernels.size();
  return count;
}

cudaGraph_t StepGraph::captureInto(cudaStream_t stream,
                                   const std::vector<size_t> &positions,
                                   const std::vector<bool> &stepped,
                                   const Enqueue &enqueue,
                                   std::vector<Segment> &segments,
                                   const std::string &what,
                                   const Enqueue &before, size_t end) {
  // Thread-local mode: a call of this thread that cannot be captured (a
  // synchronization, a blocking copy) fails instead of breaking the graph.
  MTRT_CUDA_CHECK(
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
      what + ": beginning the capture");
  std::vector<std::vector<cudaGraphNode_t>> frontiersBefore, frontiersAfter;
  GraphOwner graph;
  {
    CaptureGuard guard(stream);
    for (size_t position : positions) {
      if (before)
        before(position);
      if (!stepped[position]) {
        enqueue(position);
        continue;
      }
      frontiersBefore.push_back(captureFrontier(stream, what));
      enqueue(position);
      frontiersAfter.push_back(captureFrontier(stream, what));
    }
    if (before)
      before(end);
    graph.graph = guard.end(what);
  }
  segments.clear();
  size_t k = 0;
  for (size_t position : positions)
    if (stepped[position]) {
      segments.push_back({position, kernelsBetween(frontiersBefore[k],
                                                   frontiersAfter[k], what)});
      ++k;
    }
  return graph.release();
}

void StepGraph::capture(cudaStream_t stream, size_t count,
                        const std::vector<bool> &stepped,
                        const Enqueue &enqueue, const std::string &what,
                        const Enqueue &before) {
  reset();
  std::vector<size_t> positions(count);
  std::iota(positions.begin(), positions.end(), size_t(0));
  graph_ = captureInto(stream, positions, stepped, enqueue, segments_, what,
                       before, count);
  stepped_ = stepped;
  for (const Segment &segment : segments_)
    steppedPositions_.push_back(segment.position);
  MTRT_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &nodeCount_),
                  what + ": counting the graph's nodes");
}

void StepGraph::instantiate(const std::string &what) {
  MTRT_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0),
                  what + ": instantiating the CUDA graph of " +
                      std::to_string(nodeCount_) + " nodes");
}

void StepGraph::refresh(cudaStream_t stream, const Enqueue &enqueue,
                        const std::string &what) {
  if (steppedPositions_.empty())
    return;
  const KernelNodeCalls &calls = kernelNodeCalls(what);
  std::vector<Segment> now;
  GraphOwner side;
  side.graph = captureInto(stream, steppedPositions_, stepped_, enqueue, now,
                           what + " (the stepped instructions)");
  for (size_t s = 0; s < now.size(); ++s) {
    const Segment &old = segments_[s];
    if (now[s].kernels.size() != old.kernels.size())
      throw Error(MTRT_STATUS_INTERNAL,
                  what + ": instruction " + std::to_string(old.position) +
                      " captured " + std::to_string(now[s].kernels.size()) +
                      " kernels, and " + std::to_string(old.kernels.size()) +
                      " in the graph");
    std::string where = what + ": instruction " + std::to_string(old.position);
    for (size_t k = 0; k < old.kernels.size(); ++k) {
      CUDA_KERNEL_NODE_PARAMS params{};
      checkDriver(calls.getParams(now[s].kernels[k], &params),
                  "cuGraphKernelNodeGetParams", where);
      checkDriver(calls.setParams(exec_, old.kernels[k], &params),
                  "cuGraphExecKernelNodeSetParams", where);
    }
  }
}

void StepGraph::upload(cudaStream_t stream, const std::string &what) {
  MTRT_CUDA_CHECK(cudaGraphUpload(exec_, stream),
                  what + ": uploading its CUDA graph");
}

void StepGraph::launch(cudaStream_t stream, const std::string &what) {
  MTRT_CUDA_CHECK(cudaGraphLaunch(exec_, stream),
                  what + ": launching its CUDA graph");
}

} // namespace mtrt::cuda
