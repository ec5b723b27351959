//===- PlanGradientReduction.cpp - One gradient reduction per iteration ---===//
//
// Megatron-LM reduces the data-parallel gradients once per iteration, after
// the micro-batches have accumulated into one contiguous buffer, not once per
// micro-batch. Partitioning leaves an all-reduce over the data axis on every
// weight gradient of train_step (or of each pipeline stage's
// train_step_stage<k>); this pass moves those reductions out of the step into
// functions of their own over the whole buffer (one buffer per pipeline rank),
// and with --overlap-grad-reduce over each bucket of it, which the runtime
// reduces during the last micro-batch's backward pass.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/MathExtras.h"

#include <numeric>

namespace mlir::mt {
#define GEN_PASS_DEF_PLANGRADIENTREDUCTIONPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

/// The grid axis of the data-parallel ranks (mt-annotate-shardings).
static constexpr int16_t kDataAxis = 0;

/// The axes the buffer is reduced over: the data axis, and under context
/// parallelism the context axis too (`contextAxis`, mt-annotate-shardings'
/// axis 1), as Megatron-LM reduces and shards over its combined data x
/// context group (intra_dp_cp): a weight gradient sums the rows of every
/// data and context rank. Partitioning names no axis of one rank in its
/// reductions, so neither does the buffer (the data axis when both are of
/// one rank).
static SmallVector<int16_t> bufferAxes(shard::GridOp grid,
                                       int64_t contextAxis) {
  ArrayRef<int64_t> shape = grid.getShape();
  bool context = contextAxis > 0 &&
                 contextAxis < static_cast<int64_t>(shape.size()) &&
                 shape[contextAxis] > 1;
  SmallVector<int16_t> axes;
  if (shape[kDataAxis] > 1 || !context)
    axes.push_back(kDataAxis);
  if (context)
    axes.push_back(static_cast<int16_t>(contextAxis));
  return axes;
}

/// The ranks of `grid` along `axes`.
static int64_t ranksAlong(shard::GridOp grid, ArrayRef<int16_t> axes) {
  int64_t ranks = 1;
  for (int16_t axis : axes)
    ranks *= grid.getShape()[axis];
  return ranks;
}

/// Megatron-LM pads the distributed optimizer's buffer so that every rank's
/// shard has the same size and starts aligned (a multiple of 128 elements
/// per rank, for the collectives' bandwidth).
static constexpr int64_t kShardAlignment = 128;

namespace {

struct PlanGradientReductionPass
    : public mt::impl::PlanGradientReductionPassBase<
          PlanGradientReductionPass> {
  using PlanGradientReductionPassBase::PlanGradientReductionPassBase;

  void runOnOperation() override;

private:
  /// Replaces the data-axis all-reduce that produces each gradient result
  /// of `function` by its operand (keeping the reduction over other axes).
  /// Returns the gradients' parameters, in result order.
  FailureOr<SmallVector<std::pair<FlatSymbolRefAttr, RankedTensorType>>>
  deferReductions(func::FuncOp function, shard::GridOp grid);

  /// Emits @reduce_gradients (and with the distributed optimizer
  /// @gather_parameters) over one buffer of `gradients`, in that order; a
  /// pipeline rank's functions end in _pp<rank>.
  LogicalResult
  emitBuffer(ModuleOp module, shard::GridOp grid, Location loc,
             ArrayRef<std::pair<FlatSymbolRefAttr, RankedTensorType>> gradients,
             ArrayRef<size_t> chunkStarts, std::optional<int64_t> pipelineRank);
};

} // namespace

/// The value `value` is before its sum over the data axis, rebuilt at the
/// builder: a data-axis all-reduce gives its operand (an all-reduce over
/// more axes keeps the others); the sum commutes with the linear ops that
/// partitioning puts after it (mt.add, and shard.all_slice along other
/// axes: a tied vocabulary-parallel embedding's gradient adds the output
/// layer's reduced gradient to a slice of the reduced table gradient).
static FailureOr<Value> withoutDataReduction(OpBuilder &builder, Value value,
                                             ArrayRef<int16_t> axes) {
  Operation *op = value.getDefiningOp();
  if (auto reduce = dyn_cast_if_present<shard::AllReduceOp>(op)) {
    if (!llvm::all_of(axes,
                      [&](int16_t axis) {
                        return llvm::is_contained(reduce.getGridAxes(), axis);
                      }) ||
        reduce.getReduction() != shard::ReductionKind::Sum)
      return failure();
    SmallVector<int16_t> others =
        llvm::filter_to_vector(reduce.getGridAxes(), [&](int16_t axis) {
          return !llvm::is_contained(axes, axis);
        });
    if (others.empty())
      return reduce.getInput();
    return shard::AllReduceOp::create(
               builder, reduce.getLoc(), reduce.getType(), reduce.getGridAttr(),
               builder.getDenseI16ArrayAttr(others), reduce.getInput(),
               reduce.getReductionAttr())
        .getResult();
  }
  if (auto add = dyn_cast_if_present<AddOp>(op)) {
    FailureOr<Value> lhs = withoutDataReduction(builder, add.getLhs(), axes);
    FailureOr<Value> rhs = withoutDataReduction(builder, add.getRhs(), axes);
    if (failed(lhs) || failed(rhs))
      return failure();
    return AddOp::create(builder, add.getLoc(), add.getType(), *lhs, *rhs)
        .getResult();
  }
  if (auto slice = dyn_cast_if_present<shard::AllSliceOp>(op)) {
    if (llvm::any_of(axes, [&](int16_t axis) {
          return llvm::is_contained(slice.getGridAxes(), axis);
        }))
      return failure();
    FailureOr<Value> input =
        withoutDataReduction(builder, slice.getInput(), axes);
    if (failed(input))
      return failure();
    Operation *copy = builder.clone(*slice);
    copy->setOperand(0, *input);
    return copy->getResult(0);
  }
  return failure();
}

/// Erases `op` and then its operands' definitions once nothing reads them
/// (the replaced reductions must not run).
static void eraseIfDead(Operation *op) {
  if (!op || !op->use_empty() ||
      !isa<shard::AllReduceOp, shard::AllSliceOp, AddOp>(op))
    return;
  SmallVector<Operation *> producers;
  for (Value operand : op->getOperands())
    producers.push_back(operand.getDefiningOp());
  op->erase();
  for (Operation *producer : producers)
    eraseIfDead(producer);
}

/// Whether the parameter's declaration (mt-annotate-shardings'
/// mt.split_axes) splits it over one of the buffer's `axes`: expert
/// parallelism's routed experts.
static bool splitsOverBufferAxes(func::FuncOp function,
                                 FlatSymbolRefAttr parameter,
                                 ArrayRef<int16_t> axes) {
  auto module = function->getParentOfType<ModuleOp>();
  Operation *declaration =
      module ? SymbolTable::lookupSymbolIn(module, parameter) : nullptr;
  auto dims = declaration
                  ? declaration->getAttrOfType<ArrayAttr>("mt.split_axes")
                  : ArrayAttr();
  if (!dims)
    return false;
  for (Attribute dim : dims)
    if (auto dimAxes = dyn_cast<DenseI16ArrayAttr>(dim))
      for (int16_t axis : axes)
        if (llvm::is_contained(dimAxes.asArrayRef(), axis))
          return true;
  return false;
}

FailureOr<SmallVector<std::pair<FlatSymbolRefAttr, RankedTensorType>>>
PlanGradientReductionPass::deferReductions(func::FuncOp function,
                                           shard::GridOp grid) {
  SmallVector<std::pair<FlatSymbolRefAttr, RankedTensorType>> gradients;
  SmallVector<int16_t> axes = bufferAxes(grid, contextAxis);
  int64_t ranks = ranksAlong(grid, axes);
  auto ret = cast<func::ReturnOp>(function.getBody().front().getTerminator());
  for (OpOperand &result : ret->getOpOperands()) {
    auto parameter = function.getResultAttrOfType<FlatSymbolRefAttr>(
        result.getOperandNumber(), "mt.gradient");
    if (!parameter)
      continue;
    // Expert parallelism splits the routed experts over a buffer axis: a
    // rank's experts have whole gradients from its expert-parallel group's
    // tokens (the all-to-all dispatch), summed over the expert-data-parallel
    // group in the step where there is one, so they stay out of the
    // data-parallel buffer (the optimizer steps them whole on their ranks).
    if (splitsOverBufferAxes(function, parameter, axes))
      continue;
    auto type = cast<RankedTensorType>(result.get().getType());
    gradients.push_back({parameter, type});
    OpBuilder builder(ret);
    FailureOr<Value> local = withoutDataReduction(builder, result.get(), axes);
    if (failed(local)) {
      if (ranks == 1)
        continue;
      if (axes.size() > 1)
        return function.emitError()
               << "the gradient of " << parameter
               << " is not summed over both the data-parallel and the "
                  "context-parallel grid axes (axes 0 and "
               << axes[1] << ", " << grid.getShape()[0] << " x "
               << grid.getShape()[axes[1]]
               << " ranks); every gradient of a context-parallel step must "
                  "end in one shard.all_reduce over both (its rows are "
                  "split over them), as shard-partition leaves them";
      return function.emitError()
             << "the gradient of " << parameter
             << " is not summed over the data-parallel grid axis (axis 0 of "
                "size "
             << ranks
             << "); every gradient of a data-parallel step must end in one "
                "shard.all_reduce over it, as shard-partition leaves them";
    }
    Operation *old = result.get().getDefiningOp();
    result.set(*local);
    eraseIfDead(old);
  }
  // What a partial rebuild left unread (an add whose other side keeps its
  // reduction) must not run either.
  SmallVector<Operation *> unread;
  function.walk([&](Operation *op) {
    if (op->use_empty() &&
        isa<shard::AllReduceOp, shard::AllSliceOp, AddOp>(op))
      unread.push_back(op);
  });
  for (Operation *op : unread)
    eraseIfDead(op);
  return gradients;
}

/// The gradients of one buffer in Megatron-LM's order: a rank's model
/// chunks (pipeline stages) in order, each chunk's parameters in reverse
/// order of their declaration, the order in which the backward pass
/// produces them. A parameter that several of the rank's stages read is
/// held once, where its first stage puts it.
/// `chunkStarts` receives the position in the result where each chunk's
/// gradients begin (a bucket never spans two chunks, as Megatron-LM keeps a
/// buffer per chunk).
static SmallVector<std::pair<FlatSymbolRefAttr, RankedTensorType>> bufferOrder(
    ModuleOp module,
    ArrayRef<std::pair<
        int64_t, SmallVector<std::pair<FlatSymbolRefAttr, RankedTensorType>>>>
        stages,
    SmallVectorImpl<size_t> &chunkStarts) {
  llvm::StringMap<int64_t> declared;
  for (auto [index, parameter] : llvm::enumerate(module.getOps<ParameterOp>()))
    declared[parameter.getSymName()] = index;
  SmallVector<std::pair<FlatSymbolRefAttr, RankedTensorType>> ordered;
  llvm::StringSet<> held;
  for (const auto &[stage, gradients] : stages) {
    chunkStarts.push_back(ordered.size());
    auto chunk = llvm::to_vector(gradients);
    llvm::stable_sort(chunk, [&](const auto &a, const auto &b) {
      return declared.lookup(a.first.getValue()) >
             declared.lookup(b.first.getValue());
    });
    for (auto &gradient : chunk)
      if (held.insert(gradient.first.getValue()).second)
        ordered.push_back(gradient);
  }
  return ordered;
}

/// Megatron-LM's buckets over a buffer of gradients with `sizes` elements
/// (in buffer order): a bucket closes at the first gradient boundary where
/// it holds at least `bucketSize` elements, and before each chunk start.
/// Returns the index of each bucket's first gradient.
static SmallVector<size_t> bucketStarts(ArrayRef<int64_t> sizes,
                                        ArrayRef<size_t> chunkStarts,
                                        int64_t bucketSize) {
  SmallVector<size_t> starts;
  int64_t held = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (starts.empty() || held >= bucketSize ||
        llvm::is_contained(chunkStarts, i)) {
      starts.push_back(i);
      held = 0;
    }
    held += sizes[i];
  }
  return starts;
}

LogicalResult PlanGradientReductionPass::emitBuffer(
    ModuleOp module, shard::GridOp grid, Location loc,
    ArrayRef<std::pair<FlatSymbolRefAttr, RankedTensorType>> gradients,
    ArrayRef<size_t> chunkStarts, std::optional<int64_t> pipelineRank) {
  Type elementType;
  for (auto &[parameter, type] : gradients) {
    if (elementType && type.getElementType() != elementType)
      return emitError(loc)
             << "the gradient of " << parameter << " is "
             << type.getElementType() << " but earlier ones are "
             << elementType
             << "; one gradient buffer holds one element type";
    elementType = type.getElementType();
  }
  if (gradients.empty())
    return success();

  SmallVector<int16_t> axes = bufferAxes(grid, contextAxis);
  int64_t dataRanks = ranksAlong(grid, axes);
  // The distributed optimizer pads (Megatron-LM): the whole buffer, or with
  // buckets each bucket, to a multiple of lcm(dp, 128), so that every rank's
  // share of it has the same size and starts aligned.
  int64_t multiple =
      distributedOptimizer ? std::lcm(dataRanks, kShardAlignment) : 1;
  SmallVector<int64_t> sizes = llvm::map_to_vector(
      gradients, [](const auto &g) { return g.second.getNumElements(); });
  SmallVector<size_t> starts;
  if (bucketSize > 0)
    starts = bucketStarts(sizes, chunkStarts, bucketSize);
  // Each bucket's [offset, end) in the buffer, and each gradient's offset.
  SmallVector<std::pair<int64_t, int64_t>> bucketRanges;
  SmallVector<int64_t> offsets;
  int64_t padded = 0;
  for (size_t i = 0; i < gradients.size(); ++i) {
    if (llvm::is_contained(starts, i) && i > 0 && distributedOptimizer)
      padded = llvm::alignTo(padded, multiple);
    offsets.push_back(padded);
    padded += sizes[i];
  }
  padded = llvm::alignTo(padded, multiple);
  for (auto [bucket, first] : llvm::enumerate(starts)) {
    size_t end =
        bucket + 1 < starts.size() ? starts[bucket + 1] : gradients.size();
    bucketRanges.push_back(
        {offsets[first], end < gradients.size() ? offsets[end] : padded});
  }
  MLIRContext *context = &getContext();
  SmallVector<Attribute> layout = llvm::map_to_vector(
      gradients, [](const auto &g) -> Attribute { return g.first; });
  auto layoutAttr = ArrayAttr::get(context, layout);
  auto vectorType = [&](int64_t n) {
    return RankedTensorType::get({n}, elementType);
  };
  auto bufferType = vectorType(padded);
  auto shardType = vectorType(padded / dataRanks);
  auto gridRef = FlatSymbolRefAttr::get(grid.getSymNameAttr());
  OpBuilder builder = OpBuilder::atBlockEnd(module.getBody());
  auto dataAxis = builder.getDenseI16ArrayAttr(axes);
  auto sum = shard::ReductionKindAttr::get(context, shard::ReductionKind::Sum);
  // Each pipeline rank reduces its own buffer, over its data-parallel group.
  std::string suffix =
      pipelineRank ? ("_pp" + llvm::Twine(*pipelineRank)).str() : "";

  auto makeFunction = [&](const Twine &name, RankedTensorType input,
                          RankedTensorType output, auto buildBody) {
    auto function =
        func::FuncOp::create(builder, loc, (name + suffix).str(),
                             builder.getFunctionType({input}, {output}));
    if (pipelineRank)
      function->setAttr("mt.pipeline_rank",
                        builder.getI64IntegerAttr(*pipelineRank));
    Block *body = function.addEntryBlock();
    OpBuilder inner = OpBuilder::atBlockBegin(body);
    Value result = buildBody(inner, body->getArgument(0));
    func::ReturnOp::create(inner, loc, result);
    return function;
  };
  auto reduceScatter = [&](OpBuilder &b, Value buffer) -> Value {
    int64_t n = cast<RankedTensorType>(buffer.getType()).getDimSize(0);
    return shard::ReduceScatterOp::create(b, loc, vectorType(n / dataRanks),
                                          gridRef, dataAxis, buffer, sum,
                                          b.getIndexAttr(0));
  };
  auto allGather = [&](OpBuilder &b, Value shard) -> Value {
    int64_t n = cast<RankedTensorType>(shard.getType()).getDimSize(0);
    return shard::AllGatherOp::create(b, loc, vectorType(n * dataRanks),
                                      gridRef, dataAxis, shard,
                                      b.getIndexAttr(0));
  };
  auto allReduce = [&](OpBuilder &b, Value buffer) -> Value {
    return shard::AllReduceOp::create(b, loc, buffer.getType(), gridRef,
                                      dataAxis, buffer, sum);
  };
  // Under the distributed optimizer with buckets, each rank holds a 1/dp of
  // every bucket (Megatron-LM's per-bucket shards): the rank's shard is its
  // part of each bucket in bucket order, and the whole buffer's functions
  // reduce-scatter (all-gather) bucket by bucket.
  bool perBucketShards = distributedOptimizer && !bucketRanges.empty();
  auto bucketwise = [&](OpBuilder &b, Value input, bool inputIsShard,
                        auto collective) -> Value {
    SmallVector<Type> pieces;
    for (auto [begin, end] : bucketRanges)
      pieces.push_back(
          vectorType(inputIsShard ? (end - begin) / dataRanks : end - begin));
    auto split = SplitOp::create(b, loc, pieces, input, b.getI64IntegerAttr(0));
    SmallVector<Value> done;
    for (Value piece : split.getResults())
      done.push_back(collective(b, piece));
    int64_t total = 0;
    for (Value v : done)
      total += cast<RankedTensorType>(v.getType()).getDimSize(0);
    return ConcatOp::create(b, loc, vectorType(total), done,
                            b.getI64IntegerAttr(0));
  };

  // --overlap-grad-reduce: one function per bucket, over the bucket's
  // slice of the buffer (the last bucket holds the padding, so the buckets
  // tile the buffer): an all-reduce, or under the distributed optimizer a
  // reduce-scatter (and a gather of the bucket's parameters). Each element
  // is the same sum over the ranks in the same fixed order as in the whole
  // buffer's reduction.
  std::string reduceName = ("reduce_gradients" + suffix);
  for (auto [bucket, range] : llvm::enumerate(bucketRanges)) {
    auto [begin, end] = range;
    size_t first = starts[bucket];
    size_t last =
        bucket + 1 < starts.size() ? starts[bucket + 1] : gradients.size();
    SmallVector<Attribute> members;
    for (size_t i = first; i < last; ++i)
      members.push_back(gradients[i].first);
    auto type = vectorType(end - begin);
    auto function = makeFunction(
        "reduce_gradients_bucket" + Twine(bucket), type,
        perBucketShards ? vectorType((end - begin) / dataRanks) : type,
        [&](OpBuilder &b, Value slice) {
          return perBucketShards ? reduceScatter(b, slice)
                                 : allReduce(b, slice);
        });
    function->setAttr("mt.bucket_of",
                      FlatSymbolRefAttr::get(context, reduceName));
    function->setAttr("mt.bucket_offset", builder.getI64IntegerAttr(begin));
    function->setAttr("mt.gradient_bucket", ArrayAttr::get(context, members));
    if (!perBucketShards)
      continue;
    auto gather =
        makeFunction("gather_parameters_bucket" + Twine(bucket),
                     vectorType((end - begin) / dataRanks), type, allGather);
    function->setAttr("mt.bucket_gather",
                      FlatSymbolRefAttr::get(gather.getSymNameAttr()));
    if (overlapParamGather)
      gather->setAttr("mt.overlap_param_gather", builder.getUnitAttr());
  }

  auto markBuffer = [&](func::FuncOp function, StringRef layoutName) {
    function->setAttr(layoutName, layoutAttr);
    function->setAttr("mt.buffer_offsets",
                      builder.getDenseI64ArrayAttr(offsets));
  };
  if (!distributedOptimizer) {
    markBuffer(
        makeFunction("reduce_gradients", bufferType, bufferType, allReduce),
        "mt.gradient_buffer");
    return success();
  }
  // The distributed optimizer: each data rank receives the sum of its
  // shard of the buffer, updates those elements, and gathers the others.
  markBuffer(makeFunction("reduce_gradients", bufferType, shardType,
                          [&](OpBuilder &b, Value buffer) {
                            return perBucketShards
                                       ? bucketwise(b, buffer, false,
                                                    reduceScatter)
                                       : reduceScatter(b, buffer);
                          }),
             "mt.gradient_buffer");
  markBuffer(makeFunction("gather_parameters", shardType, bufferType,
                          [&](OpBuilder &b, Value shard) {
                            return perBucketShards
                                       ? bucketwise(b, shard, true, allGather)
                                       : allGather(b, shard);
                          }),
             "mt.parameter_buffer");
  return success();
}

void PlanGradientReductionPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (bucketSize < 0) {
    module.emitError() << "bucket-size=" << static_cast<int64_t>(bucketSize)
                       << " is negative; give the least elements of a "
                          "gradient bucket (Megatron-LM's --ddp-bucket-size), "
                          "or 0 for one reduction of the whole buffer";
    return signalPassFailure();
  }
  if (overlapParamGather && (!distributedOptimizer || bucketSize == 0)) {
    module.emitError()
        << "overlap-param-gather gathers the distributed optimizer's "
           "per-bucket parameter shards; it needs distributed-optimizer and "
           "bucket-size > 0 (found distributed-optimizer="
        << (distributedOptimizer ? "true" : "false")
        << ", bucket-size=" << static_cast<int64_t>(bucketSize) << ")";
    return signalPassFailure();
  }
  auto grids = llvm::to_vector(module.getOps<shard::GridOp>());
  if (grids.empty())
    return; // One rank: nothing to reduce, nothing to shard.
  shard::GridOp grid = grids.front();
  if (ranksAlong(grid, bufferAxes(grid, contextAxis)) == 1 &&
      !distributedOptimizer)
    return;

  using Gradients = SmallVector<std::pair<FlatSymbolRefAttr, RankedTensorType>>;
  // The pipeline stages of the training step (train_step_stage<k>); the
  // evaluation stages have no gradients.
  SmallVector<std::pair<int64_t, func::FuncOp>> stages;
  for (auto function : module.getOps<func::FuncOp>())
    if (auto stage =
            function->getAttrOfType<IntegerAttr>("mt.pipeline_stage"))
      if (function.getSymName().starts_with(trainFunction + "_stage"))
        stages.push_back({stage.getInt(), function});
  if (stages.empty()) {
    auto step = module.lookupSymbol<func::FuncOp>(trainFunction);
    if (!step) {
      module.emitError() << "no function @" << trainFunction
                         << " to plan the gradient reduction of; name the "
                            "training step with train-function=";
      return signalPassFailure();
    }
    FailureOr<Gradients> gradients = deferReductions(step, grid);
    if (failed(gradients))
      return signalPassFailure();
    std::pair<int64_t, Gradients> chunk = {0, std::move(*gradients)};
    SmallVector<size_t> chunkStarts;
    auto ordered = bufferOrder(module, chunk, chunkStarts);
    if (failed(emitBuffer(module, grid, step.getLoc(), ordered, chunkStarts,
                          std::nullopt)))
      return signalPassFailure();
    return;
  }

  // Pipeline parallelism: stage k runs on pipeline rank k % P (Megatron-LM's
  // interleaving), and each pipeline rank reduces the gradients of its
  // stages in a buffer of its own, once per iteration.
  if (pipelineSize < 1) {
    stages.front().second.emitError()
        << "the module holds pipeline stages (@"
        << stages.front().second.getSymName()
        << "); give the pipeline's size with pipeline-size= (found "
        << static_cast<int64_t>(pipelineSize)
        << ", expected 1 or more) so that each stage's "
        << "gradients join its pipeline rank's buffer";
    return signalPassFailure();
  }
  llvm::sort(stages, [](const auto &a, const auto &b) { return a.first < b.first; });
  SmallVector<SmallVector<std::pair<int64_t, Gradients>>> perRank(pipelineSize);
  for (auto &[stage, function] : stages) {
    FailureOr<Gradients> gradients = deferReductions(function, grid);
    if (failed(gradients))
      return signalPassFailure();
    perRank[stage % pipelineSize].push_back({stage, std::move(*gradients)});
  }
  for (auto [rank, chunks] : llvm::enumerate(perRank)) {
    if (chunks.empty())
      continue;
    SmallVector<size_t> chunkStarts;
    auto ordered = bufferOrder(module, chunks, chunkStarts);
    if (failed(emitBuffer(module, grid, stages.front().second.getLoc(), ordered,
                          chunkStarts, static_cast<int64_t>(rank))))
      return signalPassFailure();
  }
}
