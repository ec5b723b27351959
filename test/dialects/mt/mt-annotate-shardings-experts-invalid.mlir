// RUN: megatron-opt %s -verify-diagnostics '-mt-annotate-shardings=data-parallel-size=4 expert-parallel-size=3'

// The expert-parallel ranks are data-parallel ranks: their count divides
// the data-parallel size (mt-annotate-shardings-experts.mlir has the
// layouts that do).

// expected-error @+1 {{mt-annotate-shardings: expert-parallel-size 3 must divide data-parallel-size 4, without context parallelism (issue 25)}}
module {
  func.func @train_step(%tokens: tensor<4x16xi32>) {
    return
  }
}
