#!/usr/bin/env bash
# Runs megatron-train and examples/torch_feed.py on one GPU from a carried
# runtime build, and compares their losses (same bundle, corpus, seed and
# schedule). Builds nothing but the Python module (one file) when the
# carried one was made for another Python than the device's.
#
# Usage (from the repository root on the GPU machine):
#   examples/run-on-device.sh CARRY [ITERS] [OUT]
# CARRY holds: bin/megatron-train, lib/libmtrt.so (a -DMTRT_ENABLE_CUDA=ON
# runtime build), tiny-gpt.mtb (megatron-compile models/tiny-gpt.yaml),
# include/dlpack/dlpack.h (Debian's libdlpack-dev), optionally python/
# (the module) and bin/mtrt-cuda-tests (then its C API tests run first). runtime/README.md ("Running the PyTorch example on a GPU
# machine") says how to make it.
set -euo pipefail
carry=$(cd "${1:?usage: run-on-device.sh CARRY [ITERS] [OUT]}" && pwd)
iters=${2:-50}
out=${3:-${OUT:-$carry/out}}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0

python=${PYTHON:-python3}
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
module_dir="$carry/python"
if [[ ! -f "$module_dir/mtrt$suffix" ]]; then
  module_dir="$out/python"
  mkdir -p "$module_dir"
  echo "run-on-device: building the Python module for $("$python" -V) ($suffix)"
  include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  if [[ ! -f "$include/Python.h" ]]; then
    echo "run-on-device: $include/Python.h is missing: this Python has no" \
      "development headers, so the module cannot be built here" >&2
    exit 1
  fi
  "$python" -m pybind11 --includes >/dev/null || {
    echo "run-on-device: pybind11 is not installed for $python" >&2
    exit 1
  }
  # shellcheck disable=SC2046
  c++ -O2 -std=c++17 -shared -fPIC -fvisibility=hidden \
    $("$python" -m pybind11 --includes) -I"$carry/include" \
    -I"$root/runtime/include" "$root/runtime/python/MtrtModule.cpp" \
    -L"$carry/lib" -lmtrt -Wl,-rpath,"$carry/lib" \
    -o "$module_dir/mtrt$suffix"
fi
export PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
if [[ -x "$carry/bin/mtrt-cuda-tests" ]]; then
  MTRT_CUDA_TEST_BUNDLES="$carry" "$carry/bin/mtrt-cuda-tests" \
    --gtest_filter='CudaSessionTest.*' 2>&1 | tee "$out/cuda-session-tests.log"
fi
"$carry/bin/megatron-train" "$carry/tiny-gpt.mtb" --backend cuda \
  --data-path "$root/data/corpus.txt" --train-iters "$iters" --lr 1e-3 \
  --eval-interval 0 --log-interval 10 --no-progress-bar \
  --log-jsonl "$out/megatron-train.jsonl" | tee "$out/megatron-train.log"
"$python" "$root/examples/torch_feed.py" "$carry/tiny-gpt.mtb" \
  "$root/data/corpus.txt" --train-iters "$iters" --lr 1e-3 \
  --log-jsonl "$out/torch_feed.jsonl" | tee "$out/torch_feed.log"
"$python" "$root/examples/compare_losses.py" "$out/megatron-train.jsonl" \
  "$out/torch_feed.jsonl" --tolerance 1e-5 | tee "$out/compare.txt"
