// The value trace of core/ValueTrace.h.
#include "core/ValueTrace.h"

#include "core/Error.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

namespace mtrt {

namespace {
std::mutex traceMutex;
std::set<std::string> tracedFunctions;
} // namespace

ValueTrace *ValueTrace::fromEnvironment() {
  static ValueTrace *trace = [] () -> ValueTrace * {
    const char *path = std::getenv("MTRT_VALUE_TRACE");
    return path && *path ? new ValueTrace(path) : nullptr;
  }();
  return trace;
}

bool ValueTrace::startRun(const std::string &function) {
  std::lock_guard<std::mutex> lock(traceMutex);
  return tracedFunctions.insert(function).second;
}

void ValueTrace::record(const std::string &function, size_t position,
                        const char *op, size_t resultIndex, int64_t value,
                        const float *data, int64_t count) {
  double sum = 0, absSum = 0;
  for (int64_t i = 0; i < count; ++i) {
    sum += data[i];
    absSum += std::fabs(data[i]);
  }
  std::lock_guard<std::mutex> lock(traceMutex);
  FILE *file = std::fopen(path_.c_str(), "a");
  if (!file)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "MTRT_VALUE_TRACE: cannot append to '" + path_ + "'");
  std::fprintf(file, "%s %zu %s result %zu value %lld count %lld sum %.9g abs %.9g\n",
               function.c_str(), position, op, resultIndex,
               static_cast<long long>(value), static_cast<long long>(count),
               sum, absSum);
  std::fclose(file);
}

} // namespace mtrt
