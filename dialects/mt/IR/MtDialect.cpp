//===- MtDialect.cpp - Registration of the mt dialect's ops and attributes ===//

#include "mt/IR/MtDialect.h"
#include "mt/IR/MtOps.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mlir::mt;

#include "mt/IR/MtDialect.cpp.inc"
#include "mt/IR/MtEnums.cpp.inc"

void MtDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "mt/IR/MtOps.cpp.inc"
      >();
}
