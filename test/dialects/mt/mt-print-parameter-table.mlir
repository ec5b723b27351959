// RUN: megatron-opt %s -mt-print-parameter-table -o /dev/null | FileCheck %s
// RUN: megatron-opt %s -mt-print-parameter-table | FileCheck %s --check-prefix=IR

// The table lists each parameter in declaration order with its global shape,
// element count, init and Megatron-LM's weight-decay rule (no decay for
// biases and rank-1 tensors), then the totals.

// CHECK:      name                    shape   dtype  count  init               decay
// CHECK-NEXT: transformer.wte.weight  64x16   f32     1024  normal(std=0.02)   yes
// CHECK-NEXT: transformer.h.0.attn.c_attn.bias  48      f32       48  zeros              no
// CHECK-NEXT: transformer.ln_f.weight 16      bf16      16  ones               no
// CHECK-NEXT: total: 3 parameters, 1088 elements (0.00M)

mt.parameter @transformer.wte.weight : tensor<64x16xf32> init = normal std = 2.000000e-02
mt.parameter @transformer.h.0.attn.c_attn.bias : tensor<48xf32> init = zeros
mt.parameter @transformer.ln_f.weight : tensor<16xbf16> init = ones

// The pass prints and changes nothing.
// IR: mt.parameter @transformer.wte.weight
// IR: mt.parameter @transformer.h.0.attn.c_attn.bias
// IR: mt.parameter @transformer.ln_f.weight
