#!/bin/sh
# Fails if libmtrt.so exports a symbol that is not part of the mtrt_ C API.
# Usage: check-exports.sh path/to/libmtrt.so [nm]
set -eu

lib=${1:?usage: check-exports.sh path/to/libmtrt.so [nm]}
nm=${2:-nm}
[ -n "$nm" ] || nm=nm

symbols=$("$nm" -D --defined-only "$lib") || {
  echo "check-exports: '$nm -D --defined-only $lib' failed" >&2
  exit 1
}

# Columns: [address] type name. Version nodes (type A) and the linker's own
# markers are not ours to police.
bad=$(printf '%s\n' "$symbols" | awk '
  NF >= 2 {
    name = $NF; type = $(NF - 1)
    if (type == "A") next
    if (name ~ /^(_init|_fini|__bss_start|_edata|_end)$/) next
    if (name !~ /^mtrt_/) print type " " name
  }')
count=$(printf '%s\n' "$symbols" | awk 'NF >= 2 && $NF ~ /^mtrt_/' | wc -l)

if [ -n "$bad" ]; then
  echo "check-exports: $lib exports symbols outside the mtrt_ C API:" >&2
  printf '%s\n' "$bad" >&2
  echo "Give them hidden visibility or drop them from src/mtrt.exports." >&2
  exit 1
fi
if [ "$count" -eq 0 ]; then
  echo "check-exports: $lib exports no mtrt_ symbols at all" >&2
  exit 1
fi
echo "check-exports: $lib exports $count symbols, all mtrt_*"
