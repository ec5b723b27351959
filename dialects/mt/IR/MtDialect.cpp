//===- MtDialect.cpp - Registration of the mt dialect's ops and attributes ===//

#include "mt/IR/MtDialect.h"
#include "mt/IR/MtCastOp.h"
#include "mt/IR/MtFp8Ops.h"
#include "mt/IR/MtOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Interfaces/FunctionInterfaces.h"

#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::mt;

#include "mt/IR/MtDialect.cpp.inc"
#include "mt/IR/MtEnums.cpp.inc"
#define GET_ATTRDEF_CLASSES
#include "mt/IR/MtAttrDefs.cpp.inc"
#define GET_TYPEDEF_CLASSES
#include "mt/IR/MtTypes.cpp.inc"

void MtDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "mt/IR/MtOps.cpp.inc"
      >();
  addOperations<CastOp>();
  addOperations<
#define GET_OP_LIST
#include "mt/IR/MtFp8Ops.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "mt/IR/MtTypes.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "mt/IR/MtAttrDefs.cpp.inc"
      >();
}

// The same limits the runtime's manifest reader holds a model section to
// (BundleManifest.cpp), so a module that verifies never makes a bundle the
// runtime refuses.
LogicalResult ModelAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                StringRef name, int64_t numLayers,
                                int64_t hiddenSize, int64_t numAttentionHeads,
                                int64_t numQueryGroups, int64_t ffnHiddenSize,
                                int64_t seqLength, int64_t vocabSize,
                                int64_t paddedVocabSize, int64_t microBatchSize,
                                int64_t globalBatchSize,
                                int64_t tensorModelParallelSize,
                                int64_t pipelineModelParallelSize,
                                int64_t dataParallelSize, StringRef precision) {
  if (name.empty())
    return emitError() << "#mt.model: name is empty; give the model's name";
  if (numLayers < 0)
    return emitError() << "#mt.model: num_layers is " << numLayers
                       << "; expected 0 or more";
  std::pair<StringRef, int64_t> positive[] = {
      {"hidden_size", hiddenSize},
      {"num_attention_heads", numAttentionHeads},
      {"num_query_groups", numQueryGroups},
      {"ffn_hidden_size", ffnHiddenSize},
      {"seq_length", seqLength},
      {"vocab_size", vocabSize},
      {"padded_vocab_size", paddedVocabSize},
      {"micro_batch_size", microBatchSize},
      {"global_batch_size", globalBatchSize},
      {"tensor_model_parallel_size", tensorModelParallelSize},
      {"pipeline_model_parallel_size", pipelineModelParallelSize},
      {"data_parallel_size", dataParallelSize}};
  for (auto [field, value] : positive)
    if (value < 1)
      return emitError() << "#mt.model: " << field << " is " << value
                         << "; expected 1 or more";
  if (paddedVocabSize < vocabSize)
    return emitError() << "#mt.model: padded_vocab_size is " << paddedVocabSize
                       << "; expected at least vocab_size (" << vocabSize
                       << ")";
  if (globalBatchSize % (microBatchSize * dataParallelSize) != 0)
    return emitError() << "#mt.model: global_batch_size is " << globalBatchSize
                       << "; expected a multiple of micro_batch_size * "
                          "data_parallel_size ("
                       << microBatchSize << " * " << dataParallelSize << ")";
  if (precision != "fp32" && precision != "bf16" && precision != "fp16")
    return emitError() << "#mt.model: precision is \"" << precision
                       << "\"; expected \"fp32\", \"bf16\" or \"fp16\"";
  return success();
}

LogicalResult LayerAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                int64_t index, bool coreAttention) {
  if (index < 0)
    return emitError() << "#mt.layer: the layer is " << index
                       << "; expected 0 or more";
  return success();
}

// `<i>` or `<i, core_attention>`.
LogicalResult
Fp8RecipeAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                      StringRef format, StringRef scaling,
                      int64_t amaxHistoryLen, StringRef amaxComputeAlgo,
                      int64_t margin, int64_t bf16LayersAtStart,
                      int64_t bf16LayersAtEnd) {
  if (format != "e4m3" && format != "hybrid")
    return emitError() << "#mt.fp8_recipe: format is \"" << format
                       << "\"; expected \"e4m3\" or \"hybrid\"";
  if (scaling != "delayed" && scaling != "tensorwise")
    return emitError() << "#mt.fp8_recipe: scaling is \"" << scaling
                       << "\"; expected \"delayed\" or \"tensorwise\"";
  if (amaxHistoryLen < 1)
    return emitError() << "#mt.fp8_recipe: amax_history_len is "
                       << amaxHistoryLen << "; expected 1 or more";
  if (amaxComputeAlgo != "max" && amaxComputeAlgo != "most_recent")
    return emitError() << "#mt.fp8_recipe: amax_compute_algo is \""
                       << amaxComputeAlgo
                       << "\"; expected \"max\" or \"most_recent\"";
  if (margin < 0 || margin > 64)
    return emitError() << "#mt.fp8_recipe: margin is " << margin
                       << "; expected 0 to 64";
  if (bf16LayersAtStart < 0 || bf16LayersAtEnd < 0)
    return emitError() << "#mt.fp8_recipe: bf16 layers at the start and end "
                          "are "
                       << bf16LayersAtStart << " and " << bf16LayersAtEnd
                       << "; expected 0 or more";
  return success();
}

Attribute LayerAttr::parse(AsmParser &parser, Type) {
  int64_t index = 0;
  bool coreAttention = false;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseLess() || parser.parseInteger(index))
    return {};
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseKeyword("core_attention"))
      return {};
    coreAttention = true;
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<LayerAttr>(loc, parser.getContext(), index,
                                      coreAttention);
}

void LayerAttr::print(AsmPrinter &printer) const {
  printer << "<" << getIndex();
  if (getCoreAttention())
    printer << ", core_attention";
  printer << ">";
}

/// mt.layer: a #mt.layer on an op of a function body, below the module's
/// num_layers.
static LogicalResult verifyLayerAttribute(Operation *op, Attribute value) {
  auto layer = dyn_cast<LayerAttr>(value);
  if (!layer)
    return op->emitError() << "'" << kLayerAttrName
                           << "' must be a #mt.layer<...> attribute, not "
                           << value;
  if (isa<ModuleOp>(op) || isa<FunctionOpInterface>(op))
    return op->emitError() << "'" << kLayerAttrName
                           << "' belongs on the ops of a layer, not on '"
                           << op->getName() << "'";
  auto module = op->getParentOfType<ModuleOp>();
  auto model = module ? module->getAttrOfType<ModelAttr>(kModelAttrName)
                      : ModelAttr();
  if (model && layer.getIndex() >= model.getNumLayers())
    return op->emitError() << "'" << kLayerAttrName << "' names layer "
                           << layer.getIndex() << ", but the module's "
                           << kModelAttrName << " has num_layers "
                           << model.getNumLayers() << " (layers 0 to "
                           << model.getNumLayers() - 1 << ")";
  return success();
}

LogicalResult MtDialect::verifyOperationAttribute(Operation *op,
                                                  NamedAttribute attribute) {
  // The passes' own discardable attributes (mt.gradient, mt.recomputed,
  // mt.pipeline_stage, ...) are checked where they are read.
  if (attribute.getName() == kLayerAttrName)
    return verifyLayerAttribute(op, attribute.getValue());
  if (attribute.getName() == kFp8AttrName) {
    if (!isa<ModuleOp>(op))
      return op->emitError() << "'" << kFp8AttrName
                             << "' belongs on the builtin module, not on '"
                             << op->getName() << "'";
    if (!isa<Fp8RecipeAttr>(attribute.getValue()))
      return op->emitError() << "'" << kFp8AttrName
                             << "' must be a #mt.fp8_recipe<...> attribute, "
                                "not "
                             << attribute.getValue();
    return success();
  }
  if (attribute.getName() != kModelAttrName)
    return success();
  if (!isa<ModuleOp>(op))
    return op->emitError() << "'" << kModelAttrName
                           << "' belongs on the builtin module, not on '"
                           << op->getName() << "'";
  if (!isa<ModelAttr>(attribute.getValue()))
    return op->emitError() << "'" << kModelAttrName
                           << "' must be a #mt.model<...> attribute, not "
                           << attribute.getValue();
  return success();
}

// A layer is a property of the ops that compute it: an argument or result of
// a function is a value, and the ops around it say which layer it feeds.
static LogicalResult verifyNoLayer(Operation *op, NamedAttribute attribute,
                                   StringRef what, unsigned index) {
  if (attribute.getName() != kLayerAttrName)
    return success();
  return op->emitError() << "'" << kLayerAttrName << "' belongs on ops, not on "
                         << what << " " << index << " of '" << op->getName()
                         << "'";
}

LogicalResult MtDialect::verifyRegionArgAttribute(Operation *op, unsigned,
                                                  unsigned argIndex,
                                                  NamedAttribute attribute) {
  return verifyNoLayer(op, attribute, "argument", argIndex);
}

LogicalResult MtDialect::verifyRegionResultAttribute(Operation *op, unsigned,
                                                     unsigned resultIndex,
                                                     NamedAttribute attribute) {
  return verifyNoLayer(op, attribute, "result", resultIndex);
}
