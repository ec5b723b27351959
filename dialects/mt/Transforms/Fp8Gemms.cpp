//===- Fp8Gemms.cpp - The transformer layers' GEMMs in FP8 ----------------===//
//
// With `mt.fp8` on the module (`--fp8-format`), the linear layers of the
// transformer layers run on FP8 operands (docs/MixedPrecision.md, "FP8"):
// each GEMM operand is quantized once (mt.fp8_quantize) with a scale that is
// a value of the program: delayed scaling reads it from the operand's
// mt.fp8_meta (mt.fp8_scale) and a training step records every amax at its
// end (mt.fp8_update, after a max all-reduce over the grid); tensorwise
// scaling computes it from the operand itself (mt.fp8_current_scale). The
// output layer, the loss, attention, norms and GEMMs fused with epilogues
// stay as mt-mixed-precision typed them.
//
// A pipeline stage's forward and backward functions are one training step
// cut in two: the forward updates the metas it casts with (activations,
// weights) at its end, the backward those of the output gradients, and the
// backward casts a stashed activation, a recomputed one and a weight with
// the scales its forward used, which the forward stashes beside its
// activations. Each meta thus sees the updates, and each cast the scale, of
// the same micro-batches in the same order as in one train_step.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtCastOp.h"
#include "mt/IR/MtFp8Ops.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"
#include "mt/Transforms/PrecisionPasses.h"

#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"

#include <map>

namespace mlir::mt {
#define GEN_PASS_DEF_FP8GEMMSPASS
#include "mt/Transforms/PrecisionPasses.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

/// A GEMM operand in FP8: its codes and the scale they were made with.
struct Quantized {
  Value codes;
  Value scale;
};

bool isBf16Tensor(Value value) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  return type && type.getElementType().isBF16();
}

/// The parameter a GEMM's weight operand reads: a function argument marked
/// `mt.parameter`, or an mt.get_parameter, possibly through mt.cast.
/// Empty for any other weight.
StringRef parameterName(Value weight) {
  if (auto cast = weight.getDefiningOp<CastOp>())
    weight = cast.getInput();
  if (auto read = weight.getDefiningOp<GetParameterOp>())
    return read.getName();
  auto argument = dyn_cast<BlockArgument>(weight);
  if (!argument)
    return "";
  auto function = dyn_cast<func::FuncOp>(argument.getOwner()->getParentOp());
  if (!function)
    return "";
  auto name = function.getArgAttrOfType<FlatSymbolRefAttr>(
      argument.getArgNumber(), "mt.parameter");
  return name ? name.getValue() : "";
}

/// The f32 master weight behind a bf16 cast, which is quantized instead of
/// its bf16 copy (one rounding).
Value masterWeight(Value weight) {
  if (auto cast = weight.getDefiningOp<CastOp>())
    return cast.getInput();
  return weight;
}

struct Fp8GemmsPass : mt::impl::Fp8GemmsPassBase<Fp8GemmsPass> {
  Fp8RecipeAttr recipe;
  ModelAttr model;
  ModuleOp module;
  /// The module's metas by name, in creation order.
  llvm::StringMap<Fp8MetaOp> metas;

  void runOnOperation() override {
    module = getOperation();
    recipe = module->getAttrOfType<Fp8RecipeAttr>(kFp8AttrName);
    if (!recipe)
      return;
    model = module->getAttrOfType<ModelAttr>(kModelAttrName);
    if (!model || model.getPrecision() != "bf16") {
      module.emitError() << "'" << kFp8AttrName
                         << "' needs a module of precision bf16 (FP8 GEMMs "
                            "inside bf16 training); this one is "
                         << (model ? model.getPrecision() : "without mt.model");
      return signalPassFailure();
    }
    metas.clear();
    for (auto meta : module.getOps<Fp8MetaOp>())
      metas[meta.getSymName()] = meta;
    // A stage's backward after its forward, whose scales it reads.
    std::map<int64_t, func::FuncOp> forwards, backwards;
    for (auto function : llvm::to_vector(module.getOps<func::FuncOp>())) {
      if (function.isExternal())
        continue;
      auto stage = function->getAttrOfType<IntegerAttr>("mt.pipeline_stage");
      StringRef name = function.getSymName();
      if (stage && name.ends_with("_forward")) {
        forwards[stage.getInt()] = function;
        continue;
      }
      if (stage && name.ends_with("_backward")) {
        backwards[stage.getInt()] = function;
        continue;
      }
      if (failed(rewriteFunction(function, /*training=*/name == "train_step")))
        return signalPassFailure();
    }
    for (auto [stage, forward] : forwards) {
      auto found = backwards.find(stage);
      func::FuncOp backward =
          found == backwards.end() ? func::FuncOp() : found->second;
      if (!backward) {
        forward.emitError() << "pipeline stage " << stage
                            << " has a forward function but no backward";
        return signalPassFailure();
      }
      // The backward's seed, the argument after its stash (parameters may
      // follow it).
      unsigned stash = forward.getNumResults() - 1;
      if (stash >= backward.getNumArguments()) {
        backward.emitError()
            << "takes " << backward.getNumArguments()
            << " arguments, but its forward stashes " << stash
            << " values, which with its seed need " << stash + 1;
        return signalPassFailure();
      }
      StageScales scales{
          forward, backward, backward.getArgument(stash), {}, {}};
      if (failed(rewriteFunction(forward, /*training=*/true, &scales)) ||
          failed(rewriteFunction(backward, /*training=*/true, &scales)))
        return signalPassFailure();
    }
  }

  /// A pipeline stage's pair of functions while they are rewritten: the
  /// scale of each meta its forward cast with, and the backward's argument
  /// that receives it (made when the backward first needs it).
  struct StageScales {
    func::FuncOp forward, backward;
    BlockArgument seed;
    llvm::StringMap<Value> forwardScales;
    llvm::StringMap<Value> stashed;
  };

  /// The backward's argument holding the scale its forward cast meta
  /// `name` with: a new result of the forward after its stash and a new
  /// argument of the backward after its stash (before its seed), so that
  /// the runtime stashes it with the micro-batch's activations. (The value
  /// is the scale as the forward read it, before the forward's fp8_update
  /// of the meta.)
  FailureOr<Value> stashedScale(StageScales &stage, StringRef name) {
    Value &argument = stage.stashed[name];
    if (argument)
      return argument;
    Value scale = stage.forwardScales.lookup(name);
    if (!scale)
      return stage.backward.emitError()
             << "the FP8 meta '" << name
             << "' is cast with in this backward function but not in its "
                "forward, so no scale of the micro-batch's forward pass is "
                "stashed for it";
    MLIRContext *context = &getContext();
    auto stash = DictionaryAttr::get(
        context, {NamedAttribute(StringAttr::get(context, "mt.name"),
                                 StringAttr::get(context, "stash"))});
    auto ret =
        cast<func::ReturnOp>(stage.forward.getBody().front().getTerminator());
    if (failed(stage.forward.insertResult(stage.forward.getNumResults(),
                                          scale.getType(), stash)))
      return failure();
    ret->insertOperands(ret->getNumOperands(), scale);
    unsigned at = stage.seed.getArgNumber();
    if (failed(stage.backward.insertArgument(at, scale.getType(), stash,
                                             stage.backward.getLoc())))
      return failure();
    argument = stage.backward.getArgument(at);
    return argument;
  }

  bool delayed() const { return recipe.getScaling() == "delayed"; }

  Type e4m3() { return Float8E4M3FNType::get(&getContext()); }
  Type e5m2() { return Float8E5M2Type::get(&getContext()); }

  /// Whether `op` belongs to a transformer layer whose GEMMs run in FP8.
  bool inFp8Layer(Operation *op) {
    LayerAttr layer = getLayer(op);
    if (!layer)
      return false;
    int64_t index = layer.getIndex();
    return index >= recipe.getBf16LayersAtStart() &&
           index < model.getNumLayers() - recipe.getBf16LayersAtEnd();
  }

  Fp8MetaOp metaFor(StringRef name, Type format) {
    Fp8MetaOp &meta = metas[name];
    if (!meta) {
      OpBuilder builder(module.getBodyRegion());
      Block *body = module.getBody();
      // After the parameters, in creation order.
      builder.setInsertionPoint(body, body->begin());
      for (Operation &op : *body)
        if (isa<ParameterOp, Fp8MetaOp>(op))
          builder.setInsertionPointAfter(&op);
      meta = Fp8MetaOp::create(builder, module.getLoc(),
                               builder.getStringAttr(name),
                               TypeAttr::get(format));
      ++numMetas;
    }
    return meta;
  }

  /// Quantizes `value` to `format` before `user`, with the meta `name`'s
  /// scale (delayed) or its own amax's (tensorwise), or with `given` (a
  /// stashed scale, which records nothing). The amax is recorded in
  /// `amaxes` for the step's updates when `record`.
  Quantized quantize(OpBuilder &builder, Operation *user, Value value,
                     StringRef name, Type format, bool record,
                     llvm::MapVector<Fp8MetaOp, Value> &amaxes,
                     Value given = nullptr) {
    builder.setInsertionPoint(user);
    Location loc = user->getLoc();
    auto scalar = RankedTensorType::get({}, builder.getF32Type());
    Value scale = given;
    Fp8MetaOp meta;
    if (!given && delayed()) {
      meta = metaFor(name, format);
      scale = Fp8ScaleOp::create(builder, loc, scalar, meta.getSymName());
    } else if (!given) {
      scale = Fp8CurrentScaleOp::create(builder, loc, scalar, value,
                                        TypeAttr::get(format),
                                        builder.getI64IntegerAttr(
                                            recipe.getMargin()));
    }
    auto codes = RankedTensorType::get(
        cast<RankedTensorType>(value.getType()).getShape(), format);
    auto q = Fp8QuantizeOp::create(builder, loc, codes, scalar, value, scale);
    ++numQuantizes;
    if (meta && record && !amaxes.count(meta))
      amaxes[meta] = q.getAmax();
    return {q.getResult(), scale};
  }

  /// Rewrites `function`'s GEMMs; a training step (`training`) records its
  /// amaxes and updates its metas at its end. `stage`: the function is a
  /// pipeline stage's forward or backward (its forward first).
  LogicalResult rewriteFunction(func::FuncOp function, bool training,
                                StageScales *stage = nullptr) {
    Block &body = function.getBody().front();
    bool backward = stage && function == stage->backward;
    // Values derived from the loss seed are gradients: a linear reading one
    // is a data gradient (dx = dy W^T), whose dy is E5M2 under hybrid. A
    // stage's backward starts from its seed.
    DenseSet<Value> gradients;
    if (backward)
      gradients.insert(stage->seed);
    for (Operation &op : body) {
      bool derived = op.hasAttr(kLossSeedAttrName) ||
                     llvm::any_of(op.getOperands(), [&](Value v) {
                       return gradients.contains(v);
                     });
      if (derived)
        gradients.insert(op.result_begin(), op.result_end());
    }
    OpBuilder builder(function.getContext());
    llvm::MapVector<Fp8MetaOp, Value> amaxes;
    DenseMap<Value, Quantized> activations, weights;
    bool hybrid = recipe.getFormat() == "hybrid";
    // The parameter of each output gradient a data gradient cast.
    DenseMap<Value, StringRef> parameterOfGradient;
    // A cast with the meta `name`. In a stage's backward the metas of
    // activations and weights (`forwardMeta`) take the scale the forward
    // cast with, and their amaxes are the forward's to record.
    auto castFp8 = [&](Operation *user, Value value, std::string name,
                       Type format, bool forwardMeta) -> FailureOr<Quantized> {
      Value given;
      if (backward && forwardMeta && delayed()) {
        FailureOr<Value> scale = stashedScale(*stage, name);
        if (failed(scale))
          return failure();
        given = *scale;
      }
      Quantized q = quantize(builder, user, value, name, format, training,
                             amaxes, given);
      if (stage && !backward && delayed())
        stage->forwardScales.try_emplace(name, q.scale);
      return q;
    };

    // The linears first (forward and data gradient), so that each weight
    // gradient finds both of its operands quantized.
    for (Operation &op : llvm::make_early_inc_range(body)) {
      auto linear = dyn_cast<LinearOp>(op);
      if (!linear || !inFp8Layer(&op) || !isBf16Tensor(linear.getInput()) ||
          !isBf16Tensor(linear.getWeight()) || !isBf16Tensor(linear))
        continue;
      StringRef parameter = parameterName(linear.getWeight());
      if (parameter.empty())
        continue;
      bool dataGrad = gradients.contains(linear.getInput());
      Value input = linear.getInput();
      if (dataGrad)
        parameterOfGradient[input] = parameter;
      if (!activations.count(input)) {
        FailureOr<Quantized> x = castFp8(
            &op, input,
            (parameter + (dataGrad ? ".fp8_output_grad" : ".fp8_input")).str(),
            dataGrad && hybrid ? e5m2() : e4m3(), !dataGrad);
        if (failed(x))
          return failure();
        activations[input] = *x;
      }
      Quantized x = activations[input];
      Value master = masterWeight(linear.getWeight());
      if (!weights.count(master)) {
        FailureOr<Quantized> w =
            castFp8(&op, master, (parameter + ".fp8_weight").str(), e4m3(),
                    /*forwardMeta=*/true);
        if (failed(w))
          return failure();
        weights[master] = *w;
      }
      Quantized w = weights[master];
      builder.setInsertionPoint(&op);
      auto fp8 = Fp8LinearOp::create(builder, op.getLoc(), linear.getType(),
                                     x.codes, x.scale, w.codes, w.scale,
                                     linear.getBias(),
                                     linear.getTransposeWeightAttr());
      setLayer(fp8, getLayer(&op));
      Value cast = linear.getWeight();
      linear.replaceAllUsesWith(fp8.getResult());
      op.erase();
      if (auto castOp = cast.getDefiningOp<CastOp>(); castOp && castOp->use_empty())
        castOp->erase();
      ++numGemms;
    }
    for (Operation &op : llvm::make_early_inc_range(body)) {
      auto plain = dyn_cast<LinearWeightGradOp>(op);
      auto withBias = dyn_cast<LinearWeightBiasGradOp>(op);
      if ((!plain && !withBias) || !inFp8Layer(&op))
        continue;
      // A stage's backward casts a stashed activation itself, with the
      // forward's scale.
      Value input = op.getOperand(0);
      auto stashed = dyn_cast<BlockArgument>(input);
      StringRef parameter = parameterOfGradient.lookup(op.getOperand(1));
      if (backward && stashed && stashed.getOwner() == &body &&
          stashed.getArgNumber() < stage->seed.getArgNumber() &&
          !activations.count(input) && !parameter.empty() &&
          isBf16Tensor(input)) {
        FailureOr<Quantized> cast =
            castFp8(&op, input, (parameter + ".fp8_input").str(), e4m3(),
                    /*forwardMeta=*/true);
        if (failed(cast))
          return failure();
        activations[input] = *cast;
      }
      auto x = activations.find(input);
      auto dy = activations.find(op.getOperand(1));
      if (x == activations.end() || dy == activations.end())
        continue;
      builder.setInsertionPoint(&op);
      auto weightGrad = RankedTensorType::get(
          cast<RankedTensorType>(op.getResult(0).getType()).getShape(),
          builder.getF32Type());
      bool transpose = plain ? plain.getTransposeWeight()
                             : withBias.getTransposeWeight();
      auto fp8 = Fp8LinearWeightGradOp::create(
          builder, op.getLoc(), weightGrad, x->second.codes, x->second.scale,
          dy->second.codes, dy->second.scale, transpose);
      setLayer(fp8, getLayer(&op));
      op.getResult(0).replaceAllUsesWith(fp8.getResult());
      if (withBias) {
        // The bias gradient sums dy in f32, as the unfused op's epilogue.
        auto biasGrad = BiasGradOp::create(builder, op.getLoc(),
                                           withBias.getResult(1).getType(),
                                           op.getOperand(1));
        setLayer(biasGrad, getLayer(&op));
        withBias.getResult(1).replaceAllUsesWith(biasGrad.getResult());
      }
      op.erase();
      ++numGemms;
    }
    if (training && !amaxes.empty())
      recordAmaxes(function, amaxes);
    return success();
  }

  /// At the end of a training step: every amax, reduced (max) over the grid
  /// in one all-reduce when there is one, updates its meta.
  void recordAmaxes(func::FuncOp function,
                    llvm::MapVector<Fp8MetaOp, Value> &amaxes) {
    Operation *ret = function.getBody().front().getTerminator();
    OpBuilder builder(ret);
    Location loc = ret->getLoc();
    SmallVector<Value> values;
    for (auto &entry : amaxes)
      values.push_back(entry.second);
    shard::GridOp grid;
    for (auto candidate : module.getOps<shard::GridOp>())
      grid = candidate;
    int64_t ranks = 1;
    if (grid)
      for (int64_t size : grid.getShape())
        ranks *= size;
    if (ranks > 1) {
      auto one = RankedTensorType::get({1}, builder.getF32Type());
      SmallVector<Value> rows;
      for (Value amax : values)
        rows.push_back(ReshapeOp::create(builder, loc, one, amax));
      auto all = RankedTensorType::get({int64_t(rows.size())},
                                       builder.getF32Type());
      Value joined = rows.size() == 1
                         ? rows.front()
                         : ConcatOp::create(builder, loc, all, rows, 0)
                               .getResult();
      SmallVector<shard::GridAxis> axes;
      for (int64_t axis = 0; axis < grid.getRank(); ++axis)
        if (grid.getShape()[axis] > 1)
          axes.push_back(static_cast<shard::GridAxis>(axis));
      Value reduced = shard::AllReduceOp::create(builder, loc, joined,
                                                 grid.getSymName(), axes,
                                                 shard::ReductionKind::Max);
      SmallVector<Value> parts;
      if (rows.size() == 1) {
        parts.push_back(reduced);
      } else {
        SmallVector<Type> partTypes(rows.size(), one);
        llvm::append_range(
            parts, SplitOp::create(builder, loc, partTypes, reduced, 0)
                       .getResults());
      }
      auto scalar = RankedTensorType::get({}, builder.getF32Type());
      for (auto [value, part] : llvm::zip(values, parts))
        value = ReshapeOp::create(builder, loc, scalar, part);
    }
    for (auto [entry, amax] : llvm::zip(amaxes, values))
      Fp8UpdateOp::create(builder, loc, entry.first.getSymName(), amax);
  }
};

} // namespace
