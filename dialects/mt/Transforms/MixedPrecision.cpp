//===- MixedPrecision.cpp - Types the program in bf16 where it stores bf16 -===//
//
// The table of which operands and results each op's kernels read and write
// in bf16 is the CUDA kernels' (the runtime checks the bundle against the
// same table, cuda/Bf16Values.cpp). A value becomes bf16 when its writer
// and all its readers take bf16 and so does every value that must share its
// type; GEMMs then get explicit casts of the f32 operands that remain.
// The values a pipeline stage sends or stashes are typed across the stage's
// functions: both sides of a boundary hold one type, bf16 where the sender
// writes bf16 and every reader reads it.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtCastOp.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"
#include "mt/Transforms/PrecisionPasses.h"

#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/EquivalenceClasses.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringSwitch.h"

#include <map>
#include <optional>

namespace mlir::mt {
#define GEN_PASS_DEF_MIXEDPRECISIONPASS
#include "mt/Transforms/PrecisionPasses.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

/// Ops whose kernels read and write every operand and result in either
/// type, which the verifier holds to one type (elementwise ops, byte copies).
bool takesEitherType(StringRef name) {
  return llvm::StringSwitch<bool>(name)
      .Cases({"reshape", "split", "concat", "transpose", "add", "mul"}, true)
      .Cases({"dropout", "gelu", "gelu_grad", "silu", "silu_grad"}, true)
      .Cases({"swiglu", "swiglu_grad", "softmax", "softmax_grad", "rope"}, true)
      .Default(false);
}

/// Whether the flash-attention kernels, which read and write bf16, take this
/// attention (query [batch, positions, heads, head dim]); the exact kernels
/// that do not are f32. The limits are FlashAttention.cu's.
bool flashAttention(Operation *op) {
  auto attention = dyn_cast<AttentionOp>(op);
  auto grad = dyn_cast<AttentionGradOp>(op);
  if (!attention && !grad)
    return false;
  RankedTensorType q = attention ? attention.getQuery().getType()
                                 : grad.getQuery().getType();
  RankedTensorType k = attention ? attention.getKey().getType()
                                 : grad.getKey().getType();
  RankedTensorType v = attention ? attention.getValue().getType()
                                 : grad.getValue().getType();
  bool causal = attention ? attention.getCausal() : grad.getCausal();
  if (q.getRank() != 4 || k.getRank() != 4 || v.getRank() != 4)
    return false;
  int64_t headDim = q.getDimSize(3);
  if (headDim != v.getDimSize(3) ||
      !llvm::is_contained({16, 32, 64, 128}, headDim))
    return false;
  if (causal && q.getDimSize(1) != k.getDimSize(1))
    return false;
  int64_t limit = 65535;
  return q.getDimSize(0) <= limit && q.getDimSize(2) <= limit &&
         q.getDimSize(1) < (int64_t(1) << 30);
}

bool isSumAllReduce(Operation *op) {
  auto all = dyn_cast<shard::AllReduceOp>(op);
  return all && all.getReduction() != shard::ReductionKind::Max;
}

/// What every operand and result of `op` takes, where the op decides it as
/// a whole: collectives move bf16 where their reduction is exact enough
/// (all_to_all only moves bytes: expert parallelism's rows, as Megatron-LM's
/// dispatcher sends them),
/// ops of other dialects take f32, elementwise ops either type, attention
/// what the flash kernels take. None for ops that decide per operand.
std::optional<bool> wholeOpTakesBf16(Operation *op) {
  // The generated kernels load and store each operand and result in
  // either type (the launch's type mask); the group holds one type.
  if (isa<FusedOp>(op))
    return true;
  if (isa_and_nonnull<shard::ShardDialect>(op->getDialect()))
    return isa<shard::AllGatherOp, shard::ReduceScatterOp, shard::AllSliceOp,
               shard::AllToAllOp>(op) ||
           isSumAllReduce(op);
  if (!isa_and_nonnull<MtDialect>(op->getDialect()))
    return false;
  if (takesEitherType(op->getName().stripDialect()))
    return true;
  if (isa<AttentionOp, AttentionGradOp>(op))
    return flashAttention(op);
  return std::nullopt;
}

/// Whether `op`'s kernel reads operand `index` in bf16.
bool readsBf16(Operation *op, unsigned index) {
  if (std::optional<bool> whole = wholeOpTakesBf16(op))
    return *whole;
  return llvm::StringSwitch<bool>(op->getName().stripDialect())
      // A and B; a bias stays f32.
      .Cases({"linear", "linear_gelu", "matmul", "linear_weight_grad",
              "linear_weight_bias_grad"},
             index <= 1)
      .Case("linear_gelu_grad", index <= 2) // dy, W, the pre-activation
      .Case("linear_add", index <= 2)       // A, B and C; a bias stays f32
      .Cases({"layer_norm", "rms_norm"}, index == 0) // the weights stay f32
      .Cases({"layer_norm_grad", "rms_norm_grad"}, index <= 1)
      .Case("cross_entropy", index == 0)      // the logits
      .Case("cross_entropy_grad", index == 1) // the logits; dloss stays f32
      .Case("embedding_grad", index == 0)     // dy; the table sums in f32
      .Cases({"bias_add", "bias_grad", "vocab_max", "vocab_partials"},
             index == 0) // bias_grad sums dy in f32
      .Case("vocab_cross_entropy_grad", index == 1)
      // x and W, as the unfused output layer's GEMMs; the labels are ids.
      .Cases({"linear_cross_entropy", "linear_vocab_max",
              "linear_vocab_partials", "linear_vocab_cross_entropy_grad"},
             index <= 1)
      .Case("scale", index == 0) // the factor (a seed) stays f32
      // The experts' rows and weights; the routing weights stay f32 (the
      // router's type), the indices are ids.
      .Cases({"moe_permute", "moe_unpermute", "moe_dispatch_rows",
              "moe_combine_rows"},
             index == 0)
      .Cases({"moe_grouped_linear", "moe_grouped_linear_weight_grad",
              "moe_probs_grad"},
             index <= 1)
      .Default(false);
}

/// Whether `op`'s kernel writes result `index` in bf16.
bool writesBf16(Operation *op, unsigned index) {
  if (std::optional<bool> whole = wholeOpTakesBf16(op))
    return *whole;
  return llvm::StringSwitch<bool>(op->getName().stripDialect())
      .Cases({"embedding", "fill", "cross_entropy_grad",
              "vocab_cross_entropy_grad", "bias_add", "layer_norm", "rms_norm",
              "linear", "linear_gelu", "linear_add"},
             true)
      // dx; the weight and bias gradients stay f32.
      .Cases({"layer_norm_grad", "rms_norm_grad", "linear_gelu_grad"},
             index == 0)
      // dx, as the unfused data-gradient GEMM; the loss and the weight
      // gradient (summed over the chunks) stay f32.
      .Case("linear_cross_entropy", index == 1)
      // dx; the weight gradient stays f32.
      .Case("linear_vocab_cross_entropy_grad", index == 0)
      .Case("scale", true) // Elementwise.cu's scale: either type
      // The permuted rows, expert parallelism's blocks of them and the
      // experts' outputs; the weight gradient stays f32.
      .Cases({"moe_permute", "moe_unpermute", "moe_grouped_linear",
              "moe_dispatch_rows", "moe_combine_rows"},
             true)
      .Default(false);
}

/// Whether `op` holds its operands and results to one element type, so
/// that they are typed together.
bool typesTogether(Operation *op) {
  if (isa<FusedOp>(op) || isa_and_nonnull<shard::ShardDialect>(op->getDialect()))
    return true;
  return takesEitherType(op->getName().stripDialect());
}

/// The block arguments and op results inside an mt.fused group.
SmallVector<Value> groupInnerValues(Operation *op) {
  SmallVector<Value> values;
  auto group = dyn_cast<FusedOp>(op);
  if (!group)
    return values;
  Block &body = group.getBody().front();
  llvm::append_range(values, body.getArguments());
  for (Operation &inner : body.without_terminator())
    llvm::append_range(values, inner.getResults());
  return values;
}

bool isF32Tensor(Value value) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  return type && type.getElementType().isF32();
}

RankedTensorType withElementType(Type type, Type element) {
  auto tensor = cast<RankedTensorType>(type);
  return RankedTensorType::get(tensor.getShape(), element);
}

/// The operands of a GEMM that the tensor cores read in bf16.
SmallVector<unsigned, 2> gemmOperands(Operation *op) {
  if (isa<MoeGroupedLinearOp, MoeGroupedLinearWeightGradOp>(op))
    return {0, 1};
  if (isa<LinearOp, LinearGeluOp, LinearGeluGradOp, LinearAddOp, MatmulOp,
          LinearWeightGradOp, LinearWeightBiasGradOp, LinearCrossEntropyOp,
          LinearVocabMaxOp, LinearVocabPartialsOp,
          LinearVocabCrossEntropyGradOp>(op))
    return {0, 1};
  return {};
}

/// The pipeline's function boundaries that carry a value from one function
/// to another: a return operand and the block argument that receives it.
/// These hold one type on both sides, as Megatron-LM sends and stashes
/// activations in the training precision.
struct BoundaryLink {
  OpOperand *returned;
  BlockArgument received;
};

/// The links between pipeline stage functions (mt.pipeline_stage):
///   - forward k's stash (its results after the output and the reported
///     losses) to backward k's leading arguments;
///   - forward k's output to forward k+1's activation (its first argument);
///   - backward k+1's input gradient to backward k's seed (the argument
///     after the stash);
///   - eval k's output to eval k+1's activation, and predict k's to
///     predict k+1's.
/// `sameType` gets the pairs that hold one type without a link: forward k's
/// output and backward k's seed (its gradient), which the runtime checks.
SmallVector<BoundaryLink>
pipelineLinks(ModuleOp module,
              SmallVectorImpl<std::pair<Value, Value>> &sameType) {
  std::map<int64_t, func::FuncOp> forwards, backwards, evals, predicts;
  for (auto function : module.getOps<func::FuncOp>()) {
    auto stage = function->getAttrOfType<IntegerAttr>("mt.pipeline_stage");
    if (!stage || function.isExternal())
      continue;
    StringRef name = function.getSymName();
    auto &byStage = name.ends_with("_forward")         ? forwards
                    : name.ends_with("_backward")      ? backwards
                    : name.starts_with("predict_step") ? predicts
                                                       : evals;
    byStage[stage.getInt()] = function;
  }
  auto returnOf = [](func::FuncOp function) {
    return cast<func::ReturnOp>(function.getBody().front().getTerminator());
  };
  SmallVector<BoundaryLink> links;
  auto link = [&](func::FuncOp from, unsigned result, func::FuncOp to,
                  unsigned argument) {
    func::ReturnOp ret = returnOf(from);
    if (result < ret.getNumOperands() && argument < to.getNumArguments())
      links.push_back({&ret->getOpOperand(result), to.getArgument(argument)});
  };
  auto next = [](const std::map<int64_t, func::FuncOp> &byStage, int64_t k) {
    auto found = byStage.find(k + 1);
    return found == byStage.end() ? func::FuncOp() : found->second;
  };
  for (auto [k, forward] : forwards) {
    auto backward = backwards.find(k);
    if (backward == backwards.end())
      continue;
    // The stash follows the output and a stage's reported MoE losses (f32
    // losses, not stash).
    unsigned leading = 1 + reportedLossResults(forward).size();
    unsigned stash = forward.getNumResults() - leading;
    for (unsigned i = 0; i < stash; ++i)
      link(forward, i + leading, backward->second, i);
    func::FuncOp following = next(forwards, k);
    func::FuncOp followingBackward = next(backwards, k);
    if (following && followingBackward) {
      link(forward, 0, following, 0);
      link(followingBackward, 0, backward->second, stash);
      if (stash < backward->second.getNumArguments())
        sameType.push_back({returnOf(forward).getOperand(0),
                            backward->second.getArgument(stash)});
    }
  }
  for (const auto *forwardOnly : {&evals, &predicts})
    for (auto [k, function] : *forwardOnly)
      if (func::FuncOp following = next(*forwardOnly, k))
        link(function, 0, following, 0);
  return links;
}

/// The parameter a GEMM operand is, or null.
StringAttr parameterName(Value value) {
  auto parameter = value.getDefiningOp<GetParameterOp>();
  return parameter ? parameter.getNameAttr().getAttr() : StringAttr();
}

/// The MoE routers' weights: the parameters whose mt.linear makes logits
/// that an mt.moe_route reads, in any function of `module`.
llvm::SmallDenseSet<StringAttr> routerWeights(ModuleOp module) {
  llvm::SmallDenseSet<StringAttr> weights;
  module.walk([&](MoeRouteOp route) {
    if (auto logits = route.getLogits().getDefiningOp<LinearOp>())
      if (StringAttr name = parameterName(logits.getWeight()))
        weights.insert(name);
  });
  return weights;
}

/// The router's GEMMs in `function` (--moe-router-dtype fp32): each
/// mt.linear or mt.linear_add that reads a router weight (the logits, which
/// an mt.moe_route reads, or their input gradient: the logits' gradient
/// times the weight, plus the other gradients of the layer's input), and
/// each mt.linear_weight_grad of the logits' gradient that an input
/// gradient reads (the weight's gradient).
llvm::SmallPtrSet<Operation *, 8>
routerGemms(func::FuncOp function,
            const llvm::SmallDenseSet<StringAttr> &weights) {
  llvm::SmallPtrSet<Operation *, 8> gemms;
  llvm::SmallPtrSet<Value, 8> logitGradients;
  function.walk([&](Operation *op) {
    if (!isa<LinearOp, LinearAddOp>(op))
      return;
    StringAttr name = parameterName(op->getOperand(1));
    if (!name || !weights.contains(name))
      return;
    gemms.insert(op);
    bool logits =
        llvm::any_of(op->getResult(0).getUsers(),
                     [](Operation *user) { return isa<MoeRouteOp>(user); });
    if (!logits)
      logitGradients.insert(op->getOperand(0));
  });
  function.walk([&](LinearWeightGradOp grad) {
    if (logitGradients.contains(grad.getOutputGrad()))
      gemms.insert(grad);
  });
  return gemms;
}

struct MixedPrecisionPass
    : mt::impl::MixedPrecisionPassBase<MixedPrecisionPass> {
  /// Whether each f32 value may become bf16 on its own account; a value
  /// becomes bf16 when every member of its group may. Set afresh by each
  /// run.
  DenseMap<Value, bool> eligible;
  llvm::EquivalenceClasses<Value> groups;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto model = module->getAttrOfType<ModelAttr>("mt.model");
    if (!model || model.getPrecision() != "bf16")
      return;
    // A pass instance may run again, on another module.
    eligible.clear();
    groups = llvm::EquivalenceClasses<Value>();
    SmallVector<func::FuncOp> functions;
    for (auto function : module.getOps<func::FuncOp>())
      if (!function.isExternal())
        functions.push_back(function);
    SmallVector<std::pair<Value, Value>> sameType;
    SmallVector<BoundaryLink> links = pipelineLinks(module, sameType);
    // A linked argument takes what its sender writes; its readers decide
    // like any value's.
    llvm::SmallPtrSet<OpOperand *, 16> linkedReturns;
    for (BoundaryLink link : links) {
      linkedReturns.insert(link.returned);
      if (isF32Tensor(link.received)) {
        eligible[link.received] = true;
        groups.insert(link.received);
      }
    }
    for (func::FuncOp function : functions)
      collectFunction(function, linkedReturns);
    for (BoundaryLink link : links)
      if (isF32Tensor(link.received))
        tie({link.returned->get(), link.received});
    for (auto [first, second] : sameType)
      tie({first, second});
    Type bf16 = BFloat16Type::get(&getContext());
    applyTypes(functions, bf16);
    llvm::SmallDenseSet<StringAttr> routers;
    if (module->hasAttr(kMoeRouterF32AttrName))
      routers = routerWeights(module);
    for (func::FuncOp function : functions) {
      llvm::SmallPtrSet<Operation *, 8> f32Gemms =
          routerGemms(function, routers);
      keepGemmsF32(f32Gemms);
      insertGemmCasts(function, bf16, f32Gemms);
    }
  }

  /// Runs `gemms` in f32 (the router's, --moe-router-dtype fp32), on
  /// values typed as if they were not: a bf16 operand (an input, or the
  /// addend of the input gradient's mt.linear_add) is widened right before
  /// the GEMM (its f32 copy lives only while the GEMM needs it), and a bf16
  /// result is written f32 and rounded for its readers, as Megatron-LM's
  /// router rounds its input's gradient to the input's type.
  void keepGemmsF32(const llvm::SmallPtrSetImpl<Operation *> &gemms) {
    Type f32 = Float32Type::get(&getContext());
    for (Operation *op : gemms) {
      OpBuilder builder(op);
      for (unsigned index = 0; index < op->getNumOperands(); ++index) {
        Value operand = op->getOperand(index);
        auto type = dyn_cast<RankedTensorType>(operand.getType());
        if (!type || !type.getElementType().isBF16())
          continue;
        op->setOperand(index,
                       CastOp::create(builder, op->getLoc(),
                                      withElementType(operand.getType(), f32),
                                      operand));
        ++numCasts;
      }
      builder.setInsertionPointAfter(op);
      for (OpResult result : op->getResults()) {
        if (isF32Tensor(result))
          continue;
        Type rounded = result.getType();
        result.setType(withElementType(rounded, f32));
        auto cast = CastOp::create(builder, op->getLoc(), rounded, result);
        result.replaceAllUsesExcept(cast, cast);
        ++numCasts;
      }
    }
  }

  void exclude(Value value) {
    auto it = eligible.find(value);
    if (it != eligible.end())
      it->second = false;
  }

  /// Holds `values` (the float tensors among them) to one type.
  void tie(ValueRange values) {
    Value first;
    for (Value value : values) {
      auto type = dyn_cast<RankedTensorType>(value.getType());
      if (!type || !isa<FloatType>(type.getElementType()))
        continue;
      if (!eligible.count(value)) {
        groups.insert(value);
        eligible[value] = false;
      }
      if (!first)
        first = value;
      groups.unionSets(first, value);
    }
  }

  void collectFunction(func::FuncOp function,
                       const llvm::SmallPtrSetImpl<OpOperand *> &linkedReturns) {
    Block &body = function.getBody().front();
    // Candidates: f32 results of the function's ops (a group's inner
    // values stay as they are).
    for (Operation &op : body) {
      for (OpResult result : op.getResults())
        if (isF32Tensor(result)) {
          eligible[result] = !isa<GetParameterOp>(op) &&
                             writesBf16(&op, result.getResultNumber());
          groups.insert(result);
        }
    }
    for (Operation &op : body) {
      for (OpOperand &operand : op.getOpOperands()) {
        if (isa<func::ReturnOp>(op) && linkedReturns.contains(&operand))
          continue;
        if (isa<func::ReturnOp>(op) ||
            !readsBf16(&op, operand.getOperandNumber()))
          exclude(operand.get());
      }
      if (!typesTogether(&op))
        continue;
      SmallVector<Value> members(op.getOperands().begin(),
                                 op.getOperands().end());
      llvm::append_range(members, op.getResults());
      // A group's inner values have its type (its verifier): each rounds
      // where the unfused op would, on the host and in the kernel.
      for (Value inner : groupInnerValues(&op)) {
        eligible[inner] = true;
        groups.insert(inner);
        members.push_back(inner);
      }
      tie(members);
    }
    // Cross-op type ties the verifiers hold: cuBLASLt's GeLU auxiliary
    // matrix has the result's type.
    for (Operation &op : body) {
      // The flash kernels take one input type and one output type; bias_add
      // writes its input's type.
      if (isa<AttentionOp, AttentionGradOp>(op)) {
        tie(op.getOperands());
        tie(op.getResults());
      }
      if (auto biasAdd = dyn_cast<BiasAddOp>(op))
        tie({biasAdd.getInput(), biasAdd.getResult()});
      // cuBLASLt's C has D's type.
      if (auto linearAdd = dyn_cast<LinearAddOp>(op))
        tie({linearAdd.getAddend(), linearAdd.getResult()});
      // A fused loss's gradient and its scaled value (the seed stays f32):
      // dx scaled in bf16, the weight gradient in f32.
      if (auto scale = dyn_cast<ScaleOp>(op))
        tie({scale.getInput(), scale.getResult()});
      if (auto gelu = dyn_cast<LinearGeluOp>(op))
        groups.unionSets(gelu->getResult(0), gelu->getResult(1));
      if (auto geluGrad = dyn_cast<LinearGeluGradOp>(op))
        if (eligible.count(geluGrad->getOperand(2)))
          groups.unionSets(geluGrad->getResult(0), geluGrad->getOperand(2));
    }
  }

  /// Retypes each value whose whole group may be bf16, and the functions
  /// whose arguments or results changed.
  void applyTypes(ArrayRef<func::FuncOp> functions, Type bf16) {
    DenseMap<Value, bool> groupEligible;
    for (auto [value, ok] : eligible) {
      Value leader = groups.getLeaderValue(value);
      auto [it, inserted] = groupEligible.try_emplace(leader, true);
      it->second = it->second && ok;
    }
    auto retype = [&](Value value) {
      if (!eligible.lookup(value) ||
          !groupEligible.lookup(groups.getLeaderValue(value)))
        return;
      value.setType(withElementType(value.getType(), bf16));
      ++numBf16Values;
    };
    for (func::FuncOp function : functions) {
      Block &body = function.getBody().front();
      for (BlockArgument argument : body.getArguments())
        retype(argument);
      for (Operation &op : body) {
        for (OpResult result : op.getResults())
          retype(result);
        for (Value inner : groupInnerValues(&op))
          retype(inner);
      }
      function.setType(FunctionType::get(
          function.getContext(), body.getArgumentTypes(),
          body.getTerminator()->getOperandTypes()));
    }
  }

  /// Casts each f32 GEMM operand to bf16 (but `f32Gemms`'): a parameter (a
  /// master weight) right before each GEMM that reads it, so that its bf16 copy
  /// lives only while that GEMM needs it; any other value once, before its
  /// first GEMM, for all of them.
  void insertGemmCasts(func::FuncOp function, Type bf16,
                       const llvm::SmallPtrSetImpl<Operation *> &f32Gemms) {
    DenseMap<Value, Value> shared;
    OpBuilder builder(function.getContext());
    for (Operation &op : llvm::make_early_inc_range(function.getBody().front())) {
      if (f32Gemms.contains(&op))
        continue;
      DenseMap<Value, Value> local;
      for (unsigned index : gemmOperands(&op)) {
        Value operand = op.getOperand(index);
        if (!isF32Tensor(operand))
          continue;
        bool perUse = isa<BlockArgument>(operand) ||
                      isa<GetParameterOp>(operand.getDefiningOp());
        DenseMap<Value, Value> &casts = perUse ? local : shared;
        Value &cast = casts[operand];
        if (!cast) {
          builder.setInsertionPoint(&op);
          cast = CastOp::create(builder, op.getLoc(),
                                withElementType(operand.getType(), bf16),
                                operand);
          ++numCasts;
        }
        op.setOperand(index, cast);
      }
    }
  }
};

} // namespace
