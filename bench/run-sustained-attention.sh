#!/bin/bash
# Whether the Hopper attention backward with dropout is slower in a training
# step than alone because it runs at a lower clock there (bench/NOTES.md,
# session 35: 1.45 ms an instruction in gpt-1.3b's step, 1.00 under ncu,
# while cuDNN's dropout backward in torch.compile's step takes what it takes
# alone). One call of the device tool, about 150 s: at gpt-1.3b's and
# gpt2-350m's shapes, dropout 0.1, ours (mtrt-attention-bench hopper-qkv)
# and PyTorch's cuDNN SDPA (bench/torch_sdpa.py), each timed as the benches
# do (the median of calls with the host waiting after each) and sustained
# (MTRT_BENCH_SUSTAIN / --sustain: calls back to back, after as many
# more), with the SM clock and power sampled every 20 ms (the median clock
# of the busier half of the samples, by power).
#
# Usage: bench/run-sustained-attention.sh DIR OUT
#   DIR    a bench/make-step-dir.sh folder with mtrt-attention-bench
#   OUT    gets sustained-attention.txt
#   CALLS  (environment) sustained calls, default 1000
set -u
dir=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
source "$(dirname "$0")/device-env.sh"
device_libraries "$dir"
report=$out/sustained-attention.txt
calls=${CALLS:-1000}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit \
  --format=csv,noheader >"$report"

# timed LABEL COMMAND...: COMMAND's timing lines and clock under LABEL.
timed() {
  echo "$1" >>"$report"
  shift
  clocked "$report" /tmp/timed.log "$@"
  grep -E "^(gpt|llama)|MISMATCH|rror" /tmp/timed.log >>"$report"
}

for shape in gpt-1.3b gpt2-350m; do
  for sustain in 0 "$calls"; do
    how="as the bench runs"
    ((sustain)) && how="sustained ($calls calls)"
    timed "== $shape, ours (hopper-qkv, dropout 0.1), $how:" \
      env MTRT_BENCH_SUSTAIN=$sustain timeout 90 \
      "$dir/bin/mtrt-attention-bench" 20 "$shape" hopper-qkv 0.1
    timed "== $shape, cuDNN through ours (cudnn-qkv, dropout 0), $how:" \
      env MTRT_BENCH_SUSTAIN=$sustain timeout 90 \
      "$dir/bin/mtrt-attention-bench" 20 "$shape" cudnn-qkv 0
    timed "== $shape, PyTorch's cuDNN SDPA (dropout 0.1 and 0), $how:" \
      timeout 120 python3 "$dir/bench/torch_sdpa.py" --backends cudnn \
      --dropouts 0.1,0 --shapes "$shape" --repeats 20 --sustain "$sustain"
  done
done
echo "done" >>"$report"
cat "$report"
