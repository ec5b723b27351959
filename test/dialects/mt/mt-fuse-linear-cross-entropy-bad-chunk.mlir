// RUN: megatron-opt %s '-mt-fuse-linear-cross-entropy=chunk-rows=-1' -verify-diagnostics

// A chunk holds at least one token (0 derives it from chunk-bytes).
// expected-error @+1 {{mt-fuse-linear-cross-entropy: chunk-rows is -1 and chunk-bytes 1073741824; expected chunk-rows >= 0 (0: from chunk-bytes) and chunk-bytes >= 1}}
module {
}
