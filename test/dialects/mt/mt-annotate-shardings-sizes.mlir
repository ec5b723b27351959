// RUN: megatron-opt %s -verify-diagnostics '-mt-annotate-shardings=tensor-parallel-size=0'

// Grid sizes must be positive.

// expected-error @below {{mt-annotate-shardings: tensor-parallel-size (0), data-parallel-size (1) and context-parallel-size (1) must be positive}}
module {
}
