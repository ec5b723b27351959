#!/bin/bash
# Why the Hopper attention backward with dropout runs slower in a training
# step than alone (bench/NOTES.md, session 31: 1.57 ms an instruction in
# gpt-1.3b's step against 1.29 ms in mtrt-attention-bench on one H100), in
# one call of the device tool (170 s on an H100, bench/NOTES.md session 32).
# On the GPU machine:
#   1. the step's per-op profile (MTRT_CUDA_PROFILE=1) of gpt-1.3b mb 8 at
#      dropout 0.1, twice, the second with MTRT_CUDA_HOPPER_TIMING=1 (the
#      backward's three kernels timed apart: delta with the zeroing of dq's
#      sums, the main kernel, dq's conversion), and the step under CUDA
#      graphs;
#   2. mtrt-attention-bench's Hopper path (q, k, v in place, dropout 0.1)
#      at every shape, with a warm L2 and from a cold one
#      (MTRT_BENCH_FLUSH_L2=1), and its three kernels at gpt-1.3b's shape;
#   3. PyTorch's cuDNN SDPA alone at the same shapes (bench/torch_sdpa.py)
#      and torch.compile's step at the same model (bench/torch_step.py)
#      with its attention kernels' time a step (--profile 2);
#   4. SM clock and power sampled by nvidia-smi every 20 ms during each of
#      1-3 (the median clock of the busier half of the samples, by power:
#      the bench alone idles between calls), since a step of products at
#      the 700 W cap clocks lower than a kernel alone;
#   5. when ncu is there and may read the counters, the main kernel in the
#      step and alone at unlocked clocks and an uncleared L2 (duration,
#      cycles, L2 hit rate, DRAM bytes, stalls).
# The summary (summary.txt) is written as it comes; a call cut short
# leaves what finished.
#
# Usage: bench/run-backward-gap.sh DIR OUT
#   DIR  a folder of bench/make-step-dir.sh (MODELS including gpt-1.3b:8)
#        whose bin/ also holds mtrt-attention-bench (make-step-dir.sh copies
#        it when BIN has one)
#   OUT  gets summary.txt, profile.log and, with ncu, ncu-step.csv and
#        ncu-bench.csv
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
source "$(dirname "$0")/device-env.sh"
device_libraries "$dir"
bin=$dir/bin
bundle=$dir/bundles/gpt-1.3b-mb8-d0.1.mtb
summary=$out/summary.txt
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit \
  --format=csv,noheader >"$summary"
elapsed() { echo "  ($(($(date +%s) - start)) s)" >>"$summary"; }

train() { # ITERATIONS [megatron-train flags]
  local iterations=$1
  shift
  timeout 120 "$bin/megatron-train" "$bundle" --data-path "$dir/corpus.txt" \
    --train-iters "$iterations" --lr 1e-4 --log-interval 1 --eval-iters 0 \
    --eval-interval 0 --no-progress-bar --clip-grad 1.0 --backend cuda "$@"
}

echo "1. gpt-1.3b mb 8 d0.1, per-op profile:" >>"$summary"
clocked "$summary" "$out/profile.log" env MTRT_CUDA_PROFILE=1 \
  bash -c "$(declare -f train); bin=$bin bundle=$bundle dir=$dir; train 4"
grep -E '^\s+(attention_grad|attention|train_step) ' "$out/profile.log" \
  >>"$summary"
echo "   with MTRT_CUDA_HOPPER_TIMING=1:" >>"$summary"
clocked "$summary" /tmp/timed.log env MTRT_CUDA_PROFILE=1 MTRT_CUDA_HOPPER_TIMING=1 \
  bash -c "$(declare -f train); bin=$bin bundle=$bundle dir=$dir; train 4"
grep -E '^\s+attention_grad |hopper backward, mean' /tmp/timed.log |
  tail -2 >>"$summary"
echo "   under CUDA graphs, 8 iterations:" >>"$summary"
clocked "$summary" /tmp/graphs.log \
  bash -c "$(declare -f train); bin=$bin bundle=$bundle dir=$dir; train 8"
grep -E "iteration +[5-8]/" /tmp/graphs.log | sed 's/^/  /' >>"$summary"
elapsed

for flush in 0 1; do
  echo "2. mtrt-attention-bench hopper-qkv 0.1, MTRT_BENCH_FLUSH_L2=$flush:" \
    >>"$summary"
  clocked "$summary" /tmp/bench.log env MTRT_BENCH_FLUSH_L2=$flush timeout 90 \
    "$bin/mtrt-attention-bench" 10 "" hopper-qkv 0.1
  grep -E "^(gpt|s4096|s8192|gqa|llama)" /tmp/bench.log >>"$summary"
  # 48 calls make one report of the timer.
  MTRT_CUDA_HOPPER_TIMING=1 MTRT_BENCH_FLUSH_L2=$flush timeout 60 \
    "$bin/mtrt-attention-bench" 60 gpt-1.3b hopper-qkv 0.1 2>&1 |
    grep "hopper backward, mean" | head -1 >>"$summary"
done
elapsed

echo "3. PyTorch's cuDNN SDPA alone:" >>"$summary"
clocked "$summary" /tmp/sdpa.log timeout 150 python3 "$root/bench/torch_sdpa.py" \
  --backends cudnn --dropouts 0.1,0 --shapes all
grep -E "cudnn" /tmp/sdpa.log >>"$summary"
echo "   torch.compile's step, gpt-1.3b mb 8 d0.1:" >>"$summary"
clocked "$summary" /tmp/torch-step.log timeout 150 python3 "$dir/bench/torch_step.py" \
  "$dir/models/gpt-1.3b.yaml" --micro-batch-size 8 --dropout 0.1 \
  --clip-grad 1.0 --steps 6 --warmup 2 --profile 2
grep -E '^\{|== profile' /tmp/torch-step.log | cut -c1-400 | sed 's/^/  /' \
  >>"$summary"
# Its attention kernels a step (cuDNN's forward and backward, the dO.O and
# dq conversions beside them).
grep -i -E 'cudnn|flash|fmha|attention|sdpa' /tmp/torch-step.log |
  grep -v '^\{' | head -8 | cut -c1-160 | sed 's/^/  /' >>"$summary"
elapsed

ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu \
  /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ]; then
  metrics=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second
  metrics+=,gpc__cycles_elapsed.max,lts__t_sector_hit_rate.pct
  metrics+=,dram__bytes_read.sum,dram__bytes_write.sum
  metrics+=,sm__throughput.avg.pct_of_peak_sustained_elapsed
  metrics+=,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct
  metrics+=,smsp__warp_issue_stalled_barrier_per_warp_active.pct
  metrics+=,smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct
  flags=(--kernel-name regex:hopperBackwardKernel --clock-control none
    --cache-control none --metrics "$metrics" --csv)
  echo "5. ncu ($ncu), the main kernel in the step, then alone:" >>"$summary"
  MTRT_CUDA_PROFILE=1 timeout 150 "$ncu" "${flags[@]}" --launch-skip 30 \
    --launch-count 2 bash -c \
    "$(declare -f train); bin=$bin bundle=$bundle dir=$dir; train 3" \
    >"$out/ncu-step.csv" 2>/tmp/ncu-step.err
  tail -2 /tmp/ncu-step.err >>"$summary"
  timeout 100 "$ncu" "${flags[@]}" --launch-skip 4 --launch-count 2 \
    "$bin/mtrt-attention-bench" 3 gpt-1.3b hopper-qkv 0.1 \
    >"$out/ncu-bench.csv" 2>/tmp/ncu-bench.err
  tail -2 /tmp/ncu-bench.err >>"$summary"
  # Each profiled launch's duration, cycles and clock, step first.
  grep -h -E 'gpu__time_duration.sum|gpc__cycles_elapsed.max|sm__cycles_elapsed.avg.per_second' \
    "$out/ncu-step.csv" "$out/ncu-bench.csv" |
    awk -F'","' '{ print "  " $(NF - 2) " " $NF }' | tr -d '"' >>"$summary"
  elapsed
fi
echo "done" >>"$summary"
cat "$summary"
