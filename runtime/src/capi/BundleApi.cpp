// The C API of bundles, dtypes and communicators.
#include "capi/Handles.h"

#include "comm/InProcessWorld.h"
#if MTRT_HAVE_NCCL
#include "comm/NcclCommunicator.h"
#endif

#include <new>

using mtrt::capi::checkNotNull;
using mtrt::guardApi;
using mtrt::makeStatus;

extern "C" {

MTRT_API const char *mtrt_dtype_name(mtrt_dtype_t dtype) {
  switch (dtype) {
  case MTRT_DTYPE_F32:
  case MTRT_DTYPE_F64:
  case MTRT_DTYPE_BF16:
  case MTRT_DTYPE_F16:
  case MTRT_DTYPE_I32:
  case MTRT_DTYPE_I64:
    return mtrt::dtypeName(mtrt::capi::toDType(dtype, ""));
  }
  return "unknown";
}

MTRT_API size_t mtrt_dtype_size(mtrt_dtype_t dtype) {
  switch (dtype) {
  case MTRT_DTYPE_F32:
  case MTRT_DTYPE_F64:
  case MTRT_DTYPE_BF16:
  case MTRT_DTYPE_F16:
  case MTRT_DTYPE_I32:
  case MTRT_DTYPE_I64:
    return mtrt::dtypeSize(mtrt::capi::toDType(dtype, ""));
  }
  return 0;
}

MTRT_API mtrt_status_t mtrt_bundle_load(const char *path,
                                        mtrt_bundle_t *out_bundle) {
  static const char *const kApi = "mtrt_bundle_load";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_bundle, "out_bundle"));
    *out_bundle = nullptr;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, path, "path"));
    auto handle = std::make_unique<mtrt_bundle_s>();
    handle->bundle =
        std::make_shared<const mtrt::Bundle>(mtrt::Bundle::load(path));
    *out_bundle = handle.release();
    return nullptr;
  });
}

MTRT_API void mtrt_bundle_release(mtrt_bundle_t bundle) { delete bundle; }

MTRT_API const char *mtrt_bundle_name(mtrt_bundle_t bundle) {
  return bundle ? bundle->bundle->name().c_str() : "";
}

MTRT_API mtrt_status_t mtrt_bundle_rank_count(mtrt_bundle_t bundle,
                                              int *out_count) {
  static const char *const kApi = "mtrt_bundle_rank_count";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_count, "out_count"));
    *out_count = 0;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, bundle, "bundle"));
    *out_count = static_cast<int>(bundle->bundle->rankCount());
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_communicator_create_in_process(
    int size, mtrt_communicator_t *out_communicators) {
  static const char *const kApi = "mtrt_communicator_create_in_process";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(
        checkNotNull(kApi, out_communicators, "out_communicators"));
    if (size < 1 || size > MTRT_MAX_IN_PROCESS_RANKS)
      return makeStatus(MTRT_STATUS_INVALID_ARGUMENT,
                        "%s: size %d is out of range; expected 1 to %d ranks",
                        kApi, size, MTRT_MAX_IN_PROCESS_RANKS);
    for (int r = 0; r < size; ++r)
      out_communicators[r] = nullptr;
    // The communicators share the world's state, so the world itself need
    // not outlive this call.
    mtrt::comm::InProcessWorld world(size);
    std::vector<std::unique_ptr<mtrt_communicator_s>> handles;
    for (int r = 0; r < size; ++r) {
      handles.push_back(std::make_unique<mtrt_communicator_s>());
      handles.back()->communicator = world.communicator(r);
    }
    for (int r = 0; r < size; ++r)
      out_communicators[r] = handles[r].release();
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_communicator_create_nccl(
    struct ncclComm *comm, mtrt_communicator_t *out_communicator) {
  static const char *const kApi = "mtrt_communicator_create_nccl";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(
        checkNotNull(kApi, out_communicator, "out_communicator"));
    *out_communicator = nullptr;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, comm, "comm"));
#if MTRT_HAVE_NCCL
    auto handle = std::make_unique<mtrt_communicator_s>();
    handle->communicator = mtrt::comm::NcclCommunicator::wrap(comm);
    *out_communicator = handle.release();
    return nullptr;
#else
    return makeStatus(MTRT_STATUS_UNAVAILABLE,
                      "%s: this mtrt runtime was built without NCCL (it "
                      "needs the CUDA backend and nccl.h at build time); run "
                      "several ranks in one process with "
                      "mtrt_communicator_create_in_process",
                      kApi);
#endif
  });
}

MTRT_API mtrt_status_t mtrt_communicator_rank(mtrt_communicator_t communicator,
                                              int *out_rank) {
  static const char *const kApi = "mtrt_communicator_rank";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_rank, "out_rank"));
    *out_rank = 0;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, communicator, "communicator"));
    *out_rank = communicator->communicator->rank();
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_communicator_size(mtrt_communicator_t communicator,
                                              int *out_size) {
  static const char *const kApi = "mtrt_communicator_size";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_size, "out_size"));
    *out_size = 0;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, communicator, "communicator"));
    *out_size = communicator->communicator->size();
    return nullptr;
  });
}

MTRT_API void mtrt_communicator_release(mtrt_communicator_t communicator) {
  delete communicator;
}

} // extern "C"
