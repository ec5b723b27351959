//===- MtDialect.h - The mt dialect, its enums and attributes ---*- C++ -*-===//

#ifndef MT_IR_MTDIALECT_H
#define MT_IR_MTDIALECT_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"

#include "mt/IR/MtDialect.h.inc"
#include "mt/IR/MtEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "mt/IR/MtAttrDefs.h.inc"

namespace mlir::mt {
/// The module attribute that says what a module trains (ModelAttr).
inline constexpr llvm::StringLiteral kModelAttrName = "mt.model";
/// The module attribute that says how a module trains in FP8
/// (Fp8RecipeAttr); absent without FP8.
inline constexpr llvm::StringLiteral kFp8AttrName = "mt.fp8";
/// A unit module attribute (--moe-router-dtype fp32): mt-mixed-precision
/// keeps the MoE router's GEMMs in f32 under bf16.
inline constexpr llvm::StringLiteral kMoeRouterF32AttrName =
    "mt.moe_router_f32";
/// On the module once mt-fuse-elementwise ran: the bundle has generated
/// kernels, so mt-fuse-column-sums may make groups (a unit attribute).
inline constexpr llvm::StringLiteral kElementwiseKernelsAttrName =
    "mt.elementwise_kernels";
/// The op attribute that says which transformer layer an op belongs to
/// (LayerAttr).
inline constexpr llvm::StringLiteral kLayerAttrName = "mt.layer";

/// The layer `op` belongs to, if it has one.
inline LayerAttr getLayer(Operation *op) {
  return op->getAttrOfType<LayerAttr>(kLayerAttrName);
}

/// Gives `op` the layer `layer` (none: leaves it untagged). Ops without
/// operands (constants, parameter reads) belong to no layer: CSE may share
/// them between layers.
inline void setLayer(Operation *op, LayerAttr layer) {
  if (layer && op->getNumOperands() > 0 && !op->hasAttr(kLayerAttrName))
    op->setAttr(kLayerAttrName, layer);
}

/// While alive, gives every op inserted through `builder` the layer `layer`
/// (ops made out of a tagged op carry its tag; see setLayer).
class LayerScope : public OpBuilder::Listener {
public:
  LayerScope(OpBuilder &builder, LayerAttr layer)
      : builder(builder), layer(layer), previous(builder.getListener()) {
    builder.setListener(this);
  }
  ~LayerScope() override { builder.setListener(previous); }
  void notifyOperationInserted(Operation *op,
                               OpBuilder::InsertPoint from) override {
    setLayer(op, layer);
    if (previous)
      previous->notifyOperationInserted(op, from);
  }

private:
  OpBuilder &builder;
  LayerAttr layer;
  OpBuilder::Listener *previous;
};
} // namespace mlir::mt

#endif // MT_IR_MTDIALECT_H
