// The host backend's single device: the CPU, described from /proc and sysconf.
#include "core/Backend.h"
#include "core/Status.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <unistd.h>

namespace {

/// The first "model name" in /proc/cpuinfo, or "host" where there is none
/// (some architectures do not report one).
std::string readCpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  static const char kKey[] = "model name";
  while (std::getline(cpuinfo, line)) {
    if (line.compare(0, sizeof(kKey) - 1, kKey) != 0)
      continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos)
      continue;
    size_t begin = line.find_first_not_of(" \t", colon + 1);
    size_t end = line.find_last_not_of(" \t\r");
    if (begin == std::string::npos || end < begin)
      continue;
    return line.substr(begin, end - begin + 1);
  }
  return "host";
}

int logicalCoreCount() {
  unsigned threads = std::thread::hardware_concurrency();
  if (threads > 0)
    return static_cast<int>(std::min<unsigned>(threads, 1u << 30));
  // hardware_concurrency may not know; sysconf usually does.
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

} // namespace

mtrt_status_t mtrt::host::deviceCount(int *outCount) {
  *outCount = 1;
  return nullptr;
}

mtrt_status_t mtrt::host::deviceInfo(int index, mtrt_device_info_t *outInfo) {
  MTRT_RETURN_IF_ERROR(
      checkDeviceIndex("mtrt_device_info", "host", index, /*count=*/1));

  long pages = sysconf(_SC_PHYS_PAGES);
  long pageSize = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || pageSize <= 0)
    return makeStatus(MTRT_STATUS_INTERNAL,
                      "mtrt_device_info: cannot read the host's physical "
                      "memory: sysconf(_SC_PHYS_PAGES) = %ld, "
                      "sysconf(_SC_PAGESIZE) = %ld",
                      pages, pageSize);

  std::string name = readCpuModelName();
  size_t length = std::min(name.size(), sizeof(outInfo->name) - 1);
  std::memcpy(outInfo->name, name.data(), length);
  outInfo->name[length] = '\0';
  outInfo->total_memory_bytes =
      static_cast<uint64_t>(pages) * static_cast<uint64_t>(pageSize);
  outInfo->compute_capability_major = 0;
  outInfo->compute_capability_minor = 0;
  outInfo->multiprocessor_count = logicalCoreCount();
  return nullptr;
}
