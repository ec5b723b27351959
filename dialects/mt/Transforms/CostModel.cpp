//===- CostModel.cpp - Predicted times of ops and collectives -------------===//

#include "mt/Transforms/CostModel.h"
#include "mt/Transforms/CostModelData.h"
#include "mt/Transforms/ViewGroups.h"

#include "mt/IR/MtOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
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

namespace {
/// "8x2048x2048xbf16": its element count and element type.
struct ParsedType {
  double elements = 1;
  int64_t bytes = 0;
  llvm::StringRef element;
};
ParsedType parseType(llvm::StringRef text) {
  ParsedType parsed;
  llvm::SmallVector<llvm::StringRef> parts;
  text.split(parts, 'x');
  parsed.element = parts.back();
  for (llvm::StringRef dim : llvm::ArrayRef(parts).drop_back()) {
    int64_t n = 0;
    if (!dim.getAsInteger(10, n))
      parsed.elements *= double(n);
  }
  int64_t width = parsed.element.starts_with("f8") ? 1
                  : parsed.element.ends_with("64") ? 8
                  : parsed.element.ends_with("16") ? 2
                  : parsed.element == "i1"         ? 1
                                                   : 4;
  parsed.bytes = static_cast<int64_t>(parsed.elements) * width;
  return parsed;
}
std::vector<ParsedType> parseTypes(llvm::StringRef text) {
  std::vector<ParsedType> out;
  llvm::SmallVector<llvm::StringRef> parts;
  text.trim().split(parts, ',', -1, false);
  for (llvm::StringRef part : parts)
    out.push_back(parseType(part.trim()));
  return out;
}
bool isGemmName(llvm::StringRef op) {
  return op == "linear" || op == "linear_gelu" || op == "linear_gelu_grad" ||
         op == "linear_add" || op == "linear_weight_grad" ||
         op == "linear_weight_bias_grad" || op == "matmul";
}
bool isAttentionName(llvm::StringRef op) {
  return op == "attention" || op == "attention_grad" ||
         op == "attention_block" || op == "attention_block_grad";
}
/// FLOPs of a GEMM or attention op from its operands' and first result's
/// element counts (and, for attention, the keys: dimension 1 of operand 1).
double flopsOf(llvm::StringRef op, double a, double b, double c, double keys) {
  if (isGemmName(op))
    return 2.0 * std::sqrt(a * b * c);
  double flops = 2.0 * a * keys;
  return op.ends_with("_grad") ? 2.5 * flops : flops;
}
} // namespace

llvm::Expected<Calibration> Calibration::parse(llvm::StringRef json,
                                               llvm::StringRef source) {
  llvm::Expected<llvm::json::Value> value = llvm::json::parse(json);
  if (!value)
    return llvm::createStringError(source + ": " +
                                   llvm::toString(value.takeError()));
  const llvm::json::Object *root = value->getAsObject();
  const llvm::json::Array *ops = root ? root->getArray("ops") : nullptr;
  if (!ops || ops->empty())
    return llvm::createStringError(
        source + ": a calibration is an object with a non-empty 'ops' array "
                 "(bench/make-calibration.py writes one)");
  Calibration calibration;
  if (std::optional<llvm::StringRef> name = root->getString("device"))
    calibration.deviceName = name->str();
  for (const llvm::json::Value &entry : *ops) {
    const llvm::json::Object *op = entry.getAsObject();
    std::optional<llvm::StringRef> name =
        op ? op->getString("op") : std::nullopt;
    std::optional<llvm::StringRef> operands =
        op ? op->getString("operands") : std::nullopt;
    std::optional<llvm::StringRef> results =
        op ? op->getString("results") : std::nullopt;
    std::optional<double> us = op ? op->getNumber("us") : std::nullopt;
    if (!name || !operands || !results || !us || !(*us > 0))
      return llvm::createStringError(llvm::formatv(
          "{0}: ops[{1}] needs 'op', 'operands', 'results' (strings) and "
          "'us' (above 0)",
          source, &entry - &*ops->begin()));
    calibration
        .microseconds[(*name + " " + *operands + " -> " + *results).str()] =
        *us;
    std::vector<ParsedType> in = parseTypes(*operands),
                            out = parseTypes(*results);
    if ((isGemmName(*name) || isAttentionName(*name)) && in.size() >= 2 &&
        !out.empty()) {
      double keys = 0;
      llvm::SmallVector<llvm::StringRef> dims;
      operands->split(',').second.split(dims, 'x');
      if (dims.size() > 2)
        dims[1].getAsDouble(keys);
      double flops =
          flopsOf(*name, in[0].elements, in[1].elements, out[0].elements, keys);
      calibration.flopRates[(*name + " " + in[0].element).str()].push_back(
          {flops, *us});
      continue;
    }
    double bytes = 0;
    for (const ParsedType &t : in)
      bytes += double(t.bytes);
    for (const ParsedType &t : out)
      bytes += double(t.bytes);
    Rate &rate = calibration.byteRates[*name];
    rate.flops += bytes;
    rate.us += *us;
  }
  for (auto &entry : calibration.flopRates)
    llvm::sort(entry.second,
               [](const Rate &a, const Rate &b) { return a.flops < b.flops; });
  return calibration;
}

bool Calibration::hasBuiltin() { return kBuiltinCalibration[0] != 0; }

llvm::Expected<Calibration> Calibration::load(llvm::StringRef path) {
  if (path.empty())
    return parse(kBuiltinCalibration, "data/calibration-h200.json (built in)");
  llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> buffer =
      llvm::MemoryBuffer::getFile(path);
  if (!buffer)
    return llvm::createStringError("cannot read the calibration '" + path +
                                   "': " + buffer.getError().message());
  return parse((*buffer)->getBuffer(), path);
}

/// The op's key in a calibration: its name and its operand and result types
/// as megatron-train prints them.
static std::string calibrationKey(llvm::StringRef name, TypeRange operands,
                                  TypeRange results) {
  std::string key;
  llvm::raw_string_ostream os(key);
  os << name << " ";
  auto print = [&](TypeRange types) {
    bool first = true;
    for (Type type : types) {
      if (!first)
        os << ",";
      first = false;
      auto tensor = dyn_cast<RankedTensorType>(type);
      if (!tensor) {
        os << type;
        continue;
      }
      for (int64_t d : tensor.getShape())
        os << d << "x";
      os << tensor.getElementType();
    }
  };
  print(operands);
  os << " -> ";
  print(results);
  return key;
}

static std::string calibrationKey(Operation *op) {
  return calibrationKey(op->getName().stripDialect(), op->getOperandTypes(),
                        op->getResultTypes());
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

double CostModel::gradientAccumulationMicroseconds(Value gradient) const {
  Operation *producer = gradient.getDefiningOp();
  auto type = dyn_cast<RankedTensorType>(gradient.getType());
  if (isa_and_nonnull<LinearWeightGradOp, LinearWeightBiasGradOp>(producer) &&
      cast<OpResult>(gradient).getResultNumber() == 0 && type &&
      type.getElementType().isF32() && gradient.hasOneUse())
    return 0;
  return launchUs + double(bytesOf(gradient.getType())) / memoryBytesPerUs;
}

double CostModel::opMicroseconds(Operation *op) const {
  // The memory plan makes a contiguous chunk copy's pieces views.
  if (isa<GetParameterOp, ParameterOp, ReshapeOp, CollectiveWaitOp,
          CollectiveStartOp>(op) ||
      isContiguousChunkCopy(op))
    return 0;
  // A function's end is no kernel; a train step's gradients are added into
  // their sums there.
  if (auto ret = dyn_cast<func::ReturnOp>(op)) {
    auto function = dyn_cast<func::FuncOp>(op->getParentOp());
    double us = 0;
    for (OpOperand &result : ret->getOpOperands())
      if (function &&
          function.getResultAttr(result.getOperandNumber(), "mt.gradient"))
        us += gradientAccumulationMicroseconds(result.get());
    return us;
  }
  if (auto accumulate = dyn_cast<AccumulateGradientOp>(op)) {
    if (calibration) {
      auto exact = calibration->microseconds.find(calibrationKey(op));
      if (exact != calibration->microseconds.end())
        return exact->second * calibrationScale;
    }
    return gradientAccumulationMicroseconds(accumulate.getGradient());
  }
  int64_t bytes = 0;
  for (Value operand : op->getOperands())
    bytes += bytesOf(operand.getType());
  for (Value result : op->getResults())
    bytes += bytesOf(result.getType());
  if (calibration) {
    std::optional<double> us = calibratedMicroseconds(op, double(bytes));
    if (us)
      return *us * calibrationScale;
  }
  double memoryUs = double(bytes) / memoryBytesPerUs;
  // GEMMs: C = A x B with |A| |B| |C| = (M N K)^2 for the two operands and
  // the result of a linear layer, its data gradient or its weight gradient.
  if (isa<LinearOp, LinearGeluOp, LinearGeluGradOp, LinearAddOp,
          LinearWeightGradOp, LinearWeightBiasGradOp, MatmulOp>(op) &&
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
  if (isa<AttentionOp, AttentionGradOp, AttentionBlockOp, AttentionBlockGradOp>(
          op)) {
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

std::optional<double> CostModel::calibratedMicroseconds(Operation *op,
                                                        double bytes) const {
  const Calibration &c = *calibration;
  std::string key = calibrationKey(op);
  auto exact = c.microseconds.find(key);
  if (exact != c.microseconds.end())
    return exact->second;
  llvm::StringRef name = op->getName().stripDialect();
  double addendUs = 0;
  if (auto linearAdd = dyn_cast<LinearAddOp>(op)) {
    // Profiles before the fusion have none: its linear's measurement (the
    // same operands but the addend), and the addend read at the memory
    // bandwidth.
    SmallVector<Type> operands = {linearAdd.getInput().getType(),
                                  linearAdd.getWeight().getType()};
    if (Value bias = linearAdd.getBias())
      operands.push_back(bias.getType());
    addendUs =
        double(bytesOf(linearAdd.getAddend().getType())) / memoryBytesPerUs;
    auto linear = c.microseconds.find(
        calibrationKey("linear", operands, op->getResultTypes()));
    if (linear != c.microseconds.end())
      return linear->second + addendUs;
    name = "linear";
  }
  if ((isGemmName(name) || isAttentionName(name)) &&
      op->getNumOperands() >= 2 && op->getNumResults() >= 1) {
    auto a = dyn_cast<RankedTensorType>(op->getOperand(0).getType());
    if (!a)
      return std::nullopt;
    std::string element;
    llvm::raw_string_ostream os(element);
    os << a.getElementType();
    auto rates = c.flopRates.find((name + " " + element).str());
    if (rates == c.flopRates.end() || rates->second.empty())
      return std::nullopt;
    double keys = 0;
    if (auto k = dyn_cast<RankedTensorType>(op->getOperand(1).getType()))
      keys = k.getRank() > 1 ? double(k.getShape()[1]) : 0;
    double flops = flopsOf(name, elementsOf(op->getOperand(0)),
                           elementsOf(op->getOperand(1)),
                           elementsOf(op->getResult(0)), keys);
    // The measured instruction nearest in FLOPs (on a log scale) gives the
    // throughput.
    const Calibration::Rate *nearest = nullptr;
    double distance = 0;
    for (const Calibration::Rate &rate : rates->second) {
      double d = std::abs(std::log((rate.flops + 1) / (flops + 1)));
      if (!nearest || d < distance) {
        nearest = &rate;
        distance = d;
      }
    }
    return flops / (nearest->flops / nearest->us) + addendUs;
  }
  auto rate = c.byteRates.find(name);
  if (rate == c.byteRates.end() || rate->second.us <= 0)
    return std::nullopt;
  return bytes / (rate->second.flops / rate->second.us);
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
  // Along an inner axis (dimensions above 1 before it: the sequence of
  // [b, s, h] under sequence parallelism), the ranks' blocks interleave:
  // the runtime gathers into, or scatters from, a staging buffer and copies
  // the rows into place (runtime/src/cuda/RankOps.cpp), reading and
  // writing the whole tensor once more.
  Value whole;
  int64_t axis = 0;
  if (auto gather = dyn_cast<shard::AllGatherOp>(op)) {
    whole = gather.getResult();
    axis = gather.getGatherAxis().getSExtValue();
  } else if (auto scatter = dyn_cast<shard::ReduceScatterOp>(op)) {
    whole = scatter.getInput();
    axis = scatter.getScatterAxis().getSExtValue();
  }
  if (whole) {
    auto type = cast<RankedTensorType>(whole.getType());
    if (llvm::any_of(type.getShape().take_front(axis),
                     [](int64_t d) { return d != 1; }))
      cost.us += 2.0 * double(cost.bytes) / memoryBytesPerUs;
  }
  return cost;
}
