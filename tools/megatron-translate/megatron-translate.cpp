//===- megatron-translate.cpp - Translations out of MLIR, like mlir-translate ===//

#include "megatron/Target/Bundle.h"

#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  megatron::registerBundleTranslation();
  return mlir::failed(mlir::mlirTranslateMain(
      argc, argv, "megatron-translate: the megatron compiler's translations\n"));
}
