//===- megatron-opt.cpp - Runs and inspects the compiler's passes, like mlir-opt ===//

#include "megatron/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  megatron::registerAllPasses();
  mlir::DialectRegistry registry;
  megatron::registerAllDialects(registry);
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "megatron-opt: the megatron compiler's pass driver\n",
      registry));
}
