// The C API of sessions: pointer and struct-size checks, then the Session.
#include "capi/Handles.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

using mtrt::capi::checkNotNull;
using mtrt::guardApi;
using mtrt::makeStatus;

namespace {

/// The options struct of the first version (up to clip_grad), the smallest
/// accepted: the fields a caller's struct lacks (the fp16 loss scaling's)
/// take their defaults; newer ones are read up to this header's size.
constexpr size_t kOptionsSize = offsetof(mtrt_session_options_t, loss_scale);
/// The metrics struct of the first version (up to learning_rate), the
/// smallest accepted; the library writes what the caller's size holds.
constexpr size_t kMetricsSize = offsetof(mtrt_step_metrics_t, loss_scale);

mtrt_status_t checkMetrics(const char *apiName,
                           const mtrt_step_metrics_t *metrics) {
  if (metrics && metrics->struct_size < kMetricsSize)
    return makeStatus(MTRT_STATUS_INVALID_ARGUMENT,
                      "%s: out_metrics->struct_size is %zu, expected at least "
                      "%zu: set it to sizeof(mtrt_step_metrics_t)",
                      apiName, metrics->struct_size, kMetricsSize);
  return nullptr;
}

/// Writes `metrics` into the caller's struct, as much as its size holds.
void writeMetrics(const mtrt_step_metrics_t &metrics,
                  mtrt_step_metrics_t *out) {
  size_t size = out->struct_size;
  std::memcpy(out, &metrics, std::min(size, sizeof(metrics)));
  out->struct_size = size;
}

/// Finds parameter `name` of the session.
mtrt_status_t findParameter(const char *apiName, mtrt_session_t session,
                            const char *name, size_t *index) {
  MTRT_RETURN_IF_ERROR(checkNotNull(apiName, session, "session"));
  MTRT_RETURN_IF_ERROR(checkNotNull(apiName, name, "name"));
  *index = session->session->parameterIndex(name);
  return nullptr;
}

} // namespace

extern "C" {

MTRT_API void mtrt_session_options_initialize(mtrt_session_options_t *o) {
  if (!o)
    return;
  std::memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->backend = MTRT_BACKEND_HOST;
  o->seed = 1234;
  o->lr = 1e-4;
  o->lr_decay_style = MTRT_LR_DECAY_CONSTANT;
  o->weight_decay = 0.01;
  o->adam_beta1 = 0.9;
  o->adam_beta2 = 0.95;
  o->adam_eps = 1e-8;
  o->clip_grad = 1.0;
  o->initial_loss_scale = 4294967296.0; // 2^32, megatron-train's defaults
  o->min_loss_scale = 1.0;
  o->loss_scale_window = 1000;
  o->hysteresis = 2;
}

MTRT_API mtrt_status_t mtrt_session_create(
    mtrt_bundle_t bundle, const mtrt_session_options_t *options,
    mtrt_session_t *out_session) {
  static const char *const kApi = "mtrt_session_create";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_session, "out_session"));
    *out_session = nullptr;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, bundle, "bundle"));
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, options, "options"));
    if (options->struct_size < kOptionsSize)
      return makeStatus(MTRT_STATUS_INVALID_ARGUMENT,
                        "%s: options->struct_size is %zu, expected at least "
                        "%zu: fill the options with "
                        "mtrt_session_options_initialize",
                        kApi, options->struct_size, kOptionsSize);
    mtrt_session_options_t copy;
    mtrt_session_options_initialize(&copy);
    std::memcpy(&copy, options, std::min(options->struct_size, sizeof(copy)));
    copy.struct_size = sizeof(copy);
    auto handle = std::make_unique<mtrt_session_s>();
    handle->session = std::make_unique<mtrt::capi::Session>(
        bundle->bundle, copy,
        copy.communicator ? copy.communicator->communicator.get() : nullptr);
    *out_session = handle.release();
    return nullptr;
  });
}

MTRT_API void mtrt_session_release(mtrt_session_t session) { delete session; }

MTRT_API mtrt_status_t mtrt_session_batch_info(mtrt_session_t session,
                                               int64_t *out_micro_batch,
                                               int64_t *out_seq_length,
                                               mtrt_dtype_t *out_dtype) {
  static const char *const kApi = "mtrt_session_batch_info";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(
        checkNotNull(kApi, out_micro_batch, "out_micro_batch"));
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_seq_length, "out_seq_length"));
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_dtype, "out_dtype"));
    *out_micro_batch = 0;
    *out_seq_length = 0;
    *out_dtype = MTRT_DTYPE_I32;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    *out_micro_batch = session->session->microBatch();
    *out_seq_length = session->session->seqLength();
    *out_dtype = mtrt::capi::toCDType(session->session->idType());
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_set_batch(mtrt_session_t session,
                                              const mtrt_tensor_t *tokens,
                                              const mtrt_tensor_t *labels,
                                              mtrt_batch_mode_t mode) {
  static const char *const kApi = "mtrt_session_set_batch";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, tokens, "tokens"));
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, labels, "labels"));
    session->session->setBatch(*tokens, *labels, mode);
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_accumulate(mtrt_session_t session,
                                               double *out_loss) {
  static const char *const kApi = "mtrt_session_accumulate";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    if (out_loss)
      *out_loss = 0;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    double loss = session->session->accumulate();
    if (out_loss)
      *out_loss = loss;
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_apply(mtrt_session_t session,
                                          mtrt_step_metrics_t *out_metrics) {
  static const char *const kApi = "mtrt_session_apply";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkMetrics(kApi, out_metrics));
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    mtrt_step_metrics_t metrics = session->session->apply();
    if (out_metrics)
      writeMetrics(metrics, out_metrics);
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_train_step(
    mtrt_session_t session, mtrt_step_metrics_t *out_metrics) {
  static const char *const kApi = "mtrt_session_train_step";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkMetrics(kApi, out_metrics));
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    session->session->accumulate();
    mtrt_step_metrics_t metrics = session->session->apply();
    if (out_metrics)
      writeMetrics(metrics, out_metrics);
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_eval_step(mtrt_session_t session,
                                              double *out_loss) {
  static const char *const kApi = "mtrt_session_eval_step";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_loss, "out_loss"));
    *out_loss = 0;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    *out_loss = session->session->evaluate();
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_metrics(mtrt_session_t session,
                                            mtrt_step_metrics_t *out_metrics) {
  static const char *const kApi = "mtrt_session_metrics";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_metrics, "out_metrics"));
    MTRT_RETURN_IF_ERROR(checkMetrics(kApi, out_metrics));
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    mtrt_step_metrics_t metrics = session->session->metrics();
    metrics.struct_size = sizeof(metrics);
    writeMetrics(metrics, out_metrics);
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_parameter_count(mtrt_session_t session,
                                                    size_t *out_count) {
  static const char *const kApi = "mtrt_session_parameter_count";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_count, "out_count"));
    *out_count = 0;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    *out_count = session->session->parameterCount();
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_parameter_name(mtrt_session_t session,
                                                   size_t index,
                                                   const char **out_name) {
  static const char *const kApi = "mtrt_session_parameter_name";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_name, "out_name"));
    *out_name = nullptr;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    size_t count = session->session->parameterCount();
    if (index >= count)
      return makeStatus(MTRT_STATUS_OUT_OF_RANGE,
                        "%s: index %zu is out of range: the bundle has %zu "
                        "parameters",
                        kApi, index, count);
    *out_name = session->session->bundle().parameters()[index].name.c_str();
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_parameter_info(mtrt_session_t session,
                                                   const char *name,
                                                   mtrt_tensor_t *out_info) {
  static const char *const kApi = "mtrt_session_parameter_info";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_info, "out_info"));
    std::memset(out_info, 0, sizeof(*out_info));
    size_t index = 0;
    MTRT_RETURN_IF_ERROR(findParameter(kApi, session, name, &index));
    *out_info = session->session->parameterView(index);
    out_info->data = nullptr;
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_parameter_get(
    mtrt_session_t session, const char *name,
    const mtrt_tensor_t *destination) {
  static const char *const kApi = "mtrt_session_parameter_get";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, destination, "destination"));
    size_t index = 0;
    MTRT_RETURN_IF_ERROR(findParameter(kApi, session, name, &index));
    session->session->copyParameter(index, *destination, true);
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_parameter_set(mtrt_session_t session,
                                                  const char *name,
                                                  const mtrt_tensor_t *source) {
  static const char *const kApi = "mtrt_session_parameter_set";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, source, "source"));
    size_t index = 0;
    MTRT_RETURN_IF_ERROR(findParameter(kApi, session, name, &index));
    session->session->copyParameter(index, *source, false);
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_parameter_view(mtrt_session_t session,
                                                   const char *name,
                                                   mtrt_tensor_t *out_view) {
  static const char *const kApi = "mtrt_session_parameter_view";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_view, "out_view"));
    std::memset(out_view, 0, sizeof(*out_view));
    size_t index = 0;
    MTRT_RETURN_IF_ERROR(findParameter(kApi, session, name, &index));
    *out_view = session->session->parameterView(index);
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_cuda_stream(mtrt_session_t session,
                                                void **out_stream) {
  static const char *const kApi = "mtrt_session_cuda_stream";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, out_stream, "out_stream"));
    *out_stream = nullptr;
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    if (session->session->backend().backend() != MTRT_BACKEND_CUDA)
      return makeStatus(MTRT_STATUS_FAILED_PRECONDITION,
                        "%s: this is a host session; only cuda sessions "
                        "have a stream",
                        kApi);
    *out_stream = session->session->backend().stream();
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_save_checkpoint(mtrt_session_t session,
                                                    const char *directory) {
  static const char *const kApi = "mtrt_session_save_checkpoint";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, directory, "directory"));
    session->session->saveCheckpoint(directory);
    return nullptr;
  });
}

MTRT_API mtrt_status_t mtrt_session_load_checkpoint(mtrt_session_t session,
                                                    const char *directory) {
  static const char *const kApi = "mtrt_session_load_checkpoint";
  return guardApi(kApi, [&]() -> mtrt_status_t {
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, session, "session"));
    MTRT_RETURN_IF_ERROR(checkNotNull(kApi, directory, "directory"));
    session->session->loadCheckpoint(directory);
    return nullptr;
  });
}

} // extern "C"
