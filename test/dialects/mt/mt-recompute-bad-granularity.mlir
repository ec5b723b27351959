// RUN: megatron-opt %s -mt-recompute=granularity=everything -verify-diagnostics

// Granularities are Megatron-LM's: none, selective, full.
// expected-error @+1 {{mt-recompute: granularity 'everything' is not none, selective or full}}
module {
}
