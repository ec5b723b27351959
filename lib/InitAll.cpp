//===- InitAll.cpp - The one place every tool registers what it uses ------===//

#include "megatron/InitAll.h"

#include "megatron/Pipelines/Pipelines.h"

#include "mt/IR/MtDialect.h"
#include "mt/Transforms/Passes.h"
#include "mt/Transforms/PrecisionPasses.h"
#include "mt/Transforms/ShardingInterfaceImpl.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/Func/Extensions/AllExtensions.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Func/Transforms/Passes.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/Linalg/Transforms/ShardingInterfaceImpl.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Transforms/Passes.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/Transforms/Passes.h"
#include "mlir/Dialect/Tensor/Extensions/AllExtensions.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Tensor/Transforms/Passes.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Transforms/Passes.h"

void megatron::registerAllDialects(mlir::DialectRegistry &registry) {
  registry.insert<mlir::mt::MtDialect, mlir::shard::ShardDialect,
                  mlir::func::FuncDialect, mlir::arith::ArithDialect,
                  mlir::tensor::TensorDialect, mlir::linalg::LinalgDialect,
                  mlir::scf::SCFDialect>();
  // Sharding propagation and partitioning reach through func and tensor ops,
  // linalg's named ops and mt's ops only through these external models.
  mlir::func::registerAllExtensions(registry);
  mlir::tensor::registerAllExtensions(registry);
  mlir::linalg::registerShardingInterfaceExternalModels(registry);
  mlir::mt::registerShardingInterfaceExternalModels(registry);
}

void megatron::registerAllPasses() {
  mlir::mt::registerMtPasses();
  mlir::mt::registerMtPrecisionPasses();
  mlir::shard::registerShardPasses();
  mlir::func::registerFuncPasses();
  mlir::arith::registerArithPasses();
  mlir::tensor::registerTensorPasses();
  mlir::registerLinalgPasses();
  mlir::registerSCFPasses();
  mlir::registerTransformsPasses();
  megatron::registerPipelines();
}
