// RUN: megatron-opt %s -verify-diagnostics '-mt-annotate-shardings=data-parallel-size=4 expert-parallel-size=2'

// Expert-parallel groups smaller than the data-parallel group (an
// expert-data-parallel group of several ranks) are not implemented yet.

// expected-error @+1 {{mt-annotate-shardings: expert-parallel-size 2 must equal data-parallel-size 4 without context parallelism (an expert-data-parallel group of one rank); other layouts are not implemented yet (issue 25)}}
module {
  func.func @train_step(%tokens: tensor<4x16xi32>) {
    return
  }
}
