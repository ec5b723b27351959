#!/bin/sh
# Runs mtrt-info and checks that it exits 0 and lists the version and backends.
# Usage: check-mtrt-info.sh path/to/mtrt-info VERSION
set -eu

tool=${1:?usage: check-mtrt-info.sh path/to/mtrt-info VERSION}
version=${2:?usage: check-mtrt-info.sh path/to/mtrt-info VERSION}

if ! out=$("$tool"); then
  echo "check-mtrt-info: $tool exited with an error; its output:" >&2
  printf '%s\n' "$out" >&2
  exit 1
fi
printf '%s\n' "$out"

expect() {
  printf '%s\n' "$out" | grep -q -x -e "$1" || {
    echo "check-mtrt-info: no line matching '$1' in the output above" >&2
    exit 1
  }
}
expect "mtrt $version"
expect "backend host: 1 device"
expect "backend cuda: .*"
