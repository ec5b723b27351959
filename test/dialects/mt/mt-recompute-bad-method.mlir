// RUN: megatron-opt %s '-mt-recompute=granularity=full method=diagonal' -verify-diagnostics

// Methods are Megatron-LM's: uniform, block.
// expected-error @+1 {{mt-recompute: method 'diagonal' is not uniform or block}}
module {
}
