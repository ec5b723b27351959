//===- MtLayerLocations.h - Which transformer layer an op belongs to -*- C++ -*-===//
//
// The front end gives every op of a transformer layer the location
// `"layers.<i>"`, and the ops of Megatron-LM's core attention (the attention
// op and the reshape of its output) `"layers.<i>.core_attention"`.
// Recomputation (mt-recompute) and the memory report find layers through
// these names; locations do not change what an op computes, so CSE and the
// printers ignore them.
//
//===----------------------------------------------------------------------===//

#ifndef MT_IR_MTLAYERLOCATIONS_H
#define MT_IR_MTLAYERLOCATIONS_H

#include "mlir/IR/Location.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/Twine.h"

#include <optional>

namespace mlir::mt {

/// The layer an op belongs to, and whether it is part of the core attention.
struct LayerTag {
  int64_t layer = 0;
  bool coreAttention = false;
};

inline Location getLayerLoc(MLIRContext *context, int64_t layer,
                            bool coreAttention) {
  return NameLoc::get(StringAttr::get(
      context, llvm::Twine("layers.") + llvm::Twine(layer) +
                   (coreAttention ? ".core_attention" : "")));
}

/// The tag of `loc`: a `layers.<i>[.core_attention]` name, possibly inside a
/// fused location (CSE fuses the locations of the ops it merges; the first
/// tag found wins).
inline std::optional<LayerTag> getLayerTag(Location loc) {
  if (auto name = dyn_cast<NameLoc>(loc)) {
    llvm::StringRef text = name.getName().getValue();
    if (text.consume_front("layers.")) {
      auto [number, rest] = text.split('.');
      LayerTag tag;
      if (!llvm::to_integer(number, tag.layer, 10) || tag.layer < 0)
        return std::nullopt;
      if (!rest.empty() && rest != "core_attention")
        return std::nullopt;
      tag.coreAttention = rest == "core_attention";
      return tag;
    }
    return getLayerTag(name.getChildLoc());
  }
  if (auto fused = dyn_cast<FusedLoc>(loc))
    for (Location inner : fused.getLocations())
      if (std::optional<LayerTag> tag = getLayerTag(inner))
        return tag;
  return std::nullopt;
}

} // namespace mlir::mt

#endif // MT_IR_MTLAYERLOCATIONS_H
