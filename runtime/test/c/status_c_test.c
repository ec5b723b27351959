/* Every error status of the C API that a host machine can produce, each
 * printed as "what: CODE: message" for FileCheck.
 * Usage: mtrt-status-c-test TINY.mtb TINY-TP2.mtb TRAIN-ONLY.mtb
 *        EVAL-ONLY.mtb PP2.mtb SCRATCH_DIR */
#include "c_test_support.h"

#include <math.h>
#include <string.h>

enum { kTokens = 8 * 128 };
static int32_t tokens[kTokens], labels[kTokens];

static mtrt_tensor_t batch(int32_t *data) {
  return hostTensor(data, MTRT_DTYPE_I32, 8, 128);
}

static void writeFile(const char *path, const char *text) {
  FILE *file = fopen(path, "wb");
  CHECK(file != NULL);
  if (file) {
    fputs(text, file);
    fclose(file);
  }
}

static void bundleErrors(const char *scratch) {
  mtrt_bundle_t bundle = NULL;
  expectError("load NULL path", mtrt_bundle_load(NULL, &bundle),
              MTRT_STATUS_INVALID_ARGUMENT);
  expectError("load NULL out", mtrt_bundle_load("x.mtb", NULL),
              MTRT_STATUS_INVALID_ARGUMENT);
  expectError("load missing",
              mtrt_bundle_load("/nonexistent/missing.mtb", &bundle),
              MTRT_STATUS_NOT_FOUND);
  char path[4096];
  snprintf(path, sizeof(path), "%s/garbage.mtb", scratch);
  writeFile(path, "this is not a bundle");
  mtrt_status_t status = mtrt_bundle_load(path, &bundle);
  expectError("load garbage", status, mtrt_status_code(status));
  CHECK(bundle == NULL);
  int count = 0;
  expectError("rank_count NULL bundle", mtrt_bundle_rank_count(NULL, &count),
              MTRT_STATUS_INVALID_ARGUMENT);
  expectError("rank_count NULL out", mtrt_bundle_rank_count(bundle, NULL),
              MTRT_STATUS_INVALID_ARGUMENT);
}

static void communicatorErrors(void) {
  mtrt_communicator_t communicators[2];
  expectError("in_process size 0",
              mtrt_communicator_create_in_process(0, communicators),
              MTRT_STATUS_INVALID_ARGUMENT);
  expectError("in_process NULL", mtrt_communicator_create_in_process(2, NULL),
              MTRT_STATUS_INVALID_ARGUMENT);
  mtrt_communicator_t nccl = NULL;
  expectError("nccl NULL comm", mtrt_communicator_create_nccl(NULL, &nccl),
              MTRT_STATUS_INVALID_ARGUMENT);
  /* Never dereferenced: without NCCL or a GPU (CI) the library refuses it
   * first. */
  struct ncclComm *fake = (struct ncclComm *)(void *)communicators;
  expectError("nccl", mtrt_communicator_create_nccl(fake, &nccl),
              MTRT_STATUS_UNAVAILABLE);
  expectError("nccl NULL out", mtrt_communicator_create_nccl(fake, NULL),
              MTRT_STATUS_INVALID_ARGUMENT);
  int value = 0;
  expectError("rank NULL", mtrt_communicator_rank(NULL, &value),
              MTRT_STATUS_INVALID_ARGUMENT);
  expectError("size NULL", mtrt_communicator_size(NULL, &value),
              MTRT_STATUS_INVALID_ARGUMENT);
}

/* Creates a session with one option changed by `change`, expecting `code`. */
#define EXPECT_OPTION_ERROR(what, change, code)                                \
  do {                                                                         \
    mtrt_session_options_t o;                                                  \
    mtrt_session_options_initialize(&o);                                       \
    change;                                                                    \
    mtrt_session_t s = NULL;                                                   \
    expectError(what, mtrt_session_create(bundle, &o, &s), code);              \
    CHECK(s == NULL);                                                          \
  } while (0)

static void sessionCreateErrors(mtrt_bundle_t bundle, mtrt_bundle_t tp2,
                                mtrt_bundle_t evalOnly, mtrt_bundle_t pp2) {
  const mtrt_status_code_t invalid = MTRT_STATUS_INVALID_ARGUMENT;
  mtrt_session_options_t options;
  mtrt_session_options_initialize(&options);
  mtrt_session_t session = NULL;
  expectError("create NULL bundle", mtrt_session_create(NULL, &options, &session),
              invalid);
  expectError("create NULL options", mtrt_session_create(bundle, NULL, &session),
              invalid);
  expectError("create NULL out", mtrt_session_create(bundle, &options, NULL),
              invalid);
  EXPECT_OPTION_ERROR("struct_size", o.struct_size = 8, invalid);
  EXPECT_OPTION_ERROR("lr", o.lr = -1, invalid);
  EXPECT_OPTION_ERROR("lr nan", o.lr = nan(""), invalid);
  EXPECT_OPTION_ERROR("min_lr", o.min_lr = 1, invalid);
  EXPECT_OPTION_ERROR("lr_warmup_init", o.lr_warmup_init = 1, invalid);
  EXPECT_OPTION_ERROR("decay style", o.lr_decay_style = (mtrt_lr_decay_style_t)7,
                      invalid);
  EXPECT_OPTION_ERROR("warmup", o.lr_warmup_iters = -1, invalid);
  EXPECT_OPTION_ERROR("decay iters",
                      (o.lr_decay_style = MTRT_LR_DECAY_COSINE,
                       o.lr_warmup_iters = 10, o.lr_decay_iters = 10),
                      invalid);
  EXPECT_OPTION_ERROR("weight_decay", o.weight_decay = -0.1, invalid);
  EXPECT_OPTION_ERROR("beta1", o.adam_beta1 = 1, invalid);
  EXPECT_OPTION_ERROR("beta2", o.adam_beta2 = -0.5, invalid);
  EXPECT_OPTION_ERROR("eps", o.adam_eps = 0, invalid);
  EXPECT_OPTION_ERROR("clip_grad", o.clip_grad = -1, invalid);
  EXPECT_OPTION_ERROR("threads", o.threads = -1, invalid);
  EXPECT_OPTION_ERROR("device", o.device = -1, invalid);
  EXPECT_OPTION_ERROR("backend", o.backend = (mtrt_backend_t)7, invalid);
  /* Built without CUDA, or with it on a machine without a GPU. */
  EXPECT_OPTION_ERROR("cuda", (o.backend = MTRT_BACKEND_CUDA, o.device = 64),
                      MTRT_STATUS_UNAVAILABLE);

  mtrt_communicator_t world[3];
  MUST(mtrt_communicator_create_in_process(2, world));
  EXPECT_OPTION_ERROR("communicator for one rank", o.communicator = world[0],
                      invalid);
  expectError("several ranks without communicator",
              mtrt_session_create(tp2, &options, &session),
              MTRT_STATUS_FAILED_PRECONDITION);
  mtrt_communicator_release(world[0]);
  mtrt_communicator_release(world[1]);
  MUST(mtrt_communicator_create_in_process(3, world));
  options.communicator = world[0];
  expectError("world of another size",
              mtrt_session_create(tp2, &options, &session), invalid);
  for (int r = 0; r < 3; ++r)
    mtrt_communicator_release(world[r]);
  options.communicator = NULL;
  expectError("no train_step", mtrt_session_create(evalOnly, &options, &session),
              MTRT_STATUS_NOT_FOUND);
  expectError("pipeline stages without communicator",
              mtrt_session_create(pp2, &options, &session),
              MTRT_STATUS_FAILED_PRECONDITION);
}

static void batchErrors(mtrt_session_t session) {
  const mtrt_status_code_t invalid = MTRT_STATUS_INVALID_ARGUMENT;
  int64_t rows, cols;
  mtrt_dtype_t dtype;
  expectError("batch_info NULL", mtrt_session_batch_info(NULL, &rows, &cols, &dtype),
              invalid);
  expectError("batch_info NULL out",
              mtrt_session_batch_info(session, &rows, NULL, &dtype), invalid);

  double loss = 0;
  mtrt_step_metrics_t metrics = {0};
  metrics.struct_size = sizeof(metrics);
  expectError("accumulate without batch", mtrt_session_accumulate(session, &loss),
              MTRT_STATUS_FAILED_PRECONDITION);
  expectError("eval without batch", mtrt_session_eval_step(session, &loss),
              MTRT_STATUS_FAILED_PRECONDITION);
  expectError("apply without accumulate", mtrt_session_apply(session, &metrics),
              MTRT_STATUS_FAILED_PRECONDITION);

  mtrt_tensor_t t = batch(tokens), l = batch(labels);
  expectError("set_batch NULL", mtrt_session_set_batch(session, NULL, &l,
                                                       MTRT_BATCH_COPY),
              invalid);
  expectError("set_batch mode",
              mtrt_session_set_batch(session, &t, &l, (mtrt_batch_mode_t)5),
              invalid);
  mtrt_tensor_t bad = batch(tokens);
  bad.shape[1] = 64;
  expectError("set_batch shape",
              mtrt_session_set_batch(session, &bad, &l, MTRT_BATCH_COPY), invalid);
  bad = batch(tokens);
  bad.dtype = MTRT_DTYPE_F32;
  expectError("set_batch dtype",
              mtrt_session_set_batch(session, &t, &bad, MTRT_BATCH_COPY), invalid);
  bad.dtype = (mtrt_dtype_t)42;
  expectError("set_batch unknown dtype",
              mtrt_session_set_batch(session, &bad, &l, MTRT_BATCH_COPY), invalid);
  static int64_t wide[kTokens];
  mtrt_tensor_t wideTokens = hostTensor(wide, MTRT_DTYPE_I64, 8, 128);
  expectError("set_batch bind i64",
              mtrt_session_set_batch(session, &wideTokens, &l, MTRT_BATCH_BIND),
              invalid);
  wide[kTokens - 1] = (int64_t)1 << 40;
  expectError("set_batch i64 overflow",
              mtrt_session_set_batch(session, &wideTokens, &l, MTRT_BATCH_COPY),
              MTRT_STATUS_OUT_OF_RANGE);
  bad = batch(tokens);
  bad.backend = MTRT_BACKEND_CUDA;
  expectError("set_batch device memory",
              mtrt_session_set_batch(session, &bad, &l, MTRT_BATCH_BIND), invalid);
  bad = batch(NULL);
  expectError("set_batch NULL data",
              mtrt_session_set_batch(session, &t, &bad, MTRT_BATCH_COPY), invalid);

  /* A token outside the vocabulary (256 bytes). */
  tokens[5] = 300;
  MUST(mtrt_session_set_batch(session, &t, &l, MTRT_BATCH_BIND));
  expectError("accumulate id out of range", mtrt_session_accumulate(session, &loss),
              MTRT_STATUS_OUT_OF_RANGE);
  expectError("eval id out of range", mtrt_session_eval_step(session, &loss),
              MTRT_STATUS_OUT_OF_RANGE);
  tokens[5] = 0;

  expectError("accumulate NULL", mtrt_session_accumulate(NULL, &loss), invalid);
  expectError("eval NULL out", mtrt_session_eval_step(session, NULL), invalid);
  mtrt_step_metrics_t small = {0};
  expectError("apply struct_size", mtrt_session_apply(session, &small), invalid);
  expectError("train_step struct_size", mtrt_session_train_step(session, &small),
              invalid);
  expectError("metrics struct_size", mtrt_session_metrics(session, &small),
              invalid);
  expectError("metrics NULL", mtrt_session_metrics(session, NULL), invalid);
  expectError("train_step NULL", mtrt_session_train_step(NULL, &metrics), invalid);
  expectError("apply NULL", mtrt_session_apply(NULL, &metrics), invalid);
  void *stream = NULL;
  expectError("cuda_stream on host", mtrt_session_cuda_stream(session, &stream),
              MTRT_STATUS_FAILED_PRECONDITION);
}

static void parameterErrors(mtrt_session_t session) {
  const mtrt_status_code_t invalid = MTRT_STATUS_INVALID_ARGUMENT;
  size_t count = 0;
  expectError("parameter_count NULL", mtrt_session_parameter_count(session, NULL),
              invalid);
  const char *name = NULL;
  expectError("parameter_name index",
              mtrt_session_parameter_name(session, 1000, &name),
              MTRT_STATUS_OUT_OF_RANGE);
  mtrt_tensor_t info;
  expectError("parameter_info unknown",
              mtrt_session_parameter_info(session, "transformer.nope", &info),
              MTRT_STATUS_NOT_FOUND);
  expectError("parameter_info NULL name",
              mtrt_session_parameter_info(session, NULL, &info), invalid);
  MUST(mtrt_session_parameter_count(session, &count));
  const char *bias = "transformer.ln_f.bias";
  static float values[256];
  MUST(mtrt_session_parameter_info(session, bias, &info));
  info.data = values;
  mtrt_tensor_t bad = info;
  bad.shape[0] = 3;
  expectError("parameter_get shape", mtrt_session_parameter_get(session, bias, &bad),
              invalid);
  bad = info;
  bad.dtype = MTRT_DTYPE_F64;
  expectError("parameter_set dtype", mtrt_session_parameter_set(session, bias, &bad),
              invalid);
  bad = info;
  bad.data = NULL;
  expectError("parameter_get NULL data",
              mtrt_session_parameter_get(session, bias, &bad), invalid);
  bad = info;
  bad.backend = MTRT_BACKEND_CUDA;
  expectError("parameter_set device memory",
              mtrt_session_parameter_set(session, bias, &bad), invalid);
  expectError("parameter_view NULL", mtrt_session_parameter_view(session, bias, NULL),
              invalid);
  expectError("parameter_get NULL", mtrt_session_parameter_get(session, bias, NULL),
              invalid);

  /* A parameter set to infinity makes the gradient norm non-finite: the
   * step is refused and nothing is updated. */
  values[0] = (float)INFINITY;
  MUST(mtrt_session_parameter_set(session, bias, &info));
  mtrt_tensor_t t = batch(tokens), l = batch(labels);
  MUST(mtrt_session_set_batch(session, &t, &l, MTRT_BATCH_COPY));
  mtrt_step_metrics_t metrics = {0};
  metrics.struct_size = sizeof(metrics);
  expectError("non-finite gradient norm", mtrt_session_train_step(session, &metrics),
              MTRT_STATUS_ABORTED);
}

static void checkpointErrors(mtrt_bundle_t bundle, mtrt_session_t session,
                             mtrt_session_t trainOnly, const char *scratch) {
  char path[4096];
  expectError("save NULL", mtrt_session_save_checkpoint(session, NULL),
              MTRT_STATUS_INVALID_ARGUMENT);
  expectError("load NULL", mtrt_session_load_checkpoint(NULL, scratch),
              MTRT_STATUS_INVALID_ARGUMENT);
  snprintf(path, sizeof(path), "%s/a-file", scratch);
  writeFile(path, "x");
  snprintf(path, sizeof(path), "%s/a-file/checkpoint", scratch);
  mtrt_status_t status = mtrt_session_save_checkpoint(session, path);
  expectError("save under a file", status, mtrt_status_code(status));
  CHECK(status != NULL);
  snprintf(path, sizeof(path), "%s/empty", scratch);
  expectError("load nothing", mtrt_session_load_checkpoint(session, path),
              MTRT_STATUS_NOT_FOUND);

  snprintf(path, sizeof(path), "%s/gpt", scratch);
  MUST(mtrt_session_save_checkpoint(session, path));
  expectError("save the same iteration again",
              mtrt_session_save_checkpoint(session, path),
              MTRT_STATUS_ALREADY_EXISTS);
  mtrt_session_options_t options;
  mtrt_session_options_initialize(&options);
  options.lr = 1e-3;
  mtrt_session_t other = NULL;
  MUST(mtrt_session_create(bundle, &options, &other));
  expectError("load with another learning rate",
              mtrt_session_load_checkpoint(other, path),
              MTRT_STATUS_INVALID_ARGUMENT);
  mtrt_session_release(other);

  snprintf(path, sizeof(path), "%s/other-model", scratch);
  MUST(mtrt_session_save_checkpoint(trainOnly, path));
  expectError("load another model", mtrt_session_load_checkpoint(session, path),
              MTRT_STATUS_INVALID_ARGUMENT);
  snprintf(path, sizeof(path), "%s/other-model/iter_0000000/checkpoint.json",
           scratch);
  writeFile(path, "{not json");
  snprintf(path, sizeof(path), "%s/other-model", scratch);
  expectError("load a damaged manifest",
              mtrt_session_load_checkpoint(trainOnly, path),
              MTRT_STATUS_DATA_LOSS);
  double loss = 0;
  static int32_t small[8];
  mtrt_tensor_t t = hostTensor(small, MTRT_DTYPE_I32, 2, 4);
  MUST(mtrt_session_set_batch(trainOnly, &t, &t, MTRT_BATCH_COPY));
  expectError("no eval_step", mtrt_session_eval_step(trainOnly, &loss),
              MTRT_STATUS_NOT_FOUND);
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr,
            "usage: %s TINY.mtb TINY-TP2.mtb TRAIN-ONLY.mtb EVAL-ONLY.mtb "
            "PP2.mtb SCRATCH_DIR\n",
            argv[0]);
    return 2;
  }
  for (int i = 0; i < kTokens; ++i)
    tokens[i] = labels[i] = 'a' + i % 26;
  bundleErrors(argv[6]);
  communicatorErrors();

  mtrt_bundle_t bundles[5];
  for (int i = 0; i < 5; ++i)
    MUST(mtrt_bundle_load(argv[i + 1], &bundles[i]));
  sessionCreateErrors(bundles[0], bundles[1], bundles[3], bundles[4]);

  mtrt_session_options_t options;
  mtrt_session_options_initialize(&options);
  mtrt_session_t session = NULL, trainOnly = NULL;
  MUST(mtrt_session_create(bundles[0], &options, &session));
  MUST(mtrt_session_create(bundles[2], &options, &trainOnly));
  batchErrors(session);
  checkpointErrors(bundles[0], session, trainOnly, argv[6]);
  parameterErrors(session);

  mtrt_session_release(trainOnly);
  mtrt_session_release(session);
  for (int i = 0; i < 5; ++i)
    mtrt_bundle_release(bundles[i]);
  return finish("status_c_test");
}
