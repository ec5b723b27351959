/* Drives the whole C API from C on the host backend with the tiny GPT:
 * bundles, sessions, batches (copied and bound, i32 and i64), train_step,
 * accumulate/apply, eval_step, metrics, parameters (info, get, set, view),
 * checkpoints, two in-process ranks of a tensor-parallel Llama against
 * one rank, and fp16 loss scaling.
 * Usage: mtrt-session-c-test GPT.mtb LLAMA.mtb LLAMA-TP2.mtb CORPUS
 *        SCRATCH_DIR GPT-FP16.mtb */
#include "c_test_support.h"

#include <math.h>
#include <stddef.h>
#include <string.h>
#include <threads.h>

enum { kMaxTokens = 8 * 128 };
static unsigned char *corpus;
static long corpusSize;
static int64_t batchRows, batchCols;

/* Batch k of the corpus: consecutive windows of seq_length + 1 bytes. */
static void makeBatch(int k, int32_t *tokens, int32_t *labels) {
  for (int64_t i = 0; i < batchRows * batchCols; ++i) {
    long offset = ((long)k * batchRows * batchCols + (long)i) % (corpusSize - 1);
    tokens[i] = corpus[offset];
    labels[i] = corpus[offset + 1];
  }
}

static mtrt_session_options_t trainingOptions(void) {
  mtrt_session_options_t options;
  mtrt_session_options_initialize(&options);
  options.lr = 1e-3;
  options.threads = 2;
  return options;
}

static void setBatch(mtrt_session_t session, int k) {
  /* One buffer per thread: the ranks' threads set their batches at once. */
  static _Thread_local int32_t tokens[kMaxTokens], labels[kMaxTokens];
  makeBatch(k, tokens, labels);
  mtrt_tensor_t t = hostTensor(tokens, MTRT_DTYPE_I32, batchRows, batchCols);
  mtrt_tensor_t l = hostTensor(labels, MTRT_DTYPE_I32, batchRows, batchCols);
  MUST(mtrt_session_set_batch(session, &t, &l, MTRT_BATCH_COPY));
}

static mtrt_step_metrics_t newMetrics(void) {
  mtrt_step_metrics_t metrics = {0};
  metrics.struct_size = sizeof(metrics);
  return metrics;
}

/* Fills `out` (of the parameter's size) with parameter `name`. */
static float *getParameter(mtrt_session_t session, const char *name,
                           int64_t *out_count) {
  mtrt_tensor_t info;
  MUST(mtrt_session_parameter_info(session, name, &info));
  int64_t count = 1;
  for (int d = 0; d < info.rank; ++d)
    count *= info.shape[d];
  float *data = malloc(sizeof(float) * (size_t)count);
  info.data = data;
  MUST(mtrt_session_parameter_get(session, name, &info));
  *out_count = count;
  return data;
}

/* Two ranks of the TP2 bundle, each on its own thread. */
typedef struct RankRun {
  mtrt_bundle_t bundle;
  mtrt_communicator_t communicator;
  double loss;
  int64_t upRows;
  mtrt_status_t status;
} RankRun;

static const char *const kSplitParameter = "model.layers.0.mlp.up_proj.weight";

/* The first dimension of parameter `name` in `session`. */
static int64_t rows(mtrt_session_t session, const char *name) {
  mtrt_tensor_t info;
  MUST(mtrt_session_parameter_info(session, name, &info));
  return info.shape[0];
}

static int runRank(void *argument) {
  RankRun *run = argument;
  mtrt_session_options_t options = trainingOptions();
  options.communicator = run->communicator;
  mtrt_session_t session = NULL;
  run->status = mtrt_session_create(run->bundle, &options, &session);
  if (run->status)
    return 1;
  setBatch(session, 0);
  mtrt_step_metrics_t metrics = newMetrics();
  run->status = mtrt_session_train_step(session, &metrics);
  run->loss = metrics.loss;
  run->upRows = rows(session, kSplitParameter);
  mtrt_session_release(session);
  return 0;
}

/* Two pipeline ranks of the PP2 Llama, each on its own thread: one optimizer
 * step over two micro-batches, whose schedule runs at apply. */
typedef struct PipelineRun {
  mtrt_bundle_t bundle;
  mtrt_communicator_t communicator;
  mtrt_step_metrics_t metrics;
  double accumulatedLoss, evalLoss;
  mtrt_status_t status, extra, foreign;
} PipelineRun;

static int runPipelineRank(void *argument) {
  PipelineRun *run = argument;
  mtrt_session_options_t options = trainingOptions();
  options.communicator = run->communicator;
  mtrt_session_t session = NULL;
  run->status = mtrt_session_create(run->bundle, &options, &session);
  if (run->status)
    return 1;
  for (int k = 0; k < 2 && !run->status; ++k) {
    setBatch(session, k);
    run->status = mtrt_session_accumulate(session, &run->accumulatedLoss);
  }
  /* A third micro-batch does not fit the compiled schedule. */
  if (!run->status)
    run->extra = mtrt_session_accumulate(session, NULL);
  run->metrics = newMetrics();
  if (!run->status)
    run->status = mtrt_session_apply(session, &run->metrics);
  setBatch(session, 0);
  if (!run->status)
    run->status = mtrt_session_eval_step(session, &run->evalLoss);
  /* Rank 0 holds the first stage, not the final norm. */
  mtrt_tensor_t info;
  run->foreign = mtrt_session_parameter_info(session, "model.norm.weight",
                                             &info);
  mtrt_session_release(session);
  return 0;
}

/* fp16 loss scaling (megatron-train --fp16's) on the fp16 tiny GPT without
 * dropout (skipped steps advance the micro-batch counter that keys it). A
 * dynamic scale from 2^130 (inf in float) overflows: those steps skip their
 * update, and the scale halves until the gradients are finite. Scaling by a
 * power of two is exact, so the first step that trains equals the first step
 * of a session with the static scale 1 bit for bit, and so do the next. A
 * checkpoint resumes the scaler's state. Loss-scaling options on an fp32
 * bundle are refused. */
static void fp16LossScaling(const char *path, mtrt_bundle_t fp32,
                            const char *scratch) {
  mtrt_bundle_t bundle = NULL;
  MUST(mtrt_bundle_load(path, &bundle));
  mtrt_session_options_t dynamic = trainingOptions();
  dynamic.initial_loss_scale = ldexp(1.0, 130);
  dynamic.loss_scale_window = 4;
  mtrt_session_options_t unit = trainingOptions();
  unit.loss_scale = 1.0;
  mtrt_session_t scaled = NULL, plain = NULL;
  MUST(mtrt_session_create(bundle, &dynamic, &scaled));
  MUST(mtrt_session_create(bundle, &unit, &plain));

  mtrt_step_metrics_t metrics = newMetrics();
  int skipped = 0, nanNorms = 1;
  setBatch(scaled, 0);
  for (;;) {
    MUST(mtrt_session_train_step(scaled, &metrics));
    if (!metrics.skipped)
      break;
    ++skipped;
    nanNorms &= isnan(metrics.grad_norm);
    if (skipped == 40)
      break;
  }
  printf("fp16: %d step(s) skipped from 2^130 (grad norm NaN: %s), the first "
         "update at loss scale 2^%d\n",
         skipped, nanNorms ? "yes" : "NO", (int)log2(metrics.loss_scale));
  int same = 1;
  mtrt_step_metrics_t expected = newMetrics();
  setBatch(plain, 0);
  MUST(mtrt_session_train_step(plain, &expected));
  same &= metrics.loss == expected.loss &&
          metrics.grad_norm == expected.grad_norm;
  for (int step = 1; step < 4; ++step) {
    setBatch(scaled, step);
    setBatch(plain, step);
    MUST(mtrt_session_train_step(scaled, &metrics));
    MUST(mtrt_session_train_step(plain, &expected));
    same &= !metrics.skipped && metrics.loss == expected.loss &&
            metrics.grad_norm == expected.grad_norm &&
            metrics.learning_rate == expected.learning_rate;
  }
  CHECK(expected.loss_scale == 1.0 && !expected.skipped);
  printf("fp16: 4 updates equal the static scale 1's bit for bit: %s\n",
         same ? "yes" : "NO");

  /* Saved, then resumed in a fresh session: the same scales and losses. */
  char directory[4096];
  snprintf(directory, sizeof(directory), "%s/fp16-checkpoint", scratch);
  MUST(mtrt_session_save_checkpoint(scaled, directory));
  mtrt_session_t restored = NULL;
  MUST(mtrt_session_create(bundle, &dynamic, &restored));
  MUST(mtrt_session_load_checkpoint(restored, directory));
  int resumed = 1;
  mtrt_step_metrics_t again = newMetrics();
  for (int step = 4; step < 10; ++step) {
    setBatch(scaled, step);
    setBatch(restored, step);
    MUST(mtrt_session_train_step(scaled, &metrics));
    MUST(mtrt_session_train_step(restored, &again));
    resumed &= metrics.loss == again.loss &&
               metrics.loss_scale == again.loss_scale &&
               metrics.skipped == again.skipped &&
               metrics.iteration == again.iteration &&
               metrics.learning_rate == again.learning_rate;
  }
  printf("fp16: checkpoint resumed to iteration %lld at loss scale 2^%d: same "
         "losses and scales: %s\n",
         (long long)again.iteration, (int)log2(again.loss_scale),
         resumed ? "yes" : "NO");
  mtrt_session_release(restored);
  mtrt_session_release(plain);
  mtrt_session_release(scaled);

  /* A caller of the first version, whose structs end before the loss-scaling
   * fields: they take their defaults (dynamic from 2^32), and its metrics
   * struct gets the fields it has. */
  mtrt_session_options_t first = trainingOptions();
  first.struct_size = offsetof(mtrt_session_options_t, loss_scale);
  first.initial_loss_scale = 1.0; /* past its struct: not read */
  mtrt_session_t old = NULL;
  MUST(mtrt_session_create(bundle, &first, &old));
  setBatch(old, 0);
  mtrt_step_metrics_t oldMetrics = newMetrics();
  oldMetrics.struct_size = offsetof(mtrt_step_metrics_t, loss_scale);
  oldMetrics.loss_scale = -1;
  MUST(mtrt_session_train_step(old, &oldMetrics));
  mtrt_step_metrics_t current = newMetrics();
  MUST(mtrt_session_metrics(old, &current));
  printf("fp16: first-version structs: loss scale 2^%d (the default), the "
         "short metrics left past their size: %s\n",
         (int)log2(current.loss_scale),
         oldMetrics.loss_scale == -1 && oldMetrics.iteration == 1 ? "yes"
                                                                 : "NO");
  mtrt_session_release(old);

  mtrt_session_t refused = NULL;
  expectError("fp16: loss_scale on an fp32 bundle",
              mtrt_session_create(fp32, &unit, &refused),
              MTRT_STATUS_INVALID_ARGUMENT);
  mtrt_session_options_t bad = trainingOptions();
  bad.min_loss_scale = 0;
  expectError("fp16: min_loss_scale 0",
              mtrt_session_create(bundle, &bad, &refused),
              MTRT_STATUS_INVALID_ARGUMENT);
  mtrt_bundle_release(bundle);
}

/* A mixture of experts (tiny-moe: 2 MoE layers, moe_aux_loss_coeff 0.01,
 * moe_z_loss_coeff 0.001): the step's metrics hold Megatron-LM's lm loss
 * and its logged MoE losses, which a dense bundle's (`dense`) leave NaN. */
static void moeLosses(const char *path, mtrt_bundle_t dense) {
  mtrt_bundle_t bundle = NULL;
  MUST(mtrt_bundle_load(path, &bundle));
  mtrt_session_options_t options = trainingOptions();
  mtrt_session_t session = NULL;
  MUST(mtrt_session_create(bundle, &options, &session));
  setBatch(session, 0);
  mtrt_step_metrics_t moe = newMetrics();
  MUST(mtrt_session_train_step(session, &moe));
  mtrt_session_release(session);
  double aux = 2 * (0.01 * moe.load_balancing_loss + 0.001 * moe.z_loss);
  printf("moe: loss %.4f = lm loss %.4f + 2 x (0.01 x load_balancing_loss "
         "%.4f + 0.001 x z_loss %.4f): %s\n",
         moe.loss, moe.lm_loss, moe.load_balancing_loss, moe.z_loss,
         fabs(moe.lm_loss + aux - moe.loss) <= 1e-5 * moe.loss ? "yes" : "NO");
  MUST(mtrt_session_create(dense, &options, &session));
  setBatch(session, 0);
  mtrt_step_metrics_t gpt = newMetrics();
  MUST(mtrt_session_train_step(session, &gpt));
  mtrt_session_release(session);
  printf("moe: a dense bundle's lm loss is its loss, no MoE losses: %s\n",
         gpt.lm_loss == gpt.loss && isnan(gpt.load_balancing_loss) &&
                 isnan(gpt.z_loss)
             ? "yes"
             : "NO");
  mtrt_bundle_release(bundle);
}

int main(int argc, char **argv) {
  if (argc != 9) {
    fprintf(stderr,
            "usage: %s GPT.mtb LLAMA.mtb LLAMA-TP2.mtb CORPUS SCRATCH_DIR "
            "GPT-FP16.mtb LLAMA-PP2.mtb MOE.mtb\n",
            argv[0]);
    return 2;
  }
  FILE *file = fopen(argv[4], "rb");
  CHECK(file != NULL);
  if (!file)
    return 1;
  fseek(file, 0, SEEK_END);
  corpusSize = ftell(file);
  fseek(file, 0, SEEK_SET);
  corpus = malloc((size_t)corpusSize);
  CHECK(fread(corpus, 1, (size_t)corpusSize, file) == (size_t)corpusSize);
  fclose(file);

  mtrt_version_t version = mtrt_version();
  printf("mtrt %s, header %d.%d.%d\n", mtrt_version_string(),
         MTRT_VERSION_MAJOR, MTRT_VERSION_MINOR, MTRT_VERSION_PATCH);
  CHECK(version.major == MTRT_VERSION_MAJOR);

  mtrt_bundle_t bundle = NULL;
  MUST(mtrt_bundle_load(argv[1], &bundle));
  int ranks = 0;
  MUST(mtrt_bundle_rank_count(bundle, &ranks));
  printf("bundle %s: %d rank(s)\n", mtrt_bundle_name(bundle), ranks);

  mtrt_session_options_t options = trainingOptions();
  mtrt_session_t session = NULL;
  MUST(mtrt_session_create(bundle, &options, &session));
  mtrt_dtype_t idType;
  MUST(mtrt_session_batch_info(session, &batchRows, &batchCols, &idType));
  printf("batch: [%lld, %lld] %s\n", (long long)batchRows,
         (long long)batchCols, mtrt_dtype_name(idType));
  CHECK(batchRows * batchCols <= kMaxTokens && idType == MTRT_DTYPE_I32);

  size_t parameterCount = 0;
  MUST(mtrt_session_parameter_count(session, &parameterCount));
  printf("parameters: %zu\n", parameterCount);
  for (size_t i = 0; i < parameterCount; i += parameterCount - 1) {
    const char *name;
    mtrt_tensor_t info;
    MUST(mtrt_session_parameter_name(session, i, &name));
    MUST(mtrt_session_parameter_info(session, name, &info));
    printf("parameter %zu: %s [%lld", i, name, (long long)info.shape[0]);
    for (int d = 1; d < info.rank; ++d)
      printf(", %lld", (long long)info.shape[d]);
    printf("] %s\n", mtrt_dtype_name(info.dtype));
    CHECK(info.data == NULL && info.backend == MTRT_BACKEND_HOST);
  }

  /* The untrained model predicts bytes about uniformly: loss near ln 256. */
  setBatch(session, 0);
  double initialLoss = 0;
  MUST(mtrt_session_eval_step(session, &initialLoss));
  printf("eval loss before training: %.3f\n", initialLoss);
  CHECK(fabs(initialLoss - log(256.0)) < 0.1);

  /* Bound and i64 batches give the same loss, bit for bit. */
  static int32_t tokens[kMaxTokens], labels[kMaxTokens];
  static int64_t tokens64[kMaxTokens], labels64[kMaxTokens];
  makeBatch(0, tokens, labels);
  for (int64_t i = 0; i < batchRows * batchCols; ++i) {
    tokens64[i] = tokens[i];
    labels64[i] = labels[i];
  }
  mtrt_tensor_t t = hostTensor(tokens, MTRT_DTYPE_I32, batchRows, batchCols);
  mtrt_tensor_t l = hostTensor(labels, MTRT_DTYPE_I32, batchRows, batchCols);
  MUST(mtrt_session_set_batch(session, &t, &l, MTRT_BATCH_BIND));
  double boundLoss = 0;
  MUST(mtrt_session_eval_step(session, &boundLoss));
  t = hostTensor(tokens64, MTRT_DTYPE_I64, batchRows, batchCols);
  l = hostTensor(labels64, MTRT_DTYPE_I64, batchRows, batchCols);
  MUST(mtrt_session_set_batch(session, &t, &l, MTRT_BATCH_COPY));
  double convertedLoss = 0;
  MUST(mtrt_session_eval_step(session, &convertedLoss));
  printf("bound batch: %s, i64 batch: %s\n",
         boundLoss == initialLoss ? "same loss" : "DIFFERENT loss",
         convertedLoss == initialLoss ? "same loss" : "DIFFERENT loss");

  /* Ten optimizer steps, one micro-batch each; a twin session takes the
   * same steps as accumulate + apply and must match bit for bit. */
  mtrt_session_t twin = NULL;
  MUST(mtrt_session_create(bundle, &options, &twin));
  double firstLoss = 0, lastLoss = 0;
  int twinMatches = 1;
  for (int step = 0; step < 10; ++step) {
    setBatch(session, step);
    mtrt_step_metrics_t metrics = newMetrics();
    MUST(mtrt_session_train_step(session, &metrics));
    printf("iteration %lld: loss %.4f, grad norm %.4f, lr %.1e, %lld "
           "micro-batch(es)\n",
           (long long)metrics.iteration, metrics.loss, metrics.grad_norm,
           metrics.learning_rate, (long long)metrics.micro_batches);
    if (step == 0)
      firstLoss = metrics.loss;
    lastLoss = metrics.loss;
    CHECK(metrics.iteration == step + 1 && metrics.learning_rate == 1e-3);

    setBatch(twin, step);
    double loss = 0;
    mtrt_step_metrics_t twinMetrics = newMetrics();
    MUST(mtrt_session_accumulate(twin, &loss));
    MUST(mtrt_session_apply(twin, &twinMetrics));
    twinMatches &= loss == metrics.loss && twinMetrics.loss == metrics.loss &&
                   twinMetrics.grad_norm == metrics.grad_norm;
  }
  printf("accumulate + apply equals train_step: %s\n",
         twinMatches ? "yes" : "NO");
  CHECK(twinMatches && lastLoss < firstLoss);
  mtrt_step_metrics_t last = newMetrics();
  MUST(mtrt_session_metrics(session, &last));
  CHECK(last.iteration == 10 && last.loss == lastLoss);

  /* Two micro-batches into one step: their mean loss. */
  double loss0 = 0, loss1 = 0;
  setBatch(twin, 10);
  MUST(mtrt_session_accumulate(twin, &loss0));
  setBatch(twin, 11);
  MUST(mtrt_session_accumulate(twin, &loss1));
  mtrt_step_metrics_t two = newMetrics();
  MUST(mtrt_session_apply(twin, &two));
  printf("two micro-batches: iteration %lld, %lld micro-batches, loss is "
         "their mean: %s\n",
         (long long)two.iteration, (long long)two.micro_batches,
         two.loss == (loss0 + loss1) / 2 ? "yes" : "NO");

  setBatch(session, 0);
  double trainedLoss = 0;
  MUST(mtrt_session_eval_step(session, &trainedLoss));
  printf("eval loss after training is lower: %s\n",
         trainedLoss < initialLoss - 0.5 ? "yes" : "NO");

  /* Parameters: a view is the session's storage; get copies it; set writes
   * it. */
  const char *name = "transformer.ln_f.bias";
  int64_t count = 0;
  float *values = getParameter(session, name, &count);
  mtrt_tensor_t view;
  MUST(mtrt_session_parameter_view(session, name, &view));
  printf("%s: view equals get: %s\n", name,
         memcmp(view.data, values, sizeof(float) * (size_t)count) == 0 ? "yes"
                                                                       : "NO");
  for (int64_t i = 0; i < count; ++i)
    values[i] = (float)i;
  mtrt_tensor_t source;
  MUST(mtrt_session_parameter_info(session, name, &source));
  source.data = values;
  MUST(mtrt_session_parameter_set(session, name, &source));
  printf("after set, the view reads it: %s\n",
         ((float *)view.data)[count - 1] == (float)(count - 1) ? "yes" : "NO");
  free(values);

  /* A checkpoint of the twin (parameters, AdamW's moments, the step and
   * micro-batch counters) resumes in a fresh session exactly: the next steps
   * give the twin's losses and parameters bit for bit. */
  char directory[4096];
  snprintf(directory, sizeof(directory), "%s/checkpoint", argv[5]);
  MUST(mtrt_session_save_checkpoint(twin, directory));
  mtrt_session_t restored = NULL;
  MUST(mtrt_session_create(bundle, &options, &restored));
  MUST(mtrt_session_load_checkpoint(restored, directory));
  int sameLosses = 1;
  mtrt_step_metrics_t resumed = newMetrics();
  for (int step = 12; step < 15; ++step) {
    mtrt_step_metrics_t expected = newMetrics();
    setBatch(twin, step);
    MUST(mtrt_session_train_step(twin, &expected));
    setBatch(restored, step);
    MUST(mtrt_session_train_step(restored, &resumed));
    sameLosses &= expected.loss == resumed.loss &&
                  expected.grad_norm == resumed.grad_norm &&
                  expected.iteration == resumed.iteration;
  }
  int same = 1;
  for (size_t i = 0; i < parameterCount; ++i) {
    const char *parameter;
    int64_t n = 0, m = 0;
    MUST(mtrt_session_parameter_name(twin, i, &parameter));
    float *a = getParameter(twin, parameter, &n);
    float *b = getParameter(restored, parameter, &m);
    same &= n == m && memcmp(a, b, sizeof(float) * (size_t)n) == 0;
    free(a);
    free(b);
  }
  printf("checkpoint at iteration 11, resumed to %lld: same losses: %s, same "
         "parameters: %s\n",
         (long long)resumed.iteration, sameLosses ? "yes" : "NO",
         same ? "yes" : "NO");
  mtrt_session_release(restored);
  mtrt_session_release(twin);
  mtrt_session_release(session);

  /* Two in-process ranks of the tensor-parallel Llama equal one rank. */
  mtrt_bundle_t llama = NULL, tp2 = NULL;
  MUST(mtrt_bundle_load(argv[2], &llama));
  MUST(mtrt_bundle_load(argv[3], &tp2));
  MUST(mtrt_bundle_rank_count(tp2, &ranks));
  mtrt_communicator_t communicators[2];
  MUST(mtrt_communicator_create_in_process(2, communicators));
  int rank = -1, size = -1;
  MUST(mtrt_communicator_rank(communicators[1], &rank));
  MUST(mtrt_communicator_size(communicators[1], &size));
  RankRun runs[2] = {{tp2, communicators[0], 0, 0, NULL},
                     {tp2, communicators[1], 0, 0, NULL}};
  thrd_t threads[2];
  for (int r = 0; r < 2; ++r)
    CHECK(thrd_create(&threads[r], runRank, &runs[r]) == thrd_success);
  for (int r = 0; r < 2; ++r)
    thrd_join(threads[r], NULL);
  for (int r = 0; r < 2; ++r) {
    CHECK(runs[r].status == NULL);
    if (runs[r].status)
      fprintf(stderr, "rank %d: %s\n", r, mtrt_status_message(runs[r].status));
    mtrt_status_free(runs[r].status);
    mtrt_communicator_release(communicators[r]);
  }
  mtrt_session_t one = NULL;
  MUST(mtrt_session_create(llama, &options, &one));
  setBatch(one, 0);
  mtrt_step_metrics_t oneRank = newMetrics();
  MUST(mtrt_session_train_step(one, &oneRank));
  printf("tp2: %d ranks, communicator %d of %d, %s has %lld rows on a rank "
         "and %lld on one; loss equals one rank's within 1e-5: %s\n",
         ranks, rank, size, kSplitParameter, (long long)runs[0].upRows,
         (long long)rows(one, kSplitParameter),
         fabs(runs[0].loss - oneRank.loss) <= 1e-5 &&
                 fabs(runs[1].loss - oneRank.loss) <= 1e-5
             ? "yes"
             : "NO");
  mtrt_session_release(one);

  /* Two pipeline ranks equal one rank accumulating the same micro-batches:
   * the same ops in the same order, so the same bits. */
  mtrt_bundle_t pp2 = NULL;
  MUST(mtrt_bundle_load(argv[7], &pp2));
  MUST(mtrt_communicator_create_in_process(2, communicators));
  PipelineRun pipelineRuns[2];
  memset(pipelineRuns, 0, sizeof(pipelineRuns));
  for (int r = 0; r < 2; ++r) {
    pipelineRuns[r].bundle = pp2;
    pipelineRuns[r].communicator = communicators[r];
  }
  for (int r = 0; r < 2; ++r)
    CHECK(thrd_create(&threads[r], runPipelineRank, &pipelineRuns[r]) ==
          thrd_success);
  for (int r = 0; r < 2; ++r)
    thrd_join(threads[r], NULL);
  for (int r = 0; r < 2; ++r) {
    CHECK(pipelineRuns[r].status == NULL);
    if (pipelineRuns[r].status)
      fprintf(stderr, "pipeline rank %d: %s\n", r,
              mtrt_status_message(pipelineRuns[r].status));
    mtrt_status_free(pipelineRuns[r].status);
    mtrt_communicator_release(communicators[r]);
  }
  MUST(mtrt_session_create(llama, &options, &one));
  mtrt_step_metrics_t accumulated = newMetrics();
  for (int k = 0; k < 2; ++k) {
    setBatch(one, k);
    MUST(mtrt_session_accumulate(one, NULL));
  }
  MUST(mtrt_session_apply(one, &accumulated));
  setBatch(one, 0);
  double oneEval = 0;
  MUST(mtrt_session_eval_step(one, &oneEval));
  mtrt_session_release(one);
  int samePipeline = 1;
  for (int r = 0; r < 2; ++r)
    samePipeline &= pipelineRuns[r].metrics.loss == accumulated.loss &&
                    pipelineRuns[r].metrics.grad_norm ==
                        accumulated.grad_norm &&
                    pipelineRuns[r].evalLoss == oneEval;
  printf("pp2: %lld micro-batches, the loss of an accumulated one is NaN: "
         "%s; loss, grad norm and the next eval loss equal one rank's "
         "bit for bit: %s\n",
         (long long)pipelineRuns[0].metrics.micro_batches,
         isnan(pipelineRuns[0].accumulatedLoss) ? "yes" : "NO",
         samePipeline ? "yes" : "NO");
  printf("pp2: a third micro-batch: %s: %s\n",
         mtrt_status_code_string(mtrt_status_code(pipelineRuns[0].extra)),
         mtrt_status_message(pipelineRuns[0].extra));
  printf("pp2: %s: %s\n",
         mtrt_status_code_string(mtrt_status_code(pipelineRuns[0].foreign)),
         mtrt_status_message(pipelineRuns[0].foreign));
  for (int r = 0; r < 2; ++r) {
    mtrt_status_free(pipelineRuns[r].extra);
    mtrt_status_free(pipelineRuns[r].foreign);
  }
  mtrt_bundle_release(pp2);
  mtrt_bundle_release(tp2);
  mtrt_bundle_release(llama);
  fp16LossScaling(argv[6], bundle, argv[5]);
  moeLosses(argv[8], bundle);
  mtrt_bundle_release(bundle);
  free(corpus);
  return finish("session_c_test");
}
