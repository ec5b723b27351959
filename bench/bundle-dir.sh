# Sourced by the scripts that fill a folder for the GPU machine
# (make-memory-dir.sh, make-step-dir.sh); they set `compile` (megatron-compile)
# and `b` (the folder's bundles/).

# Debian 12 libraries the device image (Ubuntu) lacks: OpenSSL 3, ICU 72 and
# libpng 1.6, in /lib/x86_64-linux-gnu.
fallback_libs=(libcrypto.so.3 libicuuc.so.72 libicudata.so.72 libpng16.so.16)

# NAME FLAGS...: bundles/NAME.mtb and its --report memory table,
# bundles/NAME.memory.txt.
bundle() {
  local name=$1
  shift
  "$compile" "$@" -o "$b/$name.mtb"
  "$compile" "$@" --report memory -o "$b/$name.memory.txt"
}
