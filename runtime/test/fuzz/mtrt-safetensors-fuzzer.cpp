// libFuzzer target for the safetensors reader: arbitrary bytes must either
// parse into a file whose every tensor can be read in bounds, or be refused
// with an mtrt::Error. A crash, a sanitizer report or a hang is a bug in
// src/core/Safetensors.cpp.
#include "core/Safetensors.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  try {
    mtrt::SafetensorsFile file = mtrt::SafetensorsFile::parse("fuzz", bytes);
    // The promises of a validated file: every tensor's bytes are inside the
    // data buffer and match its shape, and the float ones convert.
    uint64_t total = 0;
    for (const mtrt::SafetensorsTensor &t : file.tensors()) {
      if (t.end > file.dataSize() || t.numBytes() != t.numElements *
                                         mtrt::safetensorsDTypeSize(t.dtype))
        __builtin_trap();
      total += t.numBytes();
      volatile uint8_t sink = 0;
      const uint8_t *p = file.bytes(t);
      if (t.numBytes())
        sink = p[0] ^ p[t.numBytes() - 1];
      (void)sink;
      if (mtrt::isSafetensorsFloat(t.dtype) && t.numElements <= (1u << 16)) {
        std::vector<float> values(t.numElements);
        file.convert(t, values.data());
      }
      if (file.find(t.name) != &t)
        __builtin_trap();
    }
    if (total != file.dataSize())
      __builtin_trap();
  } catch (const mtrt::Error &) {
  }
  return 0;
}
