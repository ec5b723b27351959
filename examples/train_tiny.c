/* Trains a compiled bundle from C through the mtrt C API on the CPU:
 * consecutive windows of a text file as byte tokens, one optimizer step per
 * micro-batch, the loss of each step printed.
 *
 *   megatron-compile models/tiny-gpt.yaml -o tiny.mtb
 *   build/bin/mtrt-train-tiny tiny.mtb data/corpus.txt 20
 */
#include "mtrt/mtrt.h"

#include <stdio.h>
#include <stdlib.h>

/* Prints the error, frees the status and exits. */
static void check(mtrt_status_t status, const char *what) {
  if (!status)
    return;
  fprintf(stderr, "%s: %s: %s\n", what,
          mtrt_status_code_string(mtrt_status_code(status)),
          mtrt_status_message(status));
  mtrt_status_free(status);
  exit(1);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s BUNDLE CORPUS ITERATIONS\n", argv[0]);
    return 2;
  }
  int iterations = atoi(argv[3]);
  FILE *file = fopen(argv[2], "rb");
  if (!file) {
    perror(argv[2]);
    return 1;
  }
  static unsigned char text[1 << 20];
  size_t size = fread(text, 1, sizeof(text), file);
  fclose(file);

  mtrt_bundle_t bundle = NULL;
  check(mtrt_bundle_load(argv[1], &bundle), "loading the bundle");
  mtrt_session_options_t options;
  mtrt_session_options_initialize(&options);
  options.lr = 1e-3;
  options.lr_decay_style = MTRT_LR_DECAY_COSINE;
  options.lr_decay_iters = iterations;
  options.min_lr = 1e-4;
  mtrt_session_t session = NULL;
  check(mtrt_session_create(bundle, &options, &session), "creating a session");
  /* The session holds its own reference to the bundle. */
  mtrt_bundle_release(bundle);

  int64_t rows = 0, cols = 0;
  mtrt_dtype_t dtype;
  check(mtrt_session_batch_info(session, &rows, &cols, &dtype), "batch info");
  size_t count = (size_t)(rows * cols);
  int64_t *tokens = malloc(count * sizeof(int64_t));
  int64_t *labels = malloc(count * sizeof(int64_t));
  /* Whatever the bundle's id type, i64 batches are converted on copy. */
  mtrt_tensor_t t = {0}, l = {0};
  t.data = tokens;
  l.data = labels;
  t.dtype = l.dtype = MTRT_DTYPE_I64;
  t.backend = l.backend = MTRT_BACKEND_HOST;
  t.rank = l.rank = 2;
  t.shape[0] = l.shape[0] = rows;
  t.shape[1] = l.shape[1] = cols;

  size_t offset = 0;
  for (int i = 0; i < iterations; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      if (offset + (size_t)cols + 1 > size)
        offset = 0;
      for (int64_t c = 0; c < cols; ++c) {
        tokens[r * cols + c] = text[offset + (size_t)c];
        labels[r * cols + c] = text[offset + (size_t)c + 1];
      }
      offset += (size_t)cols;
    }
    check(mtrt_session_set_batch(session, &t, &l, MTRT_BATCH_COPY),
          "setting the batch");
    mtrt_step_metrics_t m = {0};
    m.struct_size = sizeof(m);
    check(mtrt_session_train_step(session, &m), "training");
    printf("iteration %3lld | loss %.4f | grad norm %.3f | lr %.3e\n",
           (long long)m.iteration, m.loss, m.grad_norm, m.learning_rate);
  }
  free(tokens);
  free(labels);
  mtrt_session_release(session);
  return 0;
}
