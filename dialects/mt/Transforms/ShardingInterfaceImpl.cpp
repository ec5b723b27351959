//===- ShardingInterfaceImpl.cpp - How mt ops are sharded -----------------===//
//
// The models themselves are in ForwardShardingModels.cpp,
// BackwardShardingModels.cpp and MoeShardingModels.cpp (docs/Parallelism.md has the table).
//
//===----------------------------------------------------------------------===//

#include "mt/Transforms/ShardingInterfaceImpl.h"

#include "ShardingModelSupport.h"

#include "mlir/IR/DialectRegistry.h"

using namespace mlir;
using namespace mlir::mt;

void mt::registerShardingInterfaceExternalModels(DialectRegistry &registry) {
  registry.addExtension(+[](MLIRContext *context, MtDialect *) {
    sharding::attachForwardShardingModels(context);
    sharding::attachBackwardShardingModels(context);
    sharding::attachMoeShardingModels(context);
  });
}
