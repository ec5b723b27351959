// libnccl.so.2 through dlopen.
#include "comm/NcclLibrary.h"

#include "core/Error.h"

#include <dlfcn.h>
#include <mutex>

namespace mtrt::comm {

namespace {

NcclLibrary load() {
  const char *file = "libnccl.so.2";
  void *handle = ::dlopen(file, RTLD_NOW | RTLD_GLOBAL);
  if (!handle) {
    const char *why = ::dlerror();
    throw Error(MTRT_STATUS_UNAVAILABLE,
                std::string("NCCL: cannot load ") + file + " (" +
                    (why ? why : "unknown error") +
                    "); install NCCL 2.18 or later (libnccl2) or add its "
                    "directory to LD_LIBRARY_PATH");
  }
  NcclLibrary lib{};
  auto resolve = [&](auto &slot, const char *name) {
    void *symbol = ::dlsym(handle, name);
    if (!symbol)
      throw Error(MTRT_STATUS_UNAVAILABLE,
                  std::string("NCCL: ") + file + " has no " + name +
                      "; NCCL 2.18 or later is needed");
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
  };
  resolve(lib.getVersion, "ncclGetVersion");
  resolve(lib.getUniqueId, "ncclGetUniqueId");
  resolve(lib.commInitRankConfig, "ncclCommInitRankConfig");
  resolve(lib.commSplit, "ncclCommSplit");
  resolve(lib.commFinalize, "ncclCommFinalize");
  resolve(lib.commDestroy, "ncclCommDestroy");
  resolve(lib.commAbort, "ncclCommAbort");
  resolve(lib.commGetAsyncError, "ncclCommGetAsyncError");
  resolve(lib.commCount, "ncclCommCount");
  resolve(lib.commCuDevice, "ncclCommCuDevice");
  resolve(lib.commUserRank, "ncclCommUserRank");
  resolve(lib.getErrorString, "ncclGetErrorString");
  resolve(lib.getLastError, "ncclGetLastError");
  resolve(lib.allReduce, "ncclAllReduce");
  resolve(lib.allGather, "ncclAllGather");
  resolve(lib.reduceScatter, "ncclReduceScatter");
  resolve(lib.broadcast, "ncclBroadcast");
  resolve(lib.send, "ncclSend");
  resolve(lib.recv, "ncclRecv");
  resolve(lib.groupStart, "ncclGroupStart");
  resolve(lib.groupEnd, "ncclGroupEnd");
  int code = 0;
  lib.getVersion(&code);
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9.
  lib.version = "NCCL " + std::to_string(code / 10000) + "." +
                std::to_string(code / 100 % 100) + "." +
                std::to_string(code % 100);
  return lib;
}

} // namespace

const NcclLibrary &ncclLibrary() {
  static std::once_flag once;
  static NcclLibrary library;
  static std::string failure;
  static mtrt_status_code_t failureCode = MTRT_STATUS_OK;
  std::call_once(once, [] {
    try {
      library = load();
    } catch (const Error &e) {
      failure = e.what();
      failureCode = e.code();
    }
  });
  if (failureCode != MTRT_STATUS_OK)
    throw Error(failureCode, failure);
  return library;
}

} // namespace mtrt::comm
