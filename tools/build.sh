#!/usr/bin/env bash
# Configures (once) and builds the compiler, the runtime and the tests into
# $BUILD_DIR (default: build/). Extra arguments go to cmake's first configure,
# e.g. tools/build.sh -DMTRT_ENABLE_CUDA=ON.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
ninja -C "$build" all mlir-doc
