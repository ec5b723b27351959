//===- PrintCollectives.cpp - Each step's collectives and their bytes ------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Format.h"

namespace mlir::mt {
#define GEN_PASS_DEF_PRINTCOLLECTIVESPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

/// The grid axes of Megatron-LM's layout (mt-annotate-shardings): data x
/// tensor, or data x context x tensor under context parallelism (a grid of
/// three axes, the tensor axis fastest).
static constexpr int16_t kDataAxis = 0;
static int16_t tensorAxisOf(ArrayRef<int64_t> grid) {
  return grid.size() == 3 ? 2 : 1;
}
static int16_t contextAxisOf(ArrayRef<int64_t> grid) {
  return grid.size() == 3 ? 1 : -1;
}

static int64_t bytesOf(RankedTensorType type) {
  return type.getNumElements() *
         std::max<int64_t>(1, type.getElementTypeBitWidth() / 8);
}

static std::string shapeOf(RankedTensorType type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  llvm::interleave(type.getShape(), os, "x");
  os << (type.getRank() ? "x" : "") << type.getElementType();
  return text;
}

/// Parameters used on sequence shards under sequence parallelism: the
/// norms, the row-parallel layers' biases (added after the reduce-scatter)
/// and the learned position embeddings (looked up for the rank's
/// positions); their gradients are all-reduced over the tensor axis, as
/// Megatron-LM all-reduces its sequence_parallel parameters.
static bool usedOnSequenceShards(StringRef name) {
  return name.contains("layernorm.") || name.contains(".ln_") ||
         name.starts_with("model.norm.") ||
         name.starts_with("transformer.ln_f.") ||
         name.ends_with("attn.c_proj.bias") ||
         name.ends_with("mlp.c_proj.bias") || name.ends_with("o_proj.bias") ||
         name.ends_with("down_proj.bias") || name == "transformer.wpe.weight";
}

/// The parameter of each transformer layer that counts layers.
static bool isLayerNorm(StringRef name) {
  return name.contains(".input_layernorm.weight") ||
         name.contains(".ln_1.weight");
}

static int64_t argumentElements(func::FuncOp function, StringRef name) {
  for (unsigned i = 0; i < function.getNumArguments(); ++i)
    if (auto attr = function.getArgAttrOfType<StringAttr>(i, "mt.name"))
      if (attr.getValue() == name)
        if (auto type =
                dyn_cast<RankedTensorType>(function.getArgument(i).getType()))
          return type.getNumElements();
  return 0;
}

/// The step a pipeline stage function belongs to: "train_step" of
/// train_step_stage3_backward.
static StringRef stepOf(func::FuncOp function) {
  StringRef name = function.getSymName();
  return name.take_front(name.find("_stage"));
}

/// What of the decoder one function computes, for Megatron-LM's
/// tensor-parallel analysis. A pipeline stage function (mt.pipeline_stage)
/// holds its stage's layers only; the first stage the embedding, the last
/// the output layer and the loss; a forward or backward half
/// (mt-split-forward-backward) one direction. Its activations are the
/// micro-batch's, whatever the stage receives.
struct StepShape {
  std::optional<int64_t> stage;
  int64_t layers = 0, tokens = 0, sequenceShardGradientBytes = 0;
  bool forward = true, backward = false, embedding = true,
       outputLayer = true, hasLoss = false;
};

static StepShape stepShape(ModuleOp module, func::FuncOp function) {
  StepShape shape;
  llvm::StringSet<> layerNorms;
  auto note = [&](StringRef parameter) {
    if (isLayerNorm(parameter))
      layerNorms.insert(parameter);
  };
  for (unsigned i = 0; i < function.getNumArguments(); ++i)
    if (auto p = function.getArgAttrOfType<FlatSymbolRefAttr>(i, "mt.parameter"))
      note(p.getValue());
  for (unsigned i = 0; i < function.getNumResults(); ++i)
    if (auto p = function.getResultAttrOfType<FlatSymbolRefAttr>(
            i, "mt.gradient")) {
      note(p.getValue());
      shape.backward = true;
      if (usedOnSequenceShards(p.getValue()))
        shape.sequenceShardGradientBytes +=
            bytesOf(cast<RankedTensorType>(function.getResultTypes()[i]));
    }
  function.walk([&](GetParameterOp get) { note(get.getName()); });
  shape.layers = layerNorms.size();
  shape.hasLoss = argumentElements(function, "labels") > 0;
  shape.tokens = argumentElements(function, "tokens");
  if (!shape.tokens)
    shape.tokens = argumentElements(function, "labels");
  auto stage = function->getAttrOfType<IntegerAttr>("mt.pipeline_stage");
  if (!stage) {
    if (!shape.tokens && function.getNumArguments() > 0)
      if (auto ids =
              dyn_cast<RankedTensorType>(function.getArgument(0).getType()))
        shape.tokens = ids.getNumElements();
    return shape;
  }
  shape.stage = stage.getInt();
  StringRef name = function.getSymName();
  if (name.ends_with("_forward"))
    shape.backward = false;
  if (name.ends_with("_backward"))
    shape.forward = false;
  // The stage's neighbours in the same step: the last stage number, and the
  // micro-batch's tokens where this stage receives an activation.
  int64_t last = 0;
  for (auto other : module.getOps<func::FuncOp>()) {
    auto otherStage =
        other->getAttrOfType<IntegerAttr>("mt.pipeline_stage");
    if (!otherStage || stepOf(other) != stepOf(function))
      continue;
    last = std::max(last, otherStage.getInt());
    if (!shape.tokens)
      shape.tokens = argumentElements(other, "tokens");
  }
  shape.embedding = *shape.stage == 0;
  shape.outputLayer = *shape.stage == last;
  shape.hasLoss |= shape.outputLayer && stepOf(function) != "predict_step";
  return shape;
}

/// The once-per-iteration functions of mt-plan-gradient-reduction beside
/// Megatron-LM's volumes: the rank's gradients all-reduced, or, with the
/// distributed optimizer, reduce-scattered (the padded buffer) and the
/// updated parameters all-gathered (one shard in, the buffer out). The wire
/// traffic of ring collectives per rank: 2 (n-1)/n of the buffer for an
/// all-reduce, (n-1)/n for a reduce-scatter or an all-gather, so the
/// distributed optimizer moves what the all-reduce moves. Under pipeline
/// parallelism each pipeline rank has such functions for its own buffer
/// (reduce_gradients_pp<r>), holding its stages' gradients. Under context
/// parallelism the group is the data x context ranks (Megatron-LM's
/// intra_dp_cp), `group` names it.
static void printBufferPrediction(func::FuncOp function, int64_t dataRanks,
                                  int64_t dataBytes, StringRef group,
                                  const llvm::StringMap<int64_t> &gradientBytesOf,
                                  llvm::raw_ostream &os) {
  auto layout = function->getAttrOfType<ArrayAttr>("mt.gradient_buffer");
  if (!layout)
    layout = function->getAttrOfType<ArrayAttr>("mt.parameter_buffer");
  int64_t gradientBytes = 0;
  for (auto parameter : layout.getAsRange<FlatSymbolRefAttr>())
    gradientBytes += gradientBytesOf.lookup(parameter.getValue());
  auto buffer = cast<RankedTensorType>(
      function->hasAttr("mt.gradient_buffer")
          ? function.getFunctionType().getInput(0)
          : function.getFunctionType().getResult(0));
  int64_t bufferBytes = bytesOf(buffer);
  int64_t padding = bufferBytes - gradientBytes;
  auto wire = [&](int64_t numerator) {
    return numerator * (dataRanks - 1) * bufferBytes / dataRanks;
  };
  StringRef name = function.getSymName();
  bool scatters = function
                      .walk([](shard::ReduceScatterOp) {
                        return WalkResult::interrupt();
                      })
                      .wasInterrupted();
  if (auto rank = function->getAttrOfType<IntegerAttr>("mt.pipeline_rank"))
    os << "  pipeline rank " << rank.getInt()
       << ": once per iteration, after its stages' last backward pass\n";
  os << "  " << group << ": " << dataBytes
     << " bytes (Megatron-LM's analysis: ";
  if (name.starts_with("gather_parameters"))
    os << "one all-gather of the rank's 1/" << dataRanks
       << " of the parameter buffer = " << bufferBytes / dataRanks
       << "; on a ring " << wire(1) << " per rank)\n";
  else if (scatters)
    os << "one reduce-scatter of the rank's gradients = " << gradientBytes
       << " + " << padding << " padding = " << bufferBytes << "; on a ring "
       << wire(1) << " per rank)\n";
  else
    os << "one all-reduce of the rank's gradients = " << gradientBytes
       << "; on a ring " << wire(2) << " per rank)\n";
}

/// Megatron-LM's tensor-parallel volume of `shape`, in bytes: an all-reduce
/// of the [b, s, h] activation for each attention and MLP block per
/// direction, for the vocabulary-parallel embedding's forward pass and for
/// the output layer's input gradient; the cross-entropy's three [b, s]
/// values (row maximum, sum of exponentials, target logit) or the logits'
/// all-gather. Under sequence parallelism each all-reduce is a
/// reduce-scatter of [b, s, h] and an all-gather of [b, s/t, h], except at
/// the ends, where the embedding's reduce-scatter and the output layer's
/// all-gather (and their gradients, an all-gather and a reduce-scatter)
/// pair with the layers'; the backward pass all-reduces the gradients of
/// the parameters used on sequence shards.
static int64_t predictTensorBytes(const StepShape &shape, int64_t hidden,
                                  int64_t vocabulary, int64_t tensorRanks,
                                  bool sequenceParallel) {
  int64_t activation = shape.tokens * hidden * 4;
  int64_t forward = shape.forward, backward = shape.backward;
  int64_t scatters = forward * (2 * shape.layers + shape.embedding) +
                     backward * (2 * shape.layers + shape.outputLayer);
  int64_t gathers = forward * (2 * shape.layers + shape.outputLayer) +
                    backward * (2 * shape.layers + shape.embedding);
  int64_t bytes = scatters * activation;
  // Under sequence parallelism the backward pass gathers the inputs of the
  // column-parallel layers (QKV, the MLP's first, the output layer) again
  // for their weight gradients (mt-regather-in-backward).
  int64_t regathers = backward * (2 * shape.layers + shape.outputLayer);
  if (sequenceParallel)
    bytes += (gathers + regathers) * activation / tensorRanks +
             backward * shape.sequenceShardGradientBytes;
  if (shape.forward && shape.outputLayer)
    bytes += shape.hasLoss ? 3 * shape.tokens * 4
                           : shape.tokens * (vocabulary / tensorRanks) * 4;
  return bytes;
}

static const char kRegathers[] =
    "the all-gathers of [b, s/t, h] repeated in the backward pass for the "
    "column-parallel layers' weight gradients (2 per layer, 1 for the output "
    "layer)";

static const char kSequenceShardGradients[] =
    "the gradients of the parameters used on sequence shards (norms, "
    "row-parallel biases, position embeddings)";

/// The terms of predictTensorBytes for a whole step.
static void printStepTerms(const StepShape &shape, bool sequenceParallel,
                           llvm::raw_ostream &os) {
  bool training = shape.backward;
  os << ": " << (training ? 4 : 2)
     << (sequenceParallel ? " reduce-scatters of [b, s, h] and all-gathers "
                            "of [b, s/t, h] per layer, "
                          : " all-reduces of [b, s, h] per layer, ")
     << (training ? 2 : 1)
     << (training ? " for the vocabulary-parallel embedding and output layer"
                  : " for the vocabulary-parallel embedding")
     << (shape.hasLoss ? ", 3 of [b, s] for the cross-entropy"
                       : ", the all-gather of the [b, s, v/t] logits");
  if (sequenceParallel && training)
    os << ", " << kSequenceShardGradients << ", " << kRegathers;
}

/// The terms of predictTensorBytes for a pipeline stage function.
static void printStageTerms(const StepShape &shape, bool sequenceParallel,
                            llvm::raw_ostream &os) {
  os << " of stage " << *shape.stage << " (" << shape.layers
     << (shape.layers == 1 ? " layer" : " layers") << ", the micro-batch's "
     << shape.tokens << " tokens): ";
  SmallVector<std::string> terms;
  int64_t perLayer = 2 * (shape.forward + shape.backward);
  if (shape.layers)
    terms.push_back(std::to_string(perLayer) +
                    (sequenceParallel
                         ? " reduce-scatters of [b, s, h] and all-gathers of "
                           "[b, s/t, h] per layer"
                         : " all-reduces of [b, s, h] per layer"));
  if (shape.forward && shape.embedding)
    terms.push_back(sequenceParallel ? "the embedding's reduce-scatter"
                                     : "1 for the vocabulary-parallel "
                                       "embedding");
  if (shape.forward && shape.outputLayer) {
    if (sequenceParallel)
      terms.push_back("the all-gather before the output layer");
    terms.push_back(shape.hasLoss ? "3 of [b, s] for the cross-entropy"
                                  : "the all-gather of the [b, s, v/t] "
                                    "logits");
  }
  if (shape.backward && shape.outputLayer)
    terms.push_back(sequenceParallel
                        ? "the reduce-scatter of the output layer's input "
                          "gradient"
                        : "1 for the output layer's input gradient");
  if (shape.backward && shape.embedding && sequenceParallel)
    terms.push_back("the all-gather before the embedding's gradient");
  if (shape.backward && sequenceParallel) {
    terms.push_back(kSequenceShardGradients);
    if (shape.layers || shape.outputLayer)
      terms.push_back(kRegathers);
  }
  if (terms.empty())
    terms.push_back("nothing");
  llvm::interleave(terms, os, ", ");
}

void mt::printCollectives(ModuleOp module, llvm::raw_ostream &os) {
  auto grids = llvm::to_vector(module.getOps<shard::GridOp>());
  if (grids.empty()) {
    os << "no device grid: the module runs on one rank and has no "
          "collectives\n";
    return;
  }
  ArrayRef<int64_t> grid = grids.front().getShape();
  const int16_t kTensorAxis = tensorAxisOf(grid);
  // Expert parallelism over part of the data-parallel ranks: the second
  // axis is the expert-parallel one (mt-annotate-shardings marks it), and
  // with the first it makes the data-parallel ranks.
  const auto expertAttr =
      grids.front()->getAttrOfType<IntegerAttr>(kExpertAxisAttrName);
  const int16_t kExpertAxis =
      expertAttr ? static_cast<int16_t>(expertAttr.getInt()) : -1;
  const int16_t kContextAxis = kExpertAxis >= 0 ? -1 : contextAxisOf(grid);
  if (kExpertAxis >= 0)
    os << "grid " << grid[0] << " x " << grid[1] << " x " << grid[2]
       << " (expert-data x expert x tensor)";
  else if (kContextAxis >= 0)
    os << "grid " << grid[0] << " x " << grid[1] << " x " << grid[2]
       << " (data x context x tensor)";
  else
    os << "grid " << grid[0] << " x " << (grid.size() > 1 ? grid[1] : 1)
       << " (data x tensor)";
  os << "; bytes per rank and per call of each step\n";

  // Megatron-LM's prediction needs the decoder's shape, which the parameter
  // declarations give; each function's layers and tokens are its own.
  int64_t hidden = 0, vocabulary = 0;
  for (auto parameter : module.getOps<ParameterOp>()) {
    StringRef name = parameter.getSymName();
    if (name == "transformer.wte.weight" || name == "model.embed_tokens.weight")
      vocabulary = parameter.getTensorType().getDimSize(0);
    if (isLayerNorm(name))
      hidden = parameter.getTensorType().getDimSize(0);
  }

  // mt-plan-gradient-reduction moves the data-parallel gradient reduction
  // out of the step into functions run once per iteration.
  // Under pipeline parallelism each pipeline rank has its own
  // (reduce_gradients_pp<r>).
  int64_t buffers = 0;
  llvm::StringMap<int64_t> gradientBytesOf;
  for (auto function : module.getOps<func::FuncOp>()) {
    buffers += function->hasAttr("mt.gradient_buffer");
    for (unsigned i = 0; i < function.getNumResults(); ++i)
      if (auto parameter = function.getResultAttrOfType<FlatSymbolRefAttr>(
              i, "mt.gradient"))
        gradientBytesOf.try_emplace(
            parameter.getValue(),
            bytesOf(cast<RankedTensorType>(function.getResultTypes()[i])));
  }
  bool reducesOnce = buffers > 0;

  for (auto function : module.getOps<func::FuncOp>()) {
    if (function.isExternal())
      continue;
    os << "\n" << function.getSymName() << ":\n";
    int64_t tensorBytes = 0, dataBytes = 0, contextBytes = 0, index = 0,
            gradientBytes = 0, expertBytes = 0, expertCalls = 0,
            expertDataBytes = 0;
    for (unsigned i = 0; i < function.getNumResults(); ++i)
      if (function.getResultAttr(i, "mt.gradient"))
        gradientBytes +=
            bytesOf(cast<RankedTensorType>(function.getResultTypes()[i]));
    function.walk([&](Operation *op) {
      ArrayRef<int16_t> axes;
      StringRef kind = op->getName().stripDialect();
      llvm::TypeSwitch<Operation *>(op)
          .Case<shard::AllReduceOp, shard::AllGatherOp,
                shard::ReduceScatterOp, shard::AllSliceOp, shard::ShiftOp,
                shard::AllToAllOp>(
              [&](auto collective) { axes = collective.getGridAxes(); })
          .Default([&](Operation *) { kind = ""; });
      if (kind.empty() || kind == "all_slice")
        return;
      auto type = cast<RankedTensorType>(op->getOperand(0).getType());
      int64_t bytes = bytesOf(type);
      std::string axisNames;
      for (int16_t axis : axes)
        axisNames += (axisNames.empty() ? "" : "+") +
                     std::string(axis == kDataAxis      ? "data"
                                 : axis == kContextAxis ? "context"
                                 : axis == kExpertAxis  ? "expert"
                                                        : "tensor");
      os << llvm::format("  %3lld  %-14s %-12s %-18s %12lld\n",
                         static_cast<long long>(++index), kind.str().c_str(),
                         axisNames.c_str(), shapeOf(type).c_str(),
                         static_cast<long long>(bytes));
      // Expert parallelism's dispatch runs over the data axis (the
      // expert-parallel ranks are the data-parallel ones) but is no
      // gradient reduction: its own total.
      if (isa<shard::AllToAllOp>(op)) {
        expertBytes += bytes;
        ++expertCalls;
        return;
      }
      // With an expert axis, a reduction over the data axis alone is an
      // expert's gradient over its expert-data-parallel group (the
      // buffer and the losses span both axes).
      if (kExpertAxis >= 0 && axes.size() == 1 && axes[0] == kDataAxis) {
        expertDataBytes += bytes;
        return;
      }
      for (int16_t axis : axes)
        if (axis != kExpertAxis || !llvm::is_contained(axes, kDataAxis))
          (axis == kTensorAxis    ? tensorBytes
           : axis == kContextAxis ? contextBytes
                                  : dataBytes) += bytes;
    });
    if (expertCalls)
      os << "  expert-parallel: " << expertBytes << " bytes in "
         << expertCalls
         << " all_to_all (each grouped linear layer sends its rows to their "
            "experts' ranks and back, its routing ahead of them)\n";
    if (expertDataBytes)
      os << "  expert-data-parallel: " << expertDataBytes
         << " bytes (the experts' gradients, all-reduced over their "
            "expert-data-parallel group in each micro-batch's step)\n";
    // The ring's exchanges (shard.shift) and the gathers of keys and values
    // over the context axis: no Megatron-LM figure to set them against.
    if (kContextAxis >= 0)
      os << "  context-parallel: " << contextBytes
         << " bytes (the collectives over the context axis, the ring's "
            "shifts included)\n";
    int64_t tensorRanks =
        static_cast<int64_t>(grid.size()) > kTensorAxis ? grid[kTensorAxis] : 1;
    // --overlap-grad-reduce: a bucket of a buffer, reduced in the last
    // micro-batch; together the buckets move what the buffer's function
    // would, which they replace at run time.
    if (auto of = function->getAttrOfType<FlatSymbolRefAttr>("mt.bucket_of")) {
      os << "  data-parallel: " << dataBytes << " bytes (a gradient bucket of "
         << of.getValue()
         << ", reduced during the last micro-batch's backward pass; the "
            "buckets replace "
         << of.getValue() << "'s reduction)\n";
      continue;
    }
    if (function->hasAttr("mt.gradient_buffer") ||
        function->hasAttr("mt.parameter_buffer")) {
      // The buffer's group: the data axis, or with the context axis the
      // data x context ranks (mt-plan-gradient-reduction{context-axis}).
      SmallVector<int16_t> groupAxes;
      function.walk([&](Operation *op) {
        if (auto all = dyn_cast<shard::AllReduceOp>(op))
          groupAxes.assign(all.getGridAxes().begin(), all.getGridAxes().end());
        else if (auto scatter = dyn_cast<shard::ReduceScatterOp>(op))
          groupAxes.assign(scatter.getGridAxes().begin(),
                           scatter.getGridAxes().end());
        else if (auto gather = dyn_cast<shard::AllGatherOp>(op))
          groupAxes.assign(gather.getGridAxes().begin(),
                           gather.getGridAxes().end());
      });
      bool withContext =
          kContextAxis >= 0 && llvm::is_contained(groupAxes, kContextAxis);
      int64_t groupRanks = 1;
      for (int16_t axis : groupAxes)
        groupRanks *= grid[axis];
      printBufferPrediction(
          function, withContext || kExpertAxis >= 0 ? groupRanks : grid[0],
          withContext ? contextBytes : dataBytes,
          withContext ? "data x context-parallel" : "data-parallel",
          gradientBytesOf, os);
      continue;
    }
    StepShape shape = stepShape(module, function);
    bool training = gradientBytes > 0;
    bool sequenceParallel = false;
    function.walk([&](shard::ReduceScatterOp scatter) {
      sequenceParallel |= llvm::is_contained(scatter.getGridAxes(), kTensorAxis);
    });
    int64_t predictedTensor =
        tensorRanks > 1 ? predictTensorBytes(shape, hidden, vocabulary,
                                             tensorRanks, sequenceParallel)
                        : 0;
    os << "  tensor-parallel: " << tensorBytes
       << " bytes (Megatron-LM's analysis";
    if (shape.stage)
      printStageTerms(shape, sequenceParallel, os);
    else
      printStepTerms(shape, sequenceParallel, os);
    os << " = " << predictedTensor << ")\n";
    bool deferred = shape.stage ? stepOf(function) == "train_step" : training;
    if (deferred && reducesOnce) {
      std::string reduce = "reduce_gradients";
      if (auto stage =
              function->getAttrOfType<IntegerAttr>("mt.pipeline_stage"))
        reduce += "_pp" + std::to_string(stage.getInt() % buffers);
      os << "  data-parallel: " << dataBytes
         << " bytes (the loss; Megatron-LM reduces the gradients once per "
            "iteration, after the micro-batches: "
         << reduce << ")\n";
      continue;
    }
    int64_t predictedData = grid[0] > 1 && training ? gradientBytes : 0;
    os << "  data-parallel: " << dataBytes
       << " bytes (Megatron-LM's analysis: one all-reduce of the rank's "
          "gradients = "
       << predictedData << ", plus the loss)\n";
  }
}

namespace {
struct PrintCollectivesPass
    : public mt::impl::PrintCollectivesPassBase<PrintCollectivesPass> {
  void runOnOperation() override {
    printCollectives(getOperation(), llvm::outs());
    markAllAnalysesPreserved();
  }
};
} // namespace
