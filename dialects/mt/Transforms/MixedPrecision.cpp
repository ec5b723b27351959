//===- MixedPrecision.cpp - Types the program in bf16 where it stores bf16 -===//
//
// The table of which operands and results each op's kernels read and write
// in bf16 is the CUDA kernels' (the runtime checks the bundle against the
// same table, cuda/Bf16Values.cpp). A value becomes bf16 when its writer
// and all its readers take bf16 and so does every value that must share its
// type; GEMMs then get explicit casts of the f32 operands that remain.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtCastOp.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/PrecisionPasses.h"

#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/EquivalenceClasses.h"
#include "llvm/ADT/StringSwitch.h"

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

/// Whether `op`'s kernel reads operand `index` in bf16.
bool readsBf16(Operation *op, unsigned index) {
  StringRef name = op->getName().stripDialect();
  if (isa_and_nonnull<shard::ShardDialect>(op->getDialect()))
    return isa<shard::AllGatherOp, shard::ReduceScatterOp, shard::AllSliceOp>(
               op) ||
           isSumAllReduce(op);
  if (!isa_and_nonnull<MtDialect>(op->getDialect()))
    return false;
  if (takesEitherType(name))
    return true;
  if (isa<AttentionOp, AttentionGradOp>(op))
    return flashAttention(op);
  return llvm::StringSwitch<bool>(name)
      // A and B; a bias stays f32.
      .Cases({"linear", "linear_gelu", "matmul", "linear_weight_grad",
              "linear_weight_bias_grad"},
             index <= 1)
      .Case("linear_gelu_grad", index <= 2) // dy, W, the pre-activation
      .Cases({"layer_norm", "rms_norm"}, index == 0) // the weights stay f32
      .Cases({"layer_norm_grad", "rms_norm_grad"}, index <= 1)
      .Case("cross_entropy", index == 0)      // the logits
      .Case("cross_entropy_grad", index == 1) // the logits; dloss stays f32
      .Case("embedding_grad", index == 0)     // dy; the table sums in f32
      .Cases({"bias_add", "vocab_max", "vocab_partials"}, index == 0)
      .Case("vocab_cross_entropy_grad", index == 1)
      .Default(false);
}

/// Whether `op`'s kernel writes result `index` in bf16.
bool writesBf16(Operation *op, unsigned index) {
  StringRef name = op->getName().stripDialect();
  if (isa_and_nonnull<shard::ShardDialect>(op->getDialect()))
    return readsBf16(op, 0);
  if (!isa_and_nonnull<MtDialect>(op->getDialect()))
    return false;
  if (takesEitherType(name))
    return true;
  if (isa<AttentionOp, AttentionGradOp>(op))
    return flashAttention(op);
  return llvm::StringSwitch<bool>(name)
      .Cases({"embedding", "fill", "cross_entropy_grad",
              "vocab_cross_entropy_grad", "bias_add", "layer_norm", "rms_norm",
              "linear", "linear_gelu"},
             true)
      // dx; the weight and bias gradients stay f32.
      .Cases({"layer_norm_grad", "rms_norm_grad", "linear_gelu_grad"},
             index == 0)
      .Default(false);
}

/// Whether `op` holds its operands and results to one element type, so
/// that they are typed together.
bool typesTogether(Operation *op) {
  if (isa_and_nonnull<shard::ShardDialect>(op->getDialect()))
    return true;
  return takesEitherType(op->getName().stripDialect());
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
  if (isa<LinearOp, LinearGeluOp, LinearGeluGradOp, MatmulOp,
          LinearWeightGradOp, LinearWeightBiasGradOp>(op))
    return {0, 1};
  return {};
}

struct MixedPrecisionPass
    : mt::impl::MixedPrecisionPassBase<MixedPrecisionPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto model = module->getAttrOfType<ModelAttr>("mt.model");
    if (!model || model.getPrecision() != "bf16")
      return;
    for (auto function : module.getOps<func::FuncOp>())
      if (!function.isExternal())
        typeFunction(function);
  }

  void typeFunction(func::FuncOp function) {
    Block &body = function.getBody().front();
    // Candidates: f32 results of the function's ops (a group's inner
    // values stay as they are).
    DenseMap<Value, bool> eligible;
    llvm::EquivalenceClasses<Value> groups;
    for (Operation &op : body) {
      for (OpResult result : op.getResults())
        if (isF32Tensor(result)) {
          eligible[result] = !isa<FusedOp, GetParameterOp>(op) &&
                             writesBf16(&op, result.getResultNumber());
          groups.insert(result);
        }
    }
    auto exclude = [&](Value value) {
      auto it = eligible.find(value);
      if (it != eligible.end())
        it->second = false;
    };
    auto tie = [&](ValueRange values) {
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
    };
    for (Operation &op : body) {
      for (OpOperand &operand : op.getOpOperands())
        if (isa<func::ReturnOp, FusedOp>(op) ||
            !readsBf16(&op, operand.getOperandNumber()))
          exclude(operand.get());
      if (!typesTogether(&op))
        continue;
      SmallVector<Value> members(op.getOperands().begin(),
                                 op.getOperands().end());
      llvm::append_range(members, op.getResults());
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
      if (auto gelu = dyn_cast<LinearGeluOp>(op))
        groups.unionSets(gelu->getResult(0), gelu->getResult(1));
      if (auto geluGrad = dyn_cast<LinearGeluGradOp>(op))
        if (eligible.count(geluGrad->getOperand(2)))
          groups.unionSets(geluGrad->getResult(0), geluGrad->getOperand(2));
    }
    DenseMap<Value, bool> groupEligible;
    for (auto [value, ok] : eligible) {
      Value leader = groups.getLeaderValue(value);
      auto [it, inserted] = groupEligible.try_emplace(leader, true);
      it->second = it->second && ok;
    }
    Type bf16 = BFloat16Type::get(function.getContext());
    for (Operation &op : body)
      for (OpResult result : op.getResults())
        if (eligible.lookup(result) &&
            groupEligible.lookup(groups.getLeaderValue(result))) {
          result.setType(withElementType(result.getType(), bf16));
          ++numBf16Values;
        }
    insertGemmCasts(function, bf16);
  }

  /// Casts each f32 GEMM operand to bf16: a parameter (a master weight)
  /// right before each GEMM that reads it, so that its bf16 copy lives
  /// only while that GEMM needs it; any other value once, before its first
  /// GEMM, for all of them.
  void insertGemmCasts(func::FuncOp function, Type bf16) {
    DenseMap<Value, Value> shared;
    OpBuilder builder(function.getContext());
    for (Operation &op : llvm::make_early_inc_range(function.getBody().front())) {
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
