#!/bin/bash
# A session's whole device check in one call of the device tool (600 s at
# most), on nvidia-h200-x2: the single-GPU checks and benchmark on GPU 0
# (bench/run-device-checks.sh: the CUDA tests, tiny-gpt, the three models
# beside torch.compile), a gpt-1.3b per-op profile, then issue #11's runs
# (bench/run-multi-gpu.sh) in the time left.
#
# Made here (the build with -DMTRT_ENABLE_CUDA=ON):
#   ninja -C build
#   MULTI=1 OPENMPI=1 bench/make-device-dir.sh build \
#     build/bin/megatron-compile build-check/d
#   tar czf build-check/d.tgz -C build-check d && rm -rf build-check/d
#   cp bench/run-session-check.sh build-check/
# then through the device tool: command
#   bash build-check/run-session-check.sh "$OUT"
# with carry ["build-check"] (64 MiB at most), kind nvidia-h200-x2, timeout
# 600. What comes back (8 files at most): summary.txt, multi-gpu.txt,
# logs.tgz (every log and JSON line).
#
# Environment: SINGLE_LIMIT (seconds for the single-GPU part, 420: the
# tests take about 45 s, the six megatron-train runs about 90 s, the three
# torch.compile runs about 220 s), PROFILE=0 skips the profile, TOTAL (560:
# the multi-GPU part gets what is left of it).
here=$(cd "$(dirname "$0")" && pwd)
out=$1
mkdir -p /tmp/check && tar xzf "$here/d.tgz" -C /tmp/check
d=/tmp/check/d
r=/tmp/check/r
mkdir -p "$r"
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

# gpt-1.3b first: its ratio to torch.compile is the one issue 6 waits on.
CUDA_VISIBLE_DEVICES=0 TORCH=blocks CHECKS="env tests tiny mtrt torch" \
  TORCH_MODELS="gpt-1.3b gpt2-124m gpt2-350m" \
  timeout "${SINGLE_LIMIT:-420}" bash "$d/bench/run-device-checks.sh" "$d" "$r"
status=$?
# timeout ends the script, not a PyTorch run it started: end that too, so
# it holds no GPU memory during what follows.
pkill -f torch_step.py && sleep 3
echo "single-GPU part: exit $status at $(elapsed) s" >>"$r/summary.txt"
grep -E "^\[  FAILED|Segmentation|^\[  PASSED" "$r/tests.log" | head -20 \
  >>"$r/summary.txt"

libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
  -o -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' \
  -o -name 'libnccl.so.2*' 2>/dev/null | xargs -r -n1 dirname | sort -u |
  tr '\n' ':')
if [ "${PROFILE:-1}" = 1 ]; then
  CUDA_VISIBLE_DEVICES=0 MTRT_CUDA_PROFILE=1 \
    LD_LIBRARY_PATH="$d/lib:$libdirs:$d/fallback-lib" \
    timeout 40 "$d/bin/megatron-train" "$d/bundles/gpt-1.3b-bf16-mb8-fused.mtb" \
    --data-path "$d/corpus.txt" --train-iters 4 --lr 6e-4 --log-interval 1 \
    --eval-iters 0 --no-progress-bar --backend cuda >"$r/profile-1.3b.log" 2>&1
  echo "gpt-1.3b profile: exit $? at $(elapsed) s" >>"$r/summary.txt"
  sed -n '/^train_step:/,$p' "$r/profile-1.3b.log" | head -30 >>"$r/summary.txt"
fi

left=$(( ${TOTAL:-560} - $(elapsed) ))
if [ "$left" -gt 30 ]; then
  RUN_LIMIT=60 timeout "$left" bash "$d/bench/run-multi-gpu.sh" "$d" "$r"
  echo "multi-GPU part: exit $? at $(elapsed) s" >>"$r/summary.txt"
else
  echo "multi-GPU part: skipped ($left s left)" >>"$r/summary.txt"
fi
cp "$r/summary.txt" "$r/multi-gpu.txt" "$out/" 2>/dev/null
tar czf "$out/logs.tgz" -C /tmp/check r
