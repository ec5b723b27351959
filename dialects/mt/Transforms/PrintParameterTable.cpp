//===- PrintParameterTable.cpp - The model's parameter table --------------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::mt {
#define GEN_PASS_DEF_PRINTPARAMETERTABLEPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

/// Megatron-LM decays every parameter but biases and rank-1 tensors.
static bool isWeightDecayed(ParameterOp parameter) {
  return parameter.getTensorType().getRank() > 1 &&
         !parameter.getSymName().ends_with(".bias");
}

static std::string formatInit(ParameterOp parameter) {
  std::string init = stringifyInitMethod(parameter.getInit()).str();
  if (FloatAttr std = parameter.getStdAttr())
    init +=
        llvm::formatv("(std={0})", llvm::format("%g", std.getValueAsDouble()))
            .str();
  // An expert bias: moved by its update rate, not trained.
  if (FloatAttr rate = parameter.getExpertBiasUpdateRateAttr())
    init += llvm::formatv(", expert bias (rate {0})",
                          llvm::format("%g", rate.getValueAsDouble()))
                .str();
  return init;
}

static std::string formatShape(RankedTensorType type) {
  std::string shape;
  llvm::raw_string_ostream os(shape);
  llvm::interleave(type.getShape(), os, "x");
  return shape.empty() ? "scalar" : shape;
}

void mt::printParameterTable(ModuleOp module, llvm::raw_ostream &os) {
  struct Row {
    std::string name, shape, dtype, count, init, decay;
  };
  std::vector<Row> rows = {{"name", "shape", "dtype", "count", "init", "decay"}};
  int64_t total = 0;
  for (ParameterOp parameter : module.getOps<ParameterOp>()) {
    RankedTensorType type = parameter.getTensorType();
    std::string dtype;
    llvm::raw_string_ostream(dtype) << type.getElementType();
    rows.push_back({parameter.getSymName().str(), formatShape(type), dtype,
                    std::to_string(type.getNumElements()),
                    formatInit(parameter),
                    isWeightDecayed(parameter) ? "yes" : "no"});
    total += type.getNumElements();
  }
  size_t widths[5] = {};
  for (const Row &row : rows) {
    const std::string *cells[] = {&row.name, &row.shape, &row.dtype, &row.count,
                                  &row.init};
    for (auto [width, cell] : llvm::zip(widths, cells))
      width = std::max(width, cell->size());
  }
  for (const Row &row : rows)
    os << llvm::left_justify(row.name, widths[0]) << "  "
       << llvm::left_justify(row.shape, widths[1]) << "  "
       << llvm::left_justify(row.dtype, widths[2]) << "  "
       << llvm::right_justify(row.count, widths[3]) << "  "
       << llvm::left_justify(row.init, widths[4]) << "  " << row.decay << "\n";
  os << "total: " << rows.size() - 1 << " parameters, " << total
     << " elements (" << llvm::format("%.2f", total / 1e6) << "M)\n";
}

namespace {
struct PrintParameterTablePass
    : public mt::impl::PrintParameterTablePassBase<PrintParameterTablePass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    for (ParameterOp parameter : module.getOps<ParameterOp>()) {
      ++numParameters;
      numElements += parameter.getTensorType().getNumElements();
    }
    printParameterTable(module, llvm::outs());
    markAllAnalysesPreserved();
  }
};
} // namespace
