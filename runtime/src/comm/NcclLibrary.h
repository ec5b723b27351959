// NCCL's entry points, from libnccl.so.2 loaded at run time: a build needs
// only nccl.h, and a run needs the library only when it makes an NCCL
// communicator (single-GPU runs and the device image's other tools do not).
#ifndef MTRT_SRC_COMM_NCCLLIBRARY_H
#define MTRT_SRC_COMM_NCCLLIBRARY_H

#include <nccl.h>

#include <string>

namespace mtrt::comm {

struct NcclLibrary {
  ncclResult_t (*getVersion)(int *);
  ncclResult_t (*getUniqueId)(ncclUniqueId *);
  ncclResult_t (*commInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int,
                                     ncclConfig_t *);
  ncclResult_t (*commSplit)(ncclComm_t, int, int, ncclComm_t *,
                            ncclConfig_t *);
  ncclResult_t (*commFinalize)(ncclComm_t);
  ncclResult_t (*commDestroy)(ncclComm_t);
  ncclResult_t (*commAbort)(ncclComm_t);
  ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t *);
  ncclResult_t (*commCount)(const ncclComm_t, int *);
  ncclResult_t (*commCuDevice)(const ncclComm_t, int *);
  ncclResult_t (*commUserRank)(const ncclComm_t, int *);
  const char *(*getErrorString)(ncclResult_t);
  const char *(*getLastError)(ncclComm_t);
  ncclResult_t (*allReduce)(const void *, void *, size_t, ncclDataType_t,
                            ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*allGather)(const void *, void *, size_t, ncclDataType_t,
                            ncclComm_t, cudaStream_t);
  ncclResult_t (*reduceScatter)(const void *, void *, size_t, ncclDataType_t,
                                ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int,
                            ncclComm_t, cudaStream_t);
  ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t);
  ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t);
  ncclResult_t (*groupStart)();
  ncclResult_t (*groupEnd)();

  /// "NCCL 2.28.9".
  std::string version;
};

/// Loads libnccl.so.2 once (thread-safe). Throws Error: UNAVAILABLE naming
/// the library and dlopen's message (with the fix: install NCCL or put it on
/// LD_LIBRARY_PATH), or a missing entry point (NCCL older than 2.18).
const NcclLibrary &ncclLibrary();

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_NCCLLIBRARY_H
