//===- CostModel.cpp - Predicted times of ops and collectives -------------===//

#include "mt/Transforms/CostModel.h"
#include "mt/Transforms/CostModelData.h"

#include "mt/IR/MtOps.h"

#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cmath>

using namespace mlir;
using namespace mlir::mt;

namespace {
/// Reads positive numbers at dotted paths, naming the path on error.
struct Reader {
  const llvm::json::Object &root;
  llvm::StringRef source;
  std::string error;

  double number(llvm::StringRef path) {
    if (!error.empty())
      return 0;
    llvm::SmallVector<llvm::StringRef> keys;
    path.split(keys, '.');
    const llvm::json::Object *object = &root;
    for (llvm::StringRef key : llvm::ArrayRef(keys).drop_back()) {
      object = object->getObject(key);
      if (!object) {
        error = llvm::formatv("{0}: the cost model has no object '{1}' (in "
                              "'{2}'); see data/cost-model.json",
                              source, key, path);
        return 0;
      }
    }
    std::optional<double> value = object->getNumber(keys.back());
    if (!value || !(*value > 0)) {
      error = llvm::formatv("{0}: the cost model's '{1}' is {2}; expected a "
                            "number above 0 (see data/cost-model.json)",
                            source, path, value ? std::to_string(*value)
                                                : std::string("missing"));
      return 0;
    }
    return *value;
  }
};
} // namespace

llvm::Expected<CostModel> CostModel::parse(llvm::StringRef json,
                                           llvm::StringRef source) {
  llvm::Expected<llvm::json::Value> value = llvm::json::parse(json);
  if (!value)
    return llvm::createStringError(source + ": " +
                                   llvm::toString(value.takeError()));
  const llvm::json::Object *root = value->getAsObject();
  if (!root)
    return llvm::createStringError(source +
                                   ": a cost model is a JSON object");
  Reader read{*root, source, {}};
  CostModel model;
  if (const llvm::json::Object *device = root->getObject("device"))
    if (std::optional<llvm::StringRef> name = device->getString("name"))
      model.deviceName = name->str();
  model.launchUs = read.number("device.kernel_launch_us");
  // GB/s are bytes per nanosecond: 1e3 bytes per microsecond each.
  model.memoryBytesPerUs = read.number("device.memory_bandwidth_GBps") * 1e3 *
                           read.number("device.memory_efficiency");
  for (llvm::StringRef type : {"bf16", "f16", "f32"})
    model.gemmFlopsPerUs[type] =
        read.number(("device.gemm_tflops." + type).str()) * 1e6;
  model.attentionForwardFlopsPerUs =
      read.number("device.attention_tflops.forward") * 1e6;
  model.attentionBackwardFlopsPerUs =
      read.number("device.attention_tflops.backward") * 1e6;
  model.gpusPerNode = static_cast<int64_t>(read.number("gpus_per_node"));
  model.nvlink = {read.number("links.nvlink.bus_bandwidth_GBps") * 1e3,
                  read.number("links.nvlink.latency_us")};
  model.network = {read.number("links.network.bus_bandwidth_GBps") * 1e3,
                   read.number("links.network.latency_us")};
  if (!read.error.empty())
    return llvm::createStringError(read.error);
  return model;
}

llvm::Expected<CostModel> CostModel::load(llvm::StringRef path) {
  if (path.empty())
    return parse(kBuiltinCostModel, "data/cost-model.json (built in)");
  llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> buffer =
      llvm::MemoryBuffer::getFile(path);
  if (!buffer)
    return llvm::createStringError("cannot read the cost model '" + path +
                                   "': " + buffer.getError().message());
  return parse((*buffer)->getBuffer(), path);
}

static int64_t bytesOf(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor || !tensor.getElementType().isIntOrFloat())
    return 0;
  return tensor.getNumElements() *
         ((tensor.getElementType().getIntOrFloatBitWidth() + 7) / 8);
}

static double elementsOf(Value value) {
  auto tensor = dyn_cast<RankedTensorType>(value.getType());
  return tensor ? double(tensor.getNumElements()) : 0.0;
}

double CostModel::opMicroseconds(Operation *op) const {
  if (isa<GetParameterOp, ParameterOp, ReshapeOp, CollectiveWaitOp,
          CollectiveStartOp>(op))
    return 0;
  int64_t bytes = 0;
  for (Value operand : op->getOperands())
    bytes += bytesOf(operand.getType());
  for (Value result : op->getResults())
    bytes += bytesOf(result.getType());
  double memoryUs = double(bytes) / memoryBytesPerUs;
  // GEMMs: C = A x B with |A| |B| |C| = (M N K)^2 for the two operands and
  // the result of a linear layer, its data gradient or its weight gradient.
  if (isa<LinearOp, LinearGeluOp, LinearGeluGradOp, LinearWeightGradOp,
          LinearWeightBiasGradOp, MatmulOp>(op) &&
      op->getNumOperands() >= 2 && op->getNumResults() >= 1) {
    double flops = 2.0 * std::sqrt(elementsOf(op->getOperand(0)) *
                                   elementsOf(op->getOperand(1)) *
                                   elementsOf(op->getResult(0)));
    auto type = cast<RankedTensorType>(op->getOperand(0).getType());
    std::string element;
    llvm::raw_string_ostream os(element);
    os << type.getElementType();
    double rate = gemmFlopsPerUs.lookup(element);
    if (rate <= 0)
      rate = gemmFlopsPerUs.lookup("f32");
    return launchUs + std::max(flops / rate, memoryUs);
  }
  if (isa<AttentionOp, AttentionGradOp, AttentionBlockOp,
          AttentionBlockGradOp>(op)) {
    // [b, s, heads, d]: QK^T and PV, half of them under the causal mask.
    double keys = 0;
    if (auto k = dyn_cast<RankedTensorType>(op->getOperand(1).getType()))
      keys = k.getRank() > 1 ? double(k.getShape()[1]) : 0;
    double flops = 2.0 * elementsOf(op->getOperand(0)) * keys;
    bool backward = isa<AttentionGradOp, AttentionBlockGradOp>(op);
    double rate =
        backward ? attentionBackwardFlopsPerUs : attentionForwardFlopsPerUs;
    return launchUs + std::max((backward ? 2.5 : 1.0) * flops / rate,
                               memoryUs);
  }
  return launchUs + memoryUs;
}

CollectiveCost CostModel::collective(Operation *op) const {
  CollectiveCost cost;
  cost.kind = op->getName().stripDialect();
  ArrayRef<int16_t> axes;
  FlatSymbolRefAttr gridName;
  if (auto all = dyn_cast<shard::AllReduceOp>(op)) {
    axes = all.getGridAxes();
    gridName = all.getGridAttr();
    cost.bytes = bytesOf(all.getInput().getType());
  } else if (auto gather = dyn_cast<shard::AllGatherOp>(op)) {
    axes = gather.getGridAxes();
    gridName = gather.getGridAttr();
    cost.bytes = bytesOf(gather.getResult().getType());
  } else if (auto scatter = dyn_cast<shard::ReduceScatterOp>(op)) {
    axes = scatter.getGridAxes();
    gridName = scatter.getGridAttr();
    cost.bytes = bytesOf(scatter.getInput().getType());
  } else if (auto exchange = dyn_cast<shard::AllToAllOp>(op)) {
    axes = exchange.getGridAxes();
    gridName = exchange.getGridAttr();
    cost.bytes = bytesOf(exchange.getInput().getType());
  } else if (auto shift = dyn_cast<shard::ShiftOp>(op)) {
    axes = shift.getGridAxes();
    gridName = shift.getGridAttr();
    cost.bytes = bytesOf(shift.getInput().getType());
  } else {
    return cost;
  }
  auto grid = SymbolTable::lookupNearestSymbolFrom<shard::GridOp>(op, gridName);
  // Ranks are numbered with the last grid axis fastest (a pipeline's axis,
  // in front, strides over whole stages): a group spans from its first to
  // its last rank.
  int64_t span = 1;
  if (grid) {
    ArrayRef<int64_t> shape = grid.getShape();
    for (int16_t axis : axes) {
      if (axis < 0 || axis >= static_cast<int16_t>(shape.size()))
        continue;
      int64_t stride = 1;
      for (size_t i = axis + 1; i < shape.size(); ++i)
        stride *= shape[i];
      cost.groupSize *= shape[axis];
      span += stride * (shape[axis] - 1);
    }
  }
  cost.network = span > gpusPerNode;
  if (cost.groupSize <= 1)
    return cost;
  const LinkCost &link = cost.network ? network : nvlink;
  double n = double(cost.groupSize);
  // Ring algorithms: an all-reduce moves 2 (n - 1) / n of its buffer over
  // each link, a gather, scatter or all-to-all (n - 1) / n of the whole
  // tensor; a shift sends the whole buffer to one neighbour.
  double factor = cost.kind == "all_reduce" ? 2.0 * (n - 1) / n
                  : cost.kind == "shift"    ? 1.0
                                            : (n - 1) / n;
  cost.us = link.latencyUs + factor * double(cost.bytes) / link.bytesPerUs;
  return cost;
}
