//===- ShardingInterfaceImpl.h - How mt ops are sharded ---------*- C++ -*-===//

#ifndef MT_TRANSFORMS_SHARDINGINTERFACEIMPL_H
#define MT_TRANSFORMS_SHARDINGINTERFACEIMPL_H

namespace mlir {
class DialectRegistry;

namespace mt {

/// Attaches upstream shard's ShardingInterface to the mt ops, so that
/// sharding-propagation and shard-partition see through them: elementwise ops
/// shard like their operands, linear and matmul like matrix products (a
/// sharded contraction becomes a local product and a shard.all_reduce), norms
/// along every dimension but the normalized one, attention along batch and
/// heads.
void registerShardingInterfaceExternalModels(DialectRegistry &registry);

} // namespace mt
} // namespace mlir

#endif // MT_TRANSFORMS_SHARDINGINTERFACEIMPL_H
