// RUN: megatron-opt %s '-mt-plan-gradient-reduction=bucket-size=-1' -verify-diagnostics

// A negative bucket size is refused, naming the value and what fits.

// expected-error @+1 {{bucket-size=-1 is negative; give the least elements of a gradient bucket (Megatron-LM's --ddp-bucket-size), or 0 for one reduction of the whole buffer}}
module {
  shard.grid @grid(shape = 2x1)
  mt.parameter @a : tensor<4xf32> init = zeros
}
