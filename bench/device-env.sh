#!/bin/bash
# Sourced by the bench/run-*.sh scripts that run on the GPU machine (through
# the device tool, from a bench/make-step-dir.sh folder).

# device_libraries DIR: unpacks DIR/fallback-lib.tgz (the libraries the
# device image lacks) into /tmp/fallback-lib and puts on LD_LIBRARY_PATH the
# image's CUDA runtime, cuBLASLt, cuDNN, NVRTC and NCCL first, then DIR/lib
# (libmtrt beside mtrt-cuda-tests), then the fallback libraries.
device_libraries() {
  local dir=$1 found
  mkdir -p /tmp/fallback-lib
  tar -C /tmp/fallback-lib -xzf "$dir/fallback-lib.tgz"
  found=$(find /usr/local /opt /usr/lib -name 'libcudart.so.13*' -o \
    -name 'libcublasLt.so.13*' -o -name 'libcudnn.so.9' -o \
    -name 'libnvrtc.so.13' -o -name 'libnccl.so.2' 2>/dev/null |
    xargs -r -n1 dirname | sort -u | tr '\n' ':')
  export LD_LIBRARY_PATH="$found$dir/lib:${LD_LIBRARY_PATH:-}:/tmp/fallback-lib"
}

# clocked REPORT LOG COMMAND...: runs COMMAND into LOG while nvidia-smi
# samples the SM clock and the power every 20 ms, then appends to REPORT the
# median clock and the mean power of the busier half of the samples by power
# (a step of products at the 700 W cap clocks lower than a kernel alone).
clocked() {
  local report=$1 log=$2 samples sampler
  shift 2
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits \
    -lms 20 >/tmp/clocks.txt &
  sampler=$!
  "$@" >"$log" 2>&1
  kill $sampler
  wait $sampler 2>/dev/null
  samples=$(grep -c , /tmp/clocks.txt)
  sort -g -r -t, -k2 /tmp/clocks.txt | head -n $(((samples + 1) / 2)) |
    sort -n -t, -k1 | awk -F, '{ c[++n] = $1; p += $2 }
    END { if (n) printf "  SM clock, the busier %d samples: median %s, min %s, max %s MHz; %.0f W\n", n, c[int(n / 2) + 1], c[1], c[n], p / n
          else print "  no clock sample" }' >>"$report"
}
