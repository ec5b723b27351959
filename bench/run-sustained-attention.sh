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
mkdir -p "$out" /tmp/fallback-lib
tar -C /tmp/fallback-lib -xzf "$dir/fallback-lib.tgz"
libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
  -o -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' \
  -o -name 'libcudart.so.13*' 2>/dev/null | xargs -r -n1 dirname | sort -u |
  tr '\n' ':')
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:-}:/tmp/fallback-lib"
report=$out/sustained-attention.txt
calls=${CALLS:-1000}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit \
  --format=csv,noheader >"$report"

# clocked LOG COMMAND...: runs COMMAND into LOG, sampling the SM clock and
# the power; appends LOG's timing lines and the median clock of the busier
# half of the samples.
clocked() {
  local log=$1
  shift
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits \
    -lms 20 >/tmp/clocks.txt &
  local sampler=$!
  "$@" >"$log" 2>&1
  kill $sampler
  wait $sampler 2>/dev/null
  grep -E "^(gpt|llama)|MISMATCH|rror" "$log" >>"$report"
  local samples
  samples=$(grep -c , /tmp/clocks.txt)
  sort -g -r -t, -k2 /tmp/clocks.txt | head -n $(((samples + 1) / 2)) |
    sort -n -t, -k1 | awk -F, '{ c[++n] = $1; p += $2 }
    END { if (n) printf "  SM clock, the busier %d samples: median %s, min %s, max %s MHz; %.0f W\n", n, c[int(n / 2) + 1], c[1], c[n], p / n
          else print "  no clock sample" }' >>"$report"
}

for shape in gpt-1.3b gpt2-350m; do
  echo "== $shape, ours (hopper-qkv, dropout 0.1), as the bench runs:" \
    >>"$report"
  clocked /tmp/ours.log timeout 60 "$dir/bin/mtrt-attention-bench" 20 \
    "$shape" hopper-qkv 0.1
  echo "   sustained ($calls calls):" >>"$report"
  clocked /tmp/ours.log env MTRT_BENCH_SUSTAIN="$calls" timeout 90 \
    "$dir/bin/mtrt-attention-bench" 20 "$shape" hopper-qkv 0.1
  echo "   cuDNN through ours (cudnn-qkv, dropout 0), as the bench runs:" \
    >>"$report"
  clocked /tmp/ours.log timeout 60 "$dir/bin/mtrt-attention-bench" 20 \
    "$shape" cudnn-qkv 0
  echo "   sustained:" >>"$report"
  clocked /tmp/ours.log env MTRT_BENCH_SUSTAIN="$calls" timeout 90 \
    "$dir/bin/mtrt-attention-bench" 20 "$shape" cudnn-qkv 0
  echo "== $shape, PyTorch's cuDNN SDPA (dropout 0.1 and 0), as it runs:" \
    >>"$report"
  clocked /tmp/torch.log timeout 90 python3 "$dir/bench/torch_sdpa.py" \
    --backends cudnn --dropouts 0.1,0 --shapes "$shape" --repeats 20
  echo "   sustained:" >>"$report"
  clocked /tmp/torch.log timeout 120 python3 "$dir/bench/torch_sdpa.py" \
    --backends cudnn --dropouts 0.1,0 --shapes "$shape" --sustain "$calls"
done
echo "done" >>"$report"
cat "$report"
