#!/bin/bash
# Issue 22's attention table in one call on the GPU machine: this project's
# flash attention (mtrt-attention-bench) and PyTorch's SDPA backends
# (torch_sdpa.py: cuDNN, FlashAttention-2, memory-efficient) at the same
# shapes, then bench/attention_table.py's table.
#
# Usage: bench/run-attention-table.sh BIN OUT
#   BIN  a folder holding mtrt-attention-bench (a build with CUDA)
#   OUT  gets ours.txt, torch.txt and attention-table.md
#   REPEATS (environment) timed calls per figure, default 10
#   SHAPES (environment) the shapes of both, comma-separated (default:
#     issue 22's five, gpt2-124m,gpt-1.3b,s4096,s8192,gqa-4096; both tools
#     also have gpt2-350m and llama-1.5b)
#   IOS, DROPOUTS (environment) mtrt-attention-bench's filters (default:
#     all); DROPOUTS also torch_sdpa.py's (default 0.1,0)
set -u
bin=$(cd "$1" && pwd)
out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
# The CUDA runtime, cuDNN and NVRTC (which cuDNN's runtime-compiled
# attention engines load) where the machine has them.
libdirs=$(find /usr/local /opt /usr/lib -name 'libcudart.so.13*' -o \
  -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' 2>/dev/null |
  xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:-}"
# A bench/make-step-dir.sh folder (BIN is its bin/) brings the libraries
# the device image lacks.
if [ -f "$bin/../fallback-lib.tgz" ]; then
  source "$here/device-env.sh"
  device_libraries "$bin/.."
fi
shapes=${SHAPES:-gpt2-124m,gpt-1.3b,s4096,s8192,gqa-4096}
timeout 240 "$bin/mtrt-attention-bench" "${REPEATS:-10}" "$shapes" \
  "${IOS:-}" "${DROPOUTS:-}" >"$out/ours.txt" 2>&1
echo "mtrt-attention-bench: exit status $?" >>"$out/ours.txt"
timeout 300 python3 "$here/torch_sdpa.py" --repeats "${REPEATS:-10}" \
  --backends cudnn,flash --dropouts "${DROPOUTS:-0.1,0}" --shapes "$shapes" \
  >"$out/torch.txt" 2>&1
echo "torch_sdpa.py: exit status $?" >>"$out/torch.txt"
python3 "$here/attention_table.py" "$out/ours.txt" "$out/torch.txt" \
  >"$out/attention-table.md"
cat "$out/attention-table.md"
