#!/bin/bash
# Where each side's step goes, kernel by kernel, on the GPU machine in one
# call of the device tool (issue 22: which kernels ours and torch.compile
# pick for the same products, and what each takes). For each bundle NAME of
# BUNDLES (a bench/make-step-dir.sh folder's MODEL-mbMB-dD):
#   1. ours: megatron-train under CUDA graphs, iteration 3 of 3 under ncu
#      (MTRT_CUDA_PROFILER_ITERATION=3, `--profile-from-start off`, the
#      kernels' durations only, clocks and caches left alone), summed by
#      kernel name (bench/kernel_summary.py); ncu runs the kernels one at a
#      time, so these are the kernels' own times, not the step's;
#   2. ours' per-op profile of the same step (MTRT_CUDA_PROFILE=1, 4
#      iterations, without graphs): the instructions' times in the step;
#   3. torch.compile's step at the same model and dropout (torch_step.py
#      --profile 2: its kernels' device time a step under torch.profiler);
#   4. torch.compile's attention kernels under ncu as 1 runs ours (cuDNN's
#      forward and backward and the two beside its backward, one at a
#      time, with their cycles: four layers of the second step's
#      backward), so that each side's attention compares kernel for
#      kernel (bench/NOTES.md, session 35: cuDNN's dropout backward 1.585 M
#      cycles at gpt-1.3b's shape, ours 1.800 M).
# The SM clock and power are sampled every 20 ms during 2 and 3 (the median
# clock of the busier half of the samples, by power). The summary is written
# as it comes; a call cut short leaves what finished.
#
# Usage: bench/run-kernel-profile.sh DIR OUT
#   DIR      a bench/make-step-dir.sh folder
#   OUT      gets kernel-profile.txt, NAME.ncu.csv and NAME.torch-ncu.csv for
#            each bundle
#   BUNDLES  (environment) default "gpt-1.3b-mb8-d0 gpt-1.3b-mb8-d0.1"; the
#            device tool brings 8 files back from a call: 3 bundles at most
#   LIMIT    (environment) seconds after which no further run starts,
#            default 480
#   TORCH_CACHE (environment) torch.compile's caches, as run-step-table.sh's
set -u
dir=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
source "$(dirname "$0")/device-env.sh"
device_libraries "$dir"
# run-step-table.sh's torch.compile caches: a call on a machine still warm
# compiles from them.
cache=${TORCH_CACHE:-/tmp/torch-compile-cache}
export TORCHINDUCTOR_CACHE_DIR=$cache/inductor TRITON_CACHE_DIR=$cache/triton
mkdir -p "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR"
report=$out/kernel-profile.txt
start=$(date +%s)
limit=${LIMIT:-480}
time_left() { (($(date +%s) - start < limit)); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit \
  --format=csv,noheader >"$report"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu \
  /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: ${ncu:-none}" >>"$report"

train() { # BUNDLE ITERATIONS
  timeout 150 "$dir/bin/megatron-train" "$dir/bundles/$1.mtb" \
    --data-path "$dir/corpus.txt" --train-iters "$2" --lr 1e-4 \
    --log-interval 1 --eval-iters 0 --eval-interval 0 --no-progress-bar \
    --clip-grad 1.0 --backend cuda
}

for name in ${BUNDLES:-gpt-1.3b-mb8-d0 gpt-1.3b-mb8-d0.1}; do
  time_left || break
  model=${name%-mb*}
  rest=${name#"$model"-mb}
  mb=${rest%-d*}
  dropout=${name##*-d}
  echo "== $name ($(($(date +%s) - start)) s)" >>"$report"
  if [ -n "$ncu" ]; then
    MTRT_CUDA_PROFILER_ITERATION=3 timeout 240 "$ncu" --profile-from-start off \
      --clock-control none --metrics gpu__time_duration.sum,gpc__cycles_elapsed.max --csv \
      --print-units base bash -c "$(declare -f train); dir=$dir; train $name 3" \
      >"$out/$name.ncu.csv" 2>/tmp/ncu.err
    echo "ours, ncu (exit status $?):" >>"$report"
    python3 "$dir/bench/kernel_summary.py" "$out/$name.ncu.csv" 40 \
      >>"$report" 2>&1 || tail -3 /tmp/ncu.err >>"$report"
  fi
  time_left || break
  echo "ours, per op in the step (MTRT_CUDA_PROFILE=1):" >>"$report"
  clocked "$report" /tmp/profile.log env MTRT_CUDA_PROFILE=1 \
    bash -c "$(declare -f train); dir=$dir; train $name 4"
  grep -E 'ms per run' /tmp/profile.log | head -40 >>"$report"
  time_left || break
  echo "torch.compile, dropout $dropout:" >>"$report"
  clocked "$report" /tmp/torch.log timeout 200 python3 "$dir/bench/torch_step.py" \
    "$dir/models/$model.yaml" --micro-batch-size "$mb" --dropout "$dropout" \
    --clip-grad 1.0 --steps 6 --warmup 2 --profile 2
  grep -E '^\{' /tmp/torch.log | cut -c1-300 >>"$report"
  sed -n '/== profile/,$p' /tmp/torch.log | head -42 >>"$report"
  time_left && [ -n "$ncu" ] || continue
  # One step's attention kernels are 4 a layer (the forward, and dO.O, the
  # backward and dq's conversion): skip the first step and the second's
  # forward.
  layers=$(sed -n 's/^ *num_layers: *\([0-9]*\).*/\1/p' "$dir/models/$model.yaml")
  sdpa=cudnn
  grep -q "position_embedding_type: rope" "$dir/models/$model.yaml" &&
    sdpa=cudnn+gqa
  timeout 240 "$ncu" --clock-control none --cache-control none \
    --kernel-name 'regex:flash_bprop|flash_fprop|dot_do_o|convert_dq' \
    --launch-skip $((5 * layers)) --launch-count 12 \
    --metrics gpu__time_duration.sum,gpc__cycles_elapsed.max --csv \
    --print-units base python3 "$dir/bench/torch_step.py" \
    "$dir/models/$model.yaml" --micro-batch-size "$mb" --dropout "$dropout" \
    --clip-grad 1.0 --steps 3 --warmup 1 --sdpa $sdpa \
    >"$out/$name.torch-ncu.csv" 2>/tmp/ncu-torch.err
  echo "torch.compile's attention kernels, ncu (exit status $?):" >>"$report"
  python3 "$dir/bench/kernel_summary.py" "$out/$name.torch-ncu.csv" 8 \
    >>"$report" 2>&1 || tail -3 /tmp/ncu-torch.err >>"$report"
done
echo "done at $(($(date +%s) - start)) s" >>"$report"
cat "$report"
