//===- ClusterSpec.cpp - The machines a plan is for -----------------------===//

#include "megatron/Memory/Memory.h"
#include "megatron/Planner/Planner.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

using namespace megatron;

namespace {
/// Reads the optional positive numbers of a cluster file, naming the key.
struct ClusterReader {
  const llvm::json::Object &root;
  llvm::StringRef source;
  std::string error;

  void number(llvm::StringRef object, llvm::StringRef key, double &out) {
    if (!error.empty())
      return;
    const llvm::json::Object *holder = &root;
    std::string path = key.str();
    if (!object.empty()) {
      holder = root.getObject(object);
      path = (object + "." + key).str();
      if (!holder) {
        if (root.get(object))
          error = llvm::formatv("{0}: '{1}' is not an object", source, object);
        return;
      }
    }
    const llvm::json::Value *value = holder->get(key);
    if (!value)
      return;
    std::optional<double> number = value->getAsNumber();
    if (!number || !(*number > 0)) {
      std::string shown;
      llvm::raw_string_ostream os(shown);
      os << *value;
      error = llvm::formatv("{0}: the cluster's '{1}' is {2}; expected a "
                            "number above 0 (docs/Planner.md)",
                            source, path, shown);
      return;
    }
    out = *number;
  }
};
} // namespace

llvm::Expected<ClusterSpec> ClusterSpec::parse(llvm::StringRef json,
                                               llvm::StringRef source) {
  llvm::Expected<llvm::json::Value> value = llvm::json::parse(json);
  if (!value)
    return llvm::createStringError(source + ": " +
                                   llvm::toString(value.takeError()));
  const llvm::json::Object *root = value->getAsObject();
  if (!root)
    return llvm::createStringError(source + ": a cluster file is a JSON "
                                            "object (docs/Planner.md)");
  static const char *const known[] = {"description",   "num_gpus",
                                      "gpus_per_node", "memory_per_gpu",
                                      "peak_tflops",   "memory_bandwidth_GBps",
                                      "intra_node",    "inter_node"};
  for (const auto &entry : *root)
    if (!llvm::is_contained(known, entry.first.str()))
      return llvm::createStringError(
          llvm::formatv("{0}: unknown key '{1}'; a cluster file has num_gpus, "
                        "gpus_per_node, memory_per_gpu, peak_tflops, "
                        "memory_bandwidth_GBps, intra_node and inter_node "
                        "(docs/Planner.md)",
                        source, entry.first.str()));
  ClusterSpec spec;
  ClusterReader read{*root, source, {}};
  double gpus = 0, perNode = double(spec.gpusPerNode);
  read.number("", "num_gpus", gpus);
  read.number("", "gpus_per_node", perNode);
  read.number("", "peak_tflops", spec.peakTflops);
  read.number("", "memory_bandwidth_GBps", spec.memoryBandwidthGBps);
  double intraBandwidth = spec.intraNode.bytesPerUs / 1e3,
         interBandwidth = spec.interNode.bytesPerUs / 1e3;
  read.number("intra_node", "bus_bandwidth_GBps", intraBandwidth);
  read.number("intra_node", "latency_us", spec.intraNode.latencyUs);
  read.number("inter_node", "bus_bandwidth_GBps", interBandwidth);
  read.number("inter_node", "latency_us", spec.interNode.latencyUs);
  if (!read.error.empty())
    return llvm::createStringError(read.error);
  if (const llvm::json::Value *memory = root->get("memory_per_gpu")) {
    std::optional<llvm::StringRef> text = memory->getAsString();
    if (!text)
      return llvm::createStringError(
          source + ": the cluster's 'memory_per_gpu' is a size in quotes "
                   "(\"141GB\", \"80GiB\")");
    llvm::Expected<int64_t> bytes = parseByteSize(*text);
    if (!bytes)
      return llvm::createStringError(
          source + ": memory_per_gpu: " + llvm::toString(bytes.takeError()));
    spec.memoryBytes = *bytes;
  }
  spec.numGpus = int64_t(gpus);
  spec.gpusPerNode = int64_t(perNode);
  spec.intraNode.bytesPerUs = intraBandwidth * 1e3;
  spec.interNode.bytesPerUs = interBandwidth * 1e3;
  return spec;
}

llvm::Error ClusterSpec::validate() const {
  if (numGpus < 1)
    return llvm::createStringError(llvm::formatv(
        "--num-gpus is {0}; --auto-parallel needs the GPU count to plan for "
        "(--num-gpus 8, or num_gpus in the cluster file)",
        numGpus));
  if (gpusPerNode < 1)
    return llvm::createStringError(llvm::formatv(
        "--gpus-per-node is {0}; expected 1 or more", gpusPerNode));
  if (numGpus > gpusPerNode && numGpus % gpusPerNode != 0)
    return llvm::createStringError(llvm::formatv(
        "--num-gpus {0} is not a whole number of nodes of {1} GPUs; use a "
        "multiple of {1} (or fewer than {1})",
        numGpus, gpusPerNode));
  if (memoryBytes <= kMeasuredCudaContextBytes)
    return llvm::createStringError(llvm::formatv(
        "--gpu-memory is {0} bytes; a GPU needs more than the {1} of its CUDA "
        "context (give it as 141GB or 80GiB)",
        memoryBytes, formatBytes(double(kMeasuredCudaContextBytes))));
  return llvm::Error::success();
}

void ClusterSpec::print(llvm::raw_ostream &os) const {
  int64_t nodes = (numGpus + gpusPerNode - 1) / gpusPerNode;
  os << llvm::formatv(
      "cluster: {0} GPUs ({1} node(s) of {2}), {3} each, {4:F0} TFLOP/s "
      "peak, {5:F0} GB/s memory; links: {6:F0} GB/s and {7:F1} us within a "
      "node, {8:F0} GB/s and {9:F1} us between nodes\n",
      numGpus, nodes, std::min(numGpus, gpusPerNode),
      formatBytes(double(memoryBytes)), peakTflops, memoryBandwidthGBps,
      intraNode.bytesPerUs / 1e3, intraNode.latencyUs,
      interNode.bytesPerUs / 1e3, interNode.latencyUs);
}
