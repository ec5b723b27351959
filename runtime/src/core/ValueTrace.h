//===- ValueTrace.h - Each instruction's results, summed, to a file -------===//
//
// A debugging aid for backend parity: with MTRT_VALUE_TRACE=FILE set, the
// host and CUDA executors append one line per result of every instruction
// of each function's first run in the process: the function, the
// instruction's position and op, the result's index and value id, its
// element count, and the sum and the sum of absolute values of its
// elements (as stored: bf16 values widened). Two traces of one bundle (say
// `megatron-train --backend host` and `--backend cuda`, one iteration) line
// up instruction by instruction; the first line whose sums part names the
// first instruction whose results differ. The CUDA executor synchronizes
// after each traced instruction and runs without CUDA graphs while tracing.
//
//===----------------------------------------------------------------------===//
#ifndef MTRT_CORE_VALUETRACE_H
#define MTRT_CORE_VALUETRACE_H

#include <cstdint>
#include <string>

namespace mtrt {

class ValueTrace {
public:
  /// The process's trace when MTRT_VALUE_TRACE names a file, else null.
  static ValueTrace *fromEnvironment();

  /// Whether `function`'s run is traced: its first run in the process only
  /// (the first call for a function name returns true, later ones false).
  bool startRun(const std::string &function);

  /// Appends one result's line.
  void record(const std::string &function, size_t position,
              const char *op, size_t resultIndex, int64_t value,
              const float *data, int64_t count);

private:
  explicit ValueTrace(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

} // namespace mtrt

#endif // MTRT_CORE_VALUETRACE_H
