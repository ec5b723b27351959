//===- BundleWriter.cpp - Writes a training bundle (docs/BundleFormat.md) -===//

#include "megatron/Target/Bundle.h"
#include "megatron/Target/FusedKernels.h"

#include "mt/IR/MtFp8Ops.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/MemoryPlan.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace megatron;
using llvm::json::Array;
using llvm::json::Object;

/// Reports what the bundle format cannot express, at the op.
static InFlightDiagnostic errorAt(Operation *op, const llvm::Twine &message) {
  return op->emitError() << "cannot be written to a bundle: " << message;
}

static FailureOr<StringRef> dtypeName(Operation *op, Type type) {
  if (type.isF32())
    return StringRef("f32");
  if (type.isF64())
    return StringRef("f64");
  if (type.isBF16())
    return StringRef("bf16");
  if (type.isF16())
    return StringRef("f16");
  if (type.isInteger(32))
    return StringRef("i32");
  if (type.isInteger(64))
    return StringRef("i64");
  if (isa<Float8E4M3FNType>(type))
    return StringRef("f8e4m3");
  if (isa<Float8E5M2Type>(type))
    return StringRef("f8e5m2");
  return errorAt(op, "its element type has no bundle dtype") << " (" << type
                                                                 << ")";
}

namespace {

/// The generated kernels of a bundle's mt.fused groups: one per distinct
/// kernel text (groups that differ only in dropout seeds share one).
class FusedKernelTable {
public:
  /// The index of `group`'s kernel, emitted on first sight.
  int64_t add(mt::FusedOp group) {
    std::string key = emitFusedKernel(group, "mt_fused");
    auto [it, inserted] = indexByText.try_emplace(key, names.size());
    if (inserted) {
      std::string name = "mt_fused_" + std::to_string(names.size());
      names.push_back(name);
      kernels.push_back(emitFusedKernel(group, name));
    }
    return it->second;
  }

  bool empty() const { return names.empty(); }
  const std::vector<std::string> &kernelNames() const { return names; }

  /// The translation unit: the prelude and every kernel.
  std::string source() const {
    std::string text = fusedKernelPrelude();
    for (const std::string &kernel : kernels)
      text += "\n" + kernel;
    return text;
  }

private:
  llvm::StringMap<int64_t> indexByText;
  std::vector<std::string> names;
  std::vector<std::string> kernels;
};

/// Writes one function's value table and instruction stream.
class FunctionWriter {
public:
  /// `axisShift`: grid axes the bundle's grid has before the partition's
  /// (the pipeline axis).
  /// `sideBuffers`: how the device backend stores what it computes, for
  /// the memory plan's side buffers.
  /// `accumulateEarly`: each accumulate_gradient right after the
  /// instruction that makes the gradient, instead of at the end, so that
  /// a gradient bucket can be reduced while the backward pass goes on.
  /// `metaIndex`: the FP8 metas (mt.fp8_meta) by name, as the manifest's
  /// fp8 section lists them.
  FunctionWriter(func::FuncOp function,
                 const llvm::StringMap<int64_t> &parameterIndex,
                 const llvm::StringMap<int64_t> &metaIndex, int64_t axisShift,
                 FusedKernelTable &kernels, mt::SideBufferOptions sideBuffers,
                 bool accumulateEarly)
      : function(function), parameterIndex(parameterIndex),
        metaIndex(metaIndex), axisShift(axisShift), kernels(kernels),
        sideBuffers(sideBuffers), accumulateEarly(accumulateEarly) {}

  FailureOr<llvm::json::Value> write();

private:
  LogicalResult addValue(Value value);
  FailureOr<llvm::json::Value> convertAttribute(Operation *op, Attribute attr);
  FailureOr<Object> writeAttributes(Operation *op);
  /// `written`: by the position the memory plan gives an instruction
  /// (mt::planFunctionMemory: accumulate_gradient at the end), its index
  /// in the written stream.
  Object writeMemoryPlan(ArrayRef<int64_t> written);
  FailureOr<Array> writeFusedBody(mt::FusedOp group);

  func::FuncOp function;
  const llvm::StringMap<int64_t> &parameterIndex;
  const llvm::StringMap<int64_t> &metaIndex;
  int64_t axisShift;
  FusedKernelTable &kernels;
  mt::SideBufferOptions sideBuffers;
  bool accumulateEarly;
  DenseMap<Value, int64_t> ids;
  Array values;
};

} // namespace

LogicalResult FunctionWriter::addValue(Value value) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  Operation *owner = value.getDefiningOp() ? value.getDefiningOp()
                                           : function.getOperation();
  if (!type || !type.hasStaticShape())
    return errorAt(owner, "every value needs a static tensor type");
  FailureOr<StringRef> dtype = dtypeName(owner, type.getElementType());
  if (failed(dtype))
    return failure();
  ids[value] = values.size();
  values.push_back(Object{{"shape", Array(type.getShape())}, {"dtype", *dtype}});
  return success();
}

FailureOr<llvm::json::Value>
FunctionWriter::convertAttribute(Operation *op, Attribute attr) {
  if (isa<UnitAttr>(attr))
    return llvm::json::Value(true);
  // Before IntegerAttr, of which BoolAttr is one (an i1, whose getInt is -1).
  if (auto flag = dyn_cast<BoolAttr>(attr))
    return llvm::json::Value(flag.getValue());
  if (auto integer = dyn_cast<IntegerAttr>(attr))
    return llvm::json::Value(integer.getInt());
  if (auto number = dyn_cast<FloatAttr>(attr))
    return llvm::json::Value(number.getValueAsDouble());
  if (auto array = dyn_cast<DenseI64ArrayAttr>(attr))
    return llvm::json::Value(Array(array.asArrayRef()));
  // mt.split_axes: one list of grid axes per dimension.
  if (auto lists = dyn_cast<ArrayAttr>(attr)) {
    Array out;
    for (Attribute list : lists) {
      auto axes = dyn_cast<DenseI16ArrayAttr>(list);
      if (!axes)
        return errorAt(op, "an attribute has no bundle form")
               << " (" << attr << ")";
      out.push_back(Array(llvm::map_to_vector(axes.asArrayRef(), [](int16_t a) {
        return static_cast<int64_t>(a);
      })));
    }
    return llvm::json::Value(std::move(out));
  }
  // An FP8 cast's format, by its dtype name.
  if (auto format = dyn_cast<TypeAttr>(attr)) {
    FailureOr<StringRef> name = dtypeName(op, format.getValue());
    if (failed(name))
      return failure();
    return llvm::json::Value(*name);
  }
  if (auto symbol = dyn_cast<FlatSymbolRefAttr>(attr);
      symbol && isa<mt::Fp8ScaleOp, mt::Fp8UpdateOp>(op)) {
    auto it = metaIndex.find(symbol.getValue());
    if (it == metaIndex.end())
      return errorAt(op, "@" + symbol.getValue() + " is not an mt.fp8_meta");
    return llvm::json::Value(it->second);
  }
  if (auto symbol = dyn_cast<FlatSymbolRefAttr>(attr)) {
    auto it = parameterIndex.find(symbol.getValue());
    if (it == parameterIndex.end())
      return errorAt(op, "@" + symbol.getValue() + " is not a parameter");
    return llvm::json::Value(it->second);
  }
  return errorAt(op, "an attribute has no bundle form") << " (" << attr << ")";
}

/// The attributes of a shard collective, in docs/BundleFormat.md's names.
static Object writeCollective(Operation *op, int64_t axisShift) {
  Object attrs;
  auto axes = [&](ArrayRef<int16_t> gridAxes) {
    return Array(llvm::map_to_vector(gridAxes, [&](int16_t axis) {
      return static_cast<int64_t>(axis) + axisShift;
    }));
  };
  auto reduction = [](shard::ReductionKind kind) {
    return kind == shard::ReductionKind::Max ? "max" : "sum";
  };
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](shard::AllReduceOp all) {
        attrs["grid_axes"] = axes(all.getGridAxes());
        attrs["reduction"] = reduction(all.getReduction());
      })
      .Case([&](shard::AllGatherOp gather) {
        attrs["grid_axes"] = axes(gather.getGridAxes());
        attrs["gather_axis"] = gather.getGatherAxis().getSExtValue();
      })
      .Case([&](shard::ReduceScatterOp scatter) {
        attrs["grid_axes"] = axes(scatter.getGridAxes());
        attrs["scatter_axis"] = scatter.getScatterAxis().getSExtValue();
        attrs["reduction"] = reduction(scatter.getReduction());
      })
      .Case([&](shard::AllSliceOp slice) {
        attrs["grid_axes"] = axes(slice.getGridAxes());
        attrs["slice_axis"] = slice.getSliceAxis().getSExtValue();
      })
      .Case([&](shard::AllToAllOp all) {
        attrs["grid_axes"] = axes(all.getGridAxes());
        attrs["split_axis"] = all.getSplitAxis().getSExtValue();
        attrs["concat_axis"] = all.getConcatAxis().getSExtValue();
      })
      .Case([&](shard::ShiftOp shift) {
        attrs["grid_axes"] = axes(shift.getGridAxes());
        attrs["shift_axis"] = shift.getShiftAxis().getSExtValue() + axisShift;
        attrs["offset"] = shift.getOffset();
      });
  return attrs;
}

/// `value` (grid axes, or lists of them) with every axis moved by `shift`.
static llvm::json::Value shiftGridAxes(llvm::json::Value value,
                                       int64_t shift) {
  if (std::optional<int64_t> axis = value.getAsInteger())
    return *axis + shift;
  if (Array *list = value.getAsArray())
    for (llvm::json::Value &element : *list)
      element = shiftGridAxes(std::move(element), shift);
  return value;
}

FailureOr<Object> FunctionWriter::writeAttributes(Operation *op) {
  if (op->getDialect() &&
      op->getDialect()->getNamespace() == shard::ShardDialect::getDialectNamespace())
    return writeCollective(op, axisShift);
  Object attrs;
  for (NamedAttribute named : op->getAttrDictionary()) {
    // Discardable attributes (mt.recomputed) are notes for passes, except
    // a random op's tile (mt.split_axes), which keys its stream, and the
    // backward pass's seed mark (mt.loss_seed), which fp16 training scales.
    // A partitioned position_ids', rope's or dropout's context layout
    // (mt.context_axis and mt.context_size) maps its tile through the
    // load-balanced chunks.
    bool contextLayout =
        isa<mt::PositionIdsOp, mt::RopeOp, mt::DropoutOp>(op) &&
                         (named.getName() == mt::kContextAxisAttrName ||
                          named.getName() == mt::kContextSizeAttrName);
    // A GEMM chunk's rows of its whole (mt.whole_rows) pick its algorithm.
    if (op->getDiscardableAttr(named.getName()) &&
        named.getName() != "mt.split_axes" &&
        named.getName() != mt::kLossSeedAttrName &&
        named.getName() != mt::kWholeRowsAttrName && !contextLayout)
      continue;
    FailureOr<llvm::json::Value> value = convertAttribute(op, named.getValue());
    if (failed(value))
      return failure();
    // Both parameter ops name their parameter by index under one key; a
    // random op's tile (mt.split_axes, set by partitioning) is split_axes.
    StringRef key = isa<mt::GetParameterOp, mt::AccumulateGradientOp>(op)
                        ? StringRef("parameter")
                        : named.getName().getValue();
    key.consume_front("mt.");
    // Grid axes count in the bundle's grid, which a pipeline extends in
    // front.
    if (axisShift && (key == "vocab_shard_axes" || key == "split_axes" ||
                      key == "context_axis"))
      *value = shiftGridAxes(std::move(*value), axisShift);
    attrs[key] = std::move(*value);
  }
  // Enums are written by name, and defaulted attributes are written out so
  // the runtime holds no defaults.
  llvm::TypeSwitch<Operation *>(op)
      .Case<mt::GeluOp, mt::GeluGradOp, mt::LinearGeluOp, mt::LinearGeluGradOp>(
          [&](auto gelu) {
            attrs["approximate"] =
                mt::stringifyGeluApproximation(gelu.getApproximate());
          })
      .Case<mt::AttentionOp, mt::AttentionGradOp, mt::AttentionBlockOp,
            mt::AttentionBlockGradOp>([&](auto attention) {
        attrs["dropout_p"] = attention.getDropoutP().convertToDouble();
        attrs["seed"] = attention.getSeedAttr().getInt();
      })
      .Case<mt::CrossEntropyOp, mt::CrossEntropyGradOp, mt::VocabCrossEntropyOp,
            mt::VocabCrossEntropyGradOp, mt::LinearCrossEntropyOp,
            mt::LinearVocabCrossEntropyGradOp>([&](auto loss) {
        attrs["reduction"] = mt::stringifyLossReduction(loss.getReduction());
        attrs["ignore_index"] = loss.getIgnoreIndexAttr().getInt();
      })
      .Case<mt::MoeRouteOp, mt::MoeRouteGradOp, mt::MoeAuxLossOp,
            mt::MoeAuxLossGradOp>([&](auto router) {
        attrs["score_function"] =
            mt::stringifyMoeScoreFunction(router.getScoreFunction());
      });
  if (auto scale = dyn_cast<mt::Fp8CurrentScaleOp>(op))
    attrs["margin"] = scale.getMargin();
  // Capacity routing names its drop policy, the default included.
  if (auto route = dyn_cast<mt::MoeRouteOp>(op); route && route.getCapacityFactor())
    attrs["drop_policy"] = mt::stringifyMoeDropPolicy(
        route.getDropPolicy().value_or(mt::MoeDropPolicy::Probs));
  return attrs;
}

/// An mt.fused group's ops as instructions over the function's values: the
/// block's arguments are the group's operands, the yielded values its
/// results, and the values computed inside get value entries of their own
/// (without memory: -1 in the memory plan). Call after the group's results
/// have their ids.
FailureOr<Array> FunctionWriter::writeFusedBody(mt::FusedOp group) {
  Block &body = group.getBody().front();
  for (auto [argument, operand] :
       llvm::zip(body.getArguments(), group.getInputs()))
    ids[argument] = ids.lookup(operand);
  auto yield = cast<mt::YieldOp>(body.getTerminator());
  DenseMap<Value, int64_t> yielded;
  for (auto [value, result] : llvm::zip(yield.getValues(), group.getResults())) {
    if (isa<BlockArgument>(value) || value.getDefiningOp()->getBlock() != &body ||
        !yielded.try_emplace(value, ids.lookup(result)).second)
      return errorAt(group, "each result of a group is a distinct value "
                            "computed by one of its ops");
  }
  Array instructions;
  for (Operation &op : body.without_terminator()) {
    Object instruction{{"op", op.getName().stripDialect()}};
    Array operands, results;
    for (Value operand : op.getOperands())
      operands.push_back(ids.lookup(operand));
    for (Value result : op.getResults()) {
      auto it = yielded.find(result);
      if (it != yielded.end()) {
        ids[result] = it->second;
      } else if (failed(addValue(result))) {
        return failure();
      }
      results.push_back(ids[result]);
    }
    FailureOr<Object> attrs = writeAttributes(&op);
    if (failed(attrs))
      return failure();
    instruction["operands"] = std::move(operands);
    instruction["results"] = std::move(results);
    if (!attrs->empty())
      instruction["attrs"] = std::move(*attrs);
    instructions.push_back(std::move(instruction));
  }
  return instructions;
}

/// The static arena (docs/BundleFormat.md, "Memory plan"): an offset per
/// value, -1 for values without memory, and every side buffer:
/// [instruction, offset, bytes, until, value it copies or -1]; the attention
/// views: [value, whole, byte offset in the whole's block].
Object FunctionWriter::writeMemoryPlan(ArrayRef<int64_t> written) {
  mt::FunctionMemoryPlan plan = mt::planFunctionMemory(function, sideBuffers);
  SmallVector<int64_t> offsets(values.size(), -1);
  for (const mt::BufferPlan &buffer : plan.buffers)
    offsets[ids.lookup(buffer.value)] = buffer.offset;
  // The written stream has as many instructions as the plan's.
  auto at = [&](int64_t position) {
    return position < static_cast<int64_t>(written.size()) ? written[position]
                                                           : position;
  };
  Array side;
  for (const mt::SideBufferPlan &block : plan.sideBuffers)
    side.push_back(Array{at(block.position), block.offset, block.bytes,
                         at(block.until),
                         block.copyOf ? ids.lookup(block.copyOf) : -1});
  // Always written: a reader tells the compiler's decision (possibly no
  // group) from a bundle written before views were planned.
  Array views;
  for (const mt::ViewPlan &view : plan.views)
    views.push_back(
        Array{ids.lookup(view.value), ids.lookup(view.whole), view.byteOffset});
  return Object{{"alignment", mt::kArenaAlignment},
                {"arena_bytes", plan.arenaBytes},
                {"offsets", Array(offsets)},
                {"side_buffers", std::move(side)},
                {"views", std::move(views)}};
}

FailureOr<llvm::json::Value> FunctionWriter::write() {
  if (!function.getBody().hasOneBlock())
    return errorAt(function, "a function in a bundle has one block");
  Block &body = function.getBody().front();
  Array inputs, outputs, instructions;
  // By the memory plan's position of each instruction, where it is written.
  SmallVector<int64_t> positions;
  // Partitioned steps read parameters as arguments and return gradients
  // (mt-parameters-to-arguments); the bundle keeps its calling convention:
  // get_parameter and accumulate_gradient instructions on the rank's shards.
  for (BlockArgument argument : body.getArguments()) {
    if (failed(addValue(argument)))
      return failure();
    auto parameter = function.getArgAttrOfType<FlatSymbolRefAttr>(
        argument.getArgNumber(), "mt.parameter");
    if (!parameter) {
      inputs.push_back(ids[argument]);
      continue;
    }
    auto it = parameterIndex.find(parameter.getValue());
    if (it == parameterIndex.end())
      return errorAt(function, "@" + parameter.getValue() +
                                   " is not a parameter");
    positions.push_back(instructions.size());
    instructions.push_back(Object{{"op", "get_parameter"},
                                  {"results", Array{ids[argument]}},
                                  {"attrs", Object{{"parameter", it->second}}}});
  }

  // Values that are never freed: inputs, outputs and parameter views.
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  DenseSet<Value> kept(body.getArguments().begin(), body.getArguments().end());
  kept.insert(ret.getOperands().begin(), ret.getOperands().end());
  // The last instruction that reads each value (its definition if none).
  DenseMap<Value, Operation *> lastUse;
  // A split collective runs as one instruction at its start, writing its
  // wait's result (mt::instructionResults); its operand is held until the
  // wait, so it is freed after the instruction that follows the wait.
  SmallVector<Value> heldToWait;
  for (Operation &op : body.without_terminator()) {
    if (auto wait = dyn_cast<mt::CollectiveWaitOp>(op)) {
      heldToWait.push_back(
          wait.getFuture().getDefiningOp<mt::CollectiveStartOp>().getInput());
      continue;
    }
    for (Value held : heldToWait)
      lastUse[held] = &op;
    heldToWait.clear();
    for (Value result : mt::instructionResults(&op))
      lastUse[result] = &op;
    for (Value operand : op.getOperands())
      lastUse[operand] = &op;
    if (isa<mt::GetParameterOp>(op))
      kept.insert(op.getResult(0));
  }
  DenseMap<Operation *, SmallVector<Value>> freedAt;
  for (auto [value, op] : lastUse)
    if (!kept.contains(value))
      freedAt[op].push_back(value);

  // The accumulate_gradient of each gradient result: after the
  // instruction that writes the gradient (accumulateEarly), else at the end.
  SmallVector<std::pair<Value, int64_t>> accumulations;
  for (OpOperand &output : ret->getOpOperands()) {
    auto parameter = function.getResultAttrOfType<FlatSymbolRefAttr>(
        output.getOperandNumber(), "mt.gradient");
    if (!parameter)
      continue;
    auto it = parameterIndex.find(parameter.getValue());
    if (it == parameterIndex.end())
      return errorAt(function,
                     "@" + parameter.getValue() + " is not a parameter");
    accumulations.push_back({output.get(), it->second});
  }
  SmallVector<bool> accumulated(accumulations.size(), false);
  SmallVector<int64_t> accumulatedAt(accumulations.size(), 0);
  auto accumulate = [&](ArrayRef<Value> results) {
    for (auto [i, gradient] : llvm::enumerate(accumulations)) {
      if (accumulated[i] || !llvm::is_contained(results, gradient.first))
        continue;
      accumulated[i] = true;
      accumulatedAt[i] = instructions.size();
      instructions.push_back(
          Object{{"op", "accumulate_gradient"},
                 {"operands", Array{ids.lookup(gradient.first)}},
                 {"attrs", Object{{"parameter", gradient.second}}}});
    }
  };

  for (Operation &op : body.without_terminator()) {
    if (isa<mt::CollectiveWaitOp>(op))
      continue;
    auto start = dyn_cast<mt::CollectiveStartOp>(op);
    bool collective =
        isa<shard::AllReduceOp, shard::AllGatherOp, shard::ReduceScatterOp,
            shard::AllSliceOp, shard::ShiftOp, shard::AllToAllOp>(op);
    // The bundle's shift is a rotation; without `rotate` upstream leaves the
    // ranks at the end without a source, which no plan here may read.
    if (auto shift = dyn_cast<shard::ShiftOp>(op); shift && !shift.getRotate())
      return errorAt(&op, "a shard.shift without `rotate` has no bundle "
                          "form (the ranks without a source would read "
                          "undefined values); add `rotate`");
    if (!collective &&
        (op.getDialect() == nullptr ||
         op.getDialect()->getNamespace() !=
             mt::MtDialect::getDialectNamespace()))
      return errorAt(&op, "the bundle's instructions are mt ops and the "
                          "shard collectives; lower or remove this op first");
    // The runtime runs a split collective where it starts (docs/
    // BundleFormat.md): the instruction is the collective itself.
    Operation *written = start ? start.getCollective() : &op;
    Object instruction{{"op", written->getName().stripDialect()}};
    Array operands, results, freed;
    for (Value operand : op.getOperands())
      operands.push_back(ids.lookup(operand));
    for (Value result : mt::instructionResults(&op)) {
      if (failed(addValue(result)))
        return failure();
      results.push_back(ids[result]);
    }
    auto group = dyn_cast<mt::FusedOp>(op);
    FailureOr<Object> attrs = group ? Object() : writeAttributes(written);
    if (failed(attrs))
      return failure();
    if (group) {
      (*attrs)["kernel"] = kernels.add(group);
      FailureOr<Array> body = writeFusedBody(group);
      if (failed(body))
        return failure();
      instruction["body"] = std::move(*body);
    }
    SmallVector<int64_t> freedIds = llvm::map_to_vector(
        freedAt.lookup(&op), [&](Value value) { return ids.lookup(value); });
    llvm::sort(freedIds);
    if (!operands.empty())
      instruction["operands"] = std::move(operands);
    if (!results.empty())
      instruction["results"] = std::move(results);
    if (!attrs->empty())
      instruction["attrs"] = std::move(*attrs);
    if (!freedIds.empty())
      instruction["free"] = Array(freedIds);
    positions.push_back(instructions.size());
    instructions.push_back(std::move(instruction));
    if (accumulateEarly)
      accumulate(llvm::to_vector(mt::instructionResults(&op)));
  }
  // The names of train_step's outputs where its loss is followed by
  // reported losses (the MoE auxiliary losses; version 12).
  Array outputNames;
  for (OpOperand &output : ret->getOpOperands()) {
    unsigned index = output.getOperandNumber();
    if (function.getResultAttrOfType<FlatSymbolRefAttr>(index, "mt.gradient"))
      continue;
    outputs.push_back(ids.lookup(output.get()));
    auto name = function.getResultAttrOfType<StringAttr>(index, "mt.name");
    outputNames.push_back(index == 0 ? "loss" : name ? name.str() : "");
  }
  accumulate(llvm::map_to_vector(accumulations,
                                 [](const auto &g) { return g.first; }));
  positions.append(accumulatedAt);
  Object memoryPlan = writeMemoryPlan(positions);
  Object written{{"name", function.getSymName()},
                 {"inputs", std::move(inputs)},
                 {"outputs", std::move(outputs)},
                 {"values", std::move(values)},
                 {"instructions", std::move(instructions)},
                 {"memory_plan", std::move(memoryPlan)}};
  if (function.getSymName() == "train_step" && outputNames.size() > 1)
    written["output_names"] = std::move(outputNames);
  return llvm::json::Value(std::move(written));
}

/// Where the written functions accumulate each parameter's gradient:
/// per function, (parameter index, instruction index) pairs.
using Accumulations = llvm::StringMap<SmallVector<std::pair<int64_t, int64_t>>>;
/// Where train_step first reads each parameter (--overlap-param-gather):
/// parameter index -> the first instruction with an operand that
/// get_parameter made.
using FirstReads = DenseMap<int64_t, int64_t>;

/// The `buckets` of the gradient buffer that `reduce` reduces (format
/// version 9, --overlap-grad-reduce): each bucket's slice of the buffer,
/// its reduction function, and the instruction after which its gradients
/// are complete in the last micro-batch (`ready_after`): the last
/// accumulate_gradient of its parameters, when one function accumulates
/// them all and nothing sums them after the schedule (a table tied across
/// pipeline ranks is summed over its embedding group first); without it
/// the runtime reduces the bucket after the step.
///
/// Under the distributed optimizer's per-bucket shards, each bucket names
/// its parameter gather (`gather_function`, the reduce function's
/// mt.bucket_gather), and with --overlap-param-gather (the gather marked
/// mt.overlap_param_gather) where the next train_step first reads one of
/// its parameters (`gather_before`; a pipeline rank gathers before its
/// schedule).
static FailureOr<std::optional<Array>>
writeBuckets(ModuleOp module, func::FuncOp reduce,
             const llvm::StringMap<int64_t> &parameterIndex,
             const Accumulations &accumulations,
             const DenseSet<int64_t> &tiedAcrossRanks,
             const FirstReads &firstReads, bool &overlapParamGather) {
  SmallVector<func::FuncOp> buckets;
  for (auto function : module.getOps<func::FuncOp>())
    if (auto of = function->getAttrOfType<FlatSymbolRefAttr>("mt.bucket_of"))
      if (of.getValue() == reduce.getSymName())
        buckets.push_back(function);
  if (buckets.empty())
    return std::optional<Array>();
  Array written;
  for (func::FuncOp bucket : buckets) {
    auto offset = bucket->getAttrOfType<IntegerAttr>("mt.bucket_offset");
    auto members = bucket->getAttrOfType<ArrayAttr>("mt.gradient_bucket");
    auto type =
        bucket.getFunctionType().getNumInputs() == 1
            ? dyn_cast<RankedTensorType>(bucket.getFunctionType().getInput(0))
            : RankedTensorType();
    if (!offset || !members || !type || type.getRank() != 1)
      return errorAt(bucket, "@" + bucket.getSymName() +
                                 " needs one rank-1 argument (the bucket) and "
                                 "the attributes mt.bucket_offset and "
                                 "mt.gradient_bucket "
                                 "(mt-plan-gradient-reduction writes them)");
    Object entry{{"offset", offset.getInt()},
                 {"size", type.getDimSize(0)},
                 {"reduce_function", bucket.getSymName()}};
    // The one function that accumulates every member, and where it last
    // does.
    std::optional<std::string> function;
    int64_t last = -1;
    bool ready = true;
    for (auto member : members.getAsRange<FlatSymbolRefAttr>()) {
      auto index = parameterIndex.find(member.getValue());
      if (index == parameterIndex.end())
        return errorAt(bucket, "@" + member.getValue() + " is not a parameter");
      if (tiedAcrossRanks.contains(index->second))
        ready = false;
      int64_t found = 0;
      for (const auto &[name, list] : accumulations)
        for (auto [parameter, at] : list)
          if (parameter == index->second) {
            if (function && *function != name.str())
              ready = false;
            function = name.str();
            last = std::max(last, at);
            ++found;
          }
      if (found == 0)
        ready = false;
    }
    if (ready && function)
      entry["ready_after"] =
          Object{{"function", *function}, {"instruction", last}};
    if (auto gather =
            bucket->getAttrOfType<FlatSymbolRefAttr>("mt.bucket_gather")) {
      auto gatherFunction =
          module.lookupSymbol<func::FuncOp>(gather.getValue());
      if (!gatherFunction)
        return errorAt(bucket, "mt.bucket_gather names @" + gather.getValue() +
                                   ", which is not a function");
      entry["gather_function"] = gather.getValue();
      if (gatherFunction->hasAttr("mt.overlap_param_gather")) {
        overlapParamGather = true;
        std::optional<int64_t> first;
        for (auto member : members.getAsRange<FlatSymbolRefAttr>()) {
          auto read = firstReads.find(parameterIndex.lookup(member.getValue()));
          if (read != firstReads.end())
            first = std::min(first.value_or(read->second), read->second);
        }
        if (first && !gatherFunction->hasAttr("mt.pipeline_rank"))
          entry["gather_before"] =
              Object{{"function", "train_step"}, {"instruction", *first}};
      }
    }
    written.push_back(std::move(entry));
  }
  llvm::sort(written,
             [](const llvm::json::Value &a, const llvm::json::Value &b) {
               return *a.getAsObject()->getInteger("offset") <
                      *b.getAsObject()->getInteger("offset");
             });
  return std::optional<Array>(std::move(written));
}

/// One gradient buffer of the manifest (mt-plan-gradient-reduction): the
/// layout of the buffer that `reduce` reduces once per iteration, over the
/// data axis (behind the pipeline axis in a pipeline bundle).
static FailureOr<Object>
writeGradientBuffer(ModuleOp module, func::FuncOp reduce, StringRef gather,
                    const llvm::StringMap<int64_t> &parameterIndex,
                    int64_t axisShift, const Accumulations &accumulations,
                    const DenseSet<int64_t> &tiedAcrossRanks,
                    const FirstReads &firstReads) {
  auto layout = reduce->getAttrOfType<ArrayAttr>("mt.gradient_buffer");
  auto offsets = reduce->getAttrOfType<DenseI64ArrayAttr>("mt.buffer_offsets");
  auto type = dyn_cast<RankedTensorType>(
      reduce.getFunctionType().getNumInputs() == 1
          ? reduce.getFunctionType().getInput(0)
          : Type());
  if (!layout || !offsets || !type || type.getRank() != 1 ||
      static_cast<int64_t>(layout.size()) != offsets.size())
    return errorAt(reduce, "@" + reduce.getSymName() +
                               " needs one rank-1 argument (the buffer) and "
                               "the attributes mt.gradient_buffer and "
                               "mt.buffer_offsets of equal length "
                               "(mt-plan-gradient-reduction writes them)");
  Array parameters;
  for (auto symbol : layout.getAsRange<FlatSymbolRefAttr>()) {
    auto it = parameterIndex.find(symbol.getValue());
    if (it == parameterIndex.end())
      return errorAt(reduce, "@" + symbol.getValue() + " is not a parameter");
    parameters.push_back(it->second);
  }
  bool distributed = module.lookupSymbol<func::FuncOp>(gather) != nullptr;
  // The group is the reduction's: the data axis, and under context
  // parallelism the context axis too (Megatron-LM's data x context group).
  Array gridAxes;
  reduce.walk([&](Operation *op) {
    ArrayRef<int16_t> axes;
    if (auto all = dyn_cast<shard::AllReduceOp>(op))
      axes = all.getGridAxes();
    else if (auto scatter = dyn_cast<shard::ReduceScatterOp>(op))
      axes = scatter.getGridAxes();
    else
      return WalkResult::advance();
    for (int16_t axis : axes)
      gridAxes.push_back(axis + axisShift);
    return WalkResult::interrupt();
  });
  if (gridAxes.empty())
    return errorAt(reduce, "@" + reduce.getSymName() +
                               " reduces its buffer by no shard.all_reduce "
                               "or shard.reduce_scatter "
                               "(mt-plan-gradient-reduction writes one)");
  Object buffer{{"parameters", std::move(parameters)},
                {"offsets", Array(offsets.asArrayRef())},
                {"size", type.getDimSize(0)},
                {"grid_axes", std::move(gridAxes)},
                {"distributed_optimizer", distributed}};
  bool overlapParamGather = false;
  FailureOr<std::optional<Array>> buckets =
      writeBuckets(module, reduce, parameterIndex, accumulations,
                   tiedAcrossRanks, firstReads, overlapParamGather);
  if (failed(buckets))
    return failure();
  if (*buckets)
    buffer["buckets"] = std::move(**buckets);
  if (overlapParamGather)
    buffer["overlap_param_gather"] = true;
  return buffer;
}

/// A pipeline bundle's `gradient_buffers` (format version 7): per pipeline
/// rank, the buffer of its stages' gradients and the names of the functions
/// that reduce it (@reduce_gradients_pp<r>) and gather its parameters.
static FailureOr<std::optional<Array>>
writeGradientBuffers(ModuleOp module,
                     const llvm::StringMap<int64_t> &parameterIndex,
                     int64_t pipelineSize, const Accumulations &accumulations,
                     const DenseSet<int64_t> &tiedAcrossRanks) {
  Array buffers;
  for (int64_t rank = 0; rank < pipelineSize; ++rank) {
    std::string reduceName = "reduce_gradients_pp" + std::to_string(rank);
    std::string gatherName = "gather_parameters_pp" + std::to_string(rank);
    auto reduce = module.lookupSymbol<func::FuncOp>(reduceName);
    if (!reduce) {
      if (rank == 0)
        return std::optional<Array>();
      return errorAt(module, "no @" + reduceName + " beside @" +
                                 "reduce_gradients_pp0; every pipeline rank "
                                 "reduces a gradient buffer of its own "
                                 "(mt-plan-gradient-reduction pipeline-size=" +
                                 llvm::Twine(pipelineSize) + ")");
    }
    FailureOr<Object> buffer =
        writeGradientBuffer(module, reduce, gatherName, parameterIndex, 1,
                            accumulations, tiedAcrossRanks, FirstReads());
    if (failed(buffer))
      return failure();
    (*buffer)["pipeline_rank"] = rank;
    (*buffer)["reduce_function"] = reduceName;
    if ((*buffer)["distributed_optimizer"].getAsBoolean().value_or(false))
      (*buffer)["gather_function"] = gatherName;
    buffers.push_back(std::move(*buffer));
  }
  return std::optional<Array>(std::move(buffers));
}

static Object writeModel(mt::ModelAttr model) {
  return Object{
      {"name", model.getName()},
      {"num_layers", model.getNumLayers()},
      {"hidden_size", model.getHiddenSize()},
      {"num_attention_heads", model.getNumAttentionHeads()},
      {"num_query_groups", model.getNumQueryGroups()},
      {"ffn_hidden_size", model.getFfnHiddenSize()},
      {"seq_length", model.getSeqLength()},
      {"vocab_size", model.getVocabSize()},
      {"padded_vocab_size", model.getPaddedVocabSize()},
      {"micro_batch_size", model.getMicroBatchSize()},
      {"global_batch_size", model.getGlobalBatchSize()},
      {"tensor_model_parallel_size", model.getTensorModelParallelSize()},
      {"pipeline_model_parallel_size", model.getPipelineModelParallelSize()},
      {"data_parallel_size", model.getDataParallelSize()},
      {"precision", model.getPrecision()},
  };
}

/// Checks that the module is partitioned for the layout `mt.model` names:
/// its grid holds data x tensor parallel ranks (times the context-parallel
/// ranks its context-parallel ops name: the trainer finds the axis on
/// them), and a pipeline plan is given exactly when it names pipeline
/// parallelism.
static LogicalResult checkLayout(ModuleOp module, mt::ModelAttr model,
                                 ArrayRef<shard::GridOp> grids,
                                 int64_t pipelineSize, bool hasPipeline) {
  int64_t tp = model.getTensorModelParallelSize();
  int64_t dp = model.getDataParallelSize();
  int64_t ranks = 1;
  if (!grids.empty()) {
    shard::GridOp grid = grids.front();
    for (int64_t size : grid.getShape())
      ranks *= size;
  }
  int64_t cp = 1;
  module.walk([&](Operation *op) {
    if (auto block = dyn_cast<mt::AttentionBlockOp>(op))
      cp = std::max<int64_t>(cp, block.getContextSize());
    else if (auto size = op->getAttrOfType<IntegerAttr>(mt::kContextSizeAttrName))
      cp = std::max<int64_t>(cp, size.getInt());
  });
  if (cp > 1 && ranks == tp * dp * cp)
    ranks /= cp;
  if (ranks != tp * dp) {
    std::string partitioned =
        grids.empty() ? std::string("not partitioned")
                      : "partitioned for " + std::to_string(ranks) + " ranks";
    return module.emitError()
           << "cannot be written to a bundle: its mt.model names "
           << "tensor_model_parallel_size " << tp << " x data_parallel_size "
           << dp << " (" << tp * dp << " ranks), but the module is "
           << partitioned
           << "; run megatron-partition-pipeline with tensor-parallel-size="
           << tp << " data-parallel-size=" << dp
           << ", or correct the attribute";
  }
  int64_t pp = model.getPipelineModelParallelSize();
  if ((pp > 1) != hasPipeline || (hasPipeline && pp != pipelineSize)) {
    std::string plan =
        hasPipeline
            ? "the pipeline plan has " + std::to_string(pipelineSize) + " ranks"
            : std::string("no pipeline plan is given");
    return module.emitError()
           << "cannot be written to a bundle: its mt.model names "
           << "pipeline_model_parallel_size " << pp << ", but " << plan
           << "; pipeline bundles come from megatron-compile";
  }
  return success();
}

/// Per parameter, the pipeline ranks whose stages read it, in increasing
/// order: one, or for a table tied across stages (GPT-2's word embeddings,
/// read by the first stage's embedding and the last stage's output layer)
/// each rank that holds a copy: its embedding group, over which the runtime
/// sums its gradient every iteration (Megatron-LM's embedding group). Per
/// FP8 meta, likewise, the ranks whose stages cast with it (one: a meta
/// belongs to one layer's linear).
static llvm::StringMap<SmallVector<int64_t, 2>>
pipelineRanks(ModuleOp module, int64_t pipelineSize) {
  llvm::StringMap<SmallVector<int64_t, 2>> ranks;
  for (auto function : module.getOps<func::FuncOp>()) {
    auto stage = function->getAttrOfType<IntegerAttr>("mt.pipeline_stage");
    if (!stage)
      continue;
    int64_t rank = stage.getInt() % pipelineSize;
    auto claim = [&](StringRef name) {
      SmallVector<int64_t, 2> &list = ranks[name];
      auto at = llvm::lower_bound(list, rank);
      if (at == list.end() || *at != rank)
        list.insert(at, rank);
    };
    for (unsigned i = 0, e = function.getNumArguments(); i < e; ++i)
      if (auto name =
              function.getArgAttrOfType<FlatSymbolRefAttr>(i, "mt.parameter"))
        claim(name.getValue());
    function.walk([&](mt::GetParameterOp read) { claim(read.getName()); });
    function.walk([&](mt::Fp8ScaleOp read) { claim(read.getMeta()); });
    function.walk([&](mt::Fp8UpdateOp update) { claim(update.getMeta()); });
  }
  return ranks;
}

FailureOr<std::string>
megatron::serializeBundle(ModuleOp module,
                          const llvm::json::Object *pipeline) {
  auto model = module->getAttrOfType<mt::ModelAttr>(mt::kModelAttrName);
  // A pipeline adds its axis before the partition's grid axes.
  int64_t pipelineSize =
      pipeline ? pipeline->getInteger("size").value_or(1) : 1;
  int64_t axisShift = pipeline ? 1 : 0;
  llvm::StringMap<SmallVector<int64_t, 2>> pipelineRank;
  if (pipeline)
    pipelineRank = pipelineRanks(module, pipelineSize);
  Array parameters;
  llvm::StringMap<int64_t> parameterIndex;
  DenseSet<int64_t> tiedAcrossRanks;
  for (auto parameter : module.getOps<mt::ParameterOp>()) {
    RankedTensorType type = parameter.getTensorType();
    FailureOr<StringRef> dtype = dtypeName(parameter, type.getElementType());
    if (failed(dtype))
      return failure();
    Object entry{{"name", parameter.getSymName()},
                 {"shape", Array(type.getShape())},
                 {"dtype", *dtype},
                 {"init", mt::stringifyInitMethod(parameter.getInit())},
                 // Megatron-LM decays every parameter but biases and rank-1
                 // tensors (norm weights).
                 {"weight_decay", type.getRank() > 1 &&
                                      !parameter.getSymName().ends_with(".bias")}};
    if (FloatAttr std = parameter.getStdAttr())
      entry["std"] = std.getValueAsDouble();
    if (FloatAttr rate = parameter.getExpertBiasUpdateRateAttr())
      entry["expert_bias_update_rate"] = rate.getValueAsDouble();
    if (auto split = parameter->getAttrOfType<ArrayAttr>("mt.split_axes")) {
      Array dims;
      for (auto dim : split.getAsRange<DenseI16ArrayAttr>())
        dims.push_back(Array(llvm::map_to_vector(dim.asArrayRef(), [&](int16_t a) {
          return static_cast<int64_t>(a) + axisShift;
        })));
      entry["split_axes"] = std::move(dims);
    }
    if (pipeline) {
      auto it = pipelineRank.find(parameter.getSymName());
      if (it == pipelineRank.end())
        return errorAt(parameter, "no pipeline stage reads it");
      // The first rank owns it (the gradient norm counts it there,
      // checkpoints save it from there); the others hold copies.
      entry["pipeline_rank"] = it->second.front();
      if (it->second.size() > 1) {
        entry["pipeline_ranks"] = Array(ArrayRef<int64_t>(it->second));
        tiedAcrossRanks.insert(static_cast<int64_t>(parameters.size()));
      }
    }
    parameterIndex[parameter.getSymName()] = parameters.size();
    parameters.push_back(std::move(entry));
  }

  // The FP8 metas, by the index fp8_scale and fp8_update name.
  llvm::StringMap<int64_t> metaIndex;
  Array metas;
  for (auto meta : module.getOps<mt::Fp8MetaOp>()) {
    FailureOr<StringRef> format = dtypeName(meta, meta.getFormat());
    if (failed(format))
      return failure();
    Object entry{{"name", meta.getSymName()}, {"format", *format}};
    // A pipeline rank keeps the state of the metas its stages cast with;
    // checkpoints save each from there.
    if (pipeline) {
      auto it = pipelineRank.find(meta.getSymName());
      if (it == pipelineRank.end())
        return errorAt(meta, "no pipeline stage casts with it");
      if (it->second.size() > 1)
        return errorAt(meta, "stages of several pipeline ranks cast with it");
      entry["pipeline_rank"] = it->second.front();
    }
    metaIndex[meta.getSymName()] = metas.size();
    metas.push_back(std::move(entry));
  }

  Array functions;
  FusedKernelTable kernels;
  mt::SideBufferOptions sideBuffers;
  sideBuffers.mixedPrecision = model && model.getPrecision() == "bf16";
  // With gradient buckets, the gradients are accumulated as they are made.
  bool buckets = llvm::any_of(module.getOps<func::FuncOp>(), [](auto f) {
    return f->hasAttr("mt.bucket_of");
  });
  Accumulations accumulations;
  FirstReads firstReads;
  for (auto function : module.getOps<func::FuncOp>()) {
    FailureOr<llvm::json::Value> written =
        FunctionWriter(function, parameterIndex, metaIndex, axisShift,
                       kernels, sideBuffers, buckets)
            .write();
    if (failed(written))
      return failure();
    const Array *instructions =
        written->getAsObject()->getArray("instructions");
    // train_step's values that get_parameter made, and their parameters.
    DenseMap<int64_t, int64_t> parameterOf;
    bool step = function.getSymName() == "train_step";
    for (auto [at, instruction] : llvm::enumerate(*instructions)) {
      const Object *object = instruction.getAsObject();
      if (step && object->getString("op") == "get_parameter") {
        parameterOf[*(*object->getArray("results"))[0].getAsInteger()] =
            *object->getObject("attrs")->getInteger("parameter");
        continue;
      }
      if (const Array *operands = object->getArray("operands");
          operands && step)
        for (const llvm::json::Value &operand : *operands)
          if (auto read = parameterOf.find(*operand.getAsInteger());
              read != parameterOf.end())
            firstReads.try_emplace(read->second, static_cast<int64_t>(at));
      if (object->getString("op") != "accumulate_gradient")
        continue;
      accumulations[function.getSymName()].push_back(
          {*object->getObject("attrs")->getInteger("parameter"),
           static_cast<int64_t>(at)});
    }
    functions.push_back(std::move(*written));
  }

  Object root{{"format", "megatron-bundle"},
              {"version", kBundleFormatVersion},
              {"producer", "megatron-compile"},
              {"parameters", std::move(parameters)},
              {"functions", std::move(functions)}};
  if (auto recipe = module->getAttrOfType<mt::Fp8RecipeAttr>(mt::kFp8AttrName))
    root["fp8"] = Object{{"format", recipe.getFormat()},
                         {"scaling", recipe.getScaling()},
                         {"amax_history_len", recipe.getAmaxHistoryLen()},
                         {"amax_compute_algo", recipe.getAmaxComputeAlgo()},
                         {"margin", recipe.getMargin()},
                         {"metas", std::move(metas)}};
  // Several ranks: the one device grid the partitioned program runs on.
  auto grids = llvm::to_vector(module.getOps<shard::GridOp>());
  if (grids.size() > 1)
    return errorAt(grids[1], "a bundle runs on one device grid");
  if (model) {
    if (failed(checkLayout(module, model, grids, pipelineSize, pipeline)))
      return failure();
    root["model"] = writeModel(model);
  }
  if (pipeline) {
    // [pp, dp, tp]: Megatron-LM's rank order, tensor-parallel ranks
    // adjacent, pipeline ranks farthest apart.
    Array shape{pipelineSize};
    if (grids.empty()) {
      shape.push_back(1);
      shape.push_back(1);
    } else {
      for (int64_t size : grids.front().getShape())
        shape.push_back(size);
    }
    root["grid"] = Object{{"shape", std::move(shape)}};
    root["pipeline"] = Object(*pipeline);
  } else if (!grids.empty()) {
    root["grid"] = Object{{"shape", Array(grids.front().getShape())}};
  }
  if (pipeline) {
    FailureOr<std::optional<Array>> buffers = writeGradientBuffers(
        module, parameterIndex, pipelineSize, accumulations, tiedAcrossRanks);
    if (failed(buffers))
      return failure();
    if (*buffers)
      root["gradient_buffers"] = std::move(**buffers);
  } else if (auto reduce =
                 module.lookupSymbol<func::FuncOp>("reduce_gradients")) {
    FailureOr<Object> buffer =
        writeGradientBuffer(module, reduce, "gather_parameters", parameterIndex,
                            0, accumulations, tiedAcrossRanks, firstReads);
    if (failed(buffer))
      return failure();
    root["gradient_buffer"] = std::move(*buffer);
  }
  // The fused kernels: compiled once here, stored in the payload.
  std::string payload;
  if (!kernels.empty()) {
    std::string source = kernels.source();
    llvm::Expected<CompiledKernels> compiled = compileFusedKernels(source);
    if (!compiled)
      return module.emitError()
             << "cannot compile the " << kernels.kernelNames().size()
             << " fused kernels: " << llvm::toString(compiled.takeError());
    auto blob = [&](const std::string &bytes) {
      Object range{{"offset", static_cast<int64_t>(payload.size())},
                   {"size", static_cast<int64_t>(bytes.size())}};
      payload += bytes;
      return range;
    };
    Object section{{"arch", compiled->arch},
                   {"names", Array(kernels.kernelNames())}};
    section["cubin"] = blob(compiled->cubin);
    section["ptx"] = blob(compiled->ptx);
    section["source"] = blob(source);
    root["kernels"] = std::move(section);
  }
  std::string manifest;
  llvm::raw_string_ostream(manifest) << llvm::json::Value(std::move(root));

  // The header of docs/BundleFormat.md.
  std::string bytes = "MTBUNDLE";
  auto append = [&](auto value) {
    char buffer[sizeof(value)];
    llvm::support::endian::write(buffer, value, llvm::endianness::little);
    bytes.append(buffer, sizeof(value));
  };
  append(kBundleFormatVersion);
  append(uint32_t(0));
  append(uint64_t(manifest.size()));
  append(uint64_t(payload.size()));
  llvm::SHA256 hash;
  hash.update(manifest);
  hash.update(payload);
  std::array<uint8_t, 32> digest = hash.final();
  bytes.append(reinterpret_cast<const char *>(digest.data()), digest.size());
  bytes += manifest;
  bytes += payload;
  return bytes;
}

LogicalResult megatron::writeBundle(ModuleOp module, StringRef path,
                                   const llvm::json::Object *pipeline) {
  FailureOr<std::string> bytes = serializeBundle(module, pipeline);
  if (failed(bytes))
    return failure();
  if (llvm::Error error =
          llvm::writeToOutput(path, [&](llvm::raw_ostream &os) {
            os << *bytes;
            return llvm::Error::success();
          }))
    return module.emitError() << "cannot write the bundle to '" << path
                              << "': " << llvm::toString(std::move(error));
  return success();
}

void megatron::registerBundleTranslation() {
  TranslateFromMLIRRegistration(
      "mlir-to-bundle",
      "writes a module that went through megatron-training-pipeline as a "
      "training bundle (docs/BundleFormat.md)",
      [](ModuleOp module, llvm::raw_ostream &os) -> LogicalResult {
        FailureOr<std::string> bytes = serializeBundle(module);
        if (failed(bytes))
          return failure();
        os << *bytes;
        return success();
      },
      [](DialectRegistry &registry) {
        registry.insert<mt::MtDialect, func::FuncDialect,
                        shard::ShardDialect>();
      });
}
