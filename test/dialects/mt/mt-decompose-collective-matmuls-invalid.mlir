// RUN: megatron-opt %s -verify-diagnostics -mt-decompose-collective-matmuls=chunks=1

// Fewer than two chunks leave nothing to pipeline: an error naming the
// value and the fix.
// expected-error@below {{mt-decompose-collective-matmuls: chunks 1 leaves nothing to pipeline; give 2 or more}}
module {
}
