/* Public C API of the mtrt runtime: statuses, versions, devices, bundles,
 * communicators and training sessions. */
#ifndef MTRT_MTRT_H
#define MTRT_MTRT_H

/*
 * Conventions (IREE's discipline):
 * - Names are mtrt_<noun>_<verb>; outputs come last and are named out_*.
 * - Every call that can fail returns an mtrt_status_t. NULL means success; a
 *   non-NULL status is owned by the caller and must be released with
 *   mtrt_status_free exactly once.
 * - On failure, out_* values are left zeroed (never half-written).
 * - No C++ types or exceptions cross this boundary.
 * - Unless a comment says otherwise, every function may be called from any
 *   thread at any time.
 */

#include <stddef.h>
#include <stdint.h>

/* The header version; the build parses these three lines, so keep the form.
 * The library you link may be newer or older: ask mtrt_version(). */
#define MTRT_VERSION_MAJOR 0
#define MTRT_VERSION_MINOR 1
#define MTRT_VERSION_PATCH 0

#if defined(_WIN32)
#if defined(MTRT_BUILDING_LIBRARY)
#define MTRT_API __declspec(dllexport)
#else
#define MTRT_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define MTRT_API __attribute__((visibility("default")))
#else
#define MTRT_API
#endif

/* Dropping a status leaks it and hides an error, so the compiler warns. */
#if defined(__GNUC__) || defined(__clang__)
#define MTRT_MUST_USE_RESULT __attribute__((warn_unused_result))
#else
#define MTRT_MUST_USE_RESULT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/*===------------------------------------------------------------------===*
 * Statuses
 *===------------------------------------------------------------------===*/

/* Canonical error codes; the values match absl, gRPC and IREE and are part
 * of the ABI. */
typedef enum mtrt_status_code_e {
  MTRT_STATUS_OK = 0,
  MTRT_STATUS_CANCELLED = 1,
  MTRT_STATUS_UNKNOWN = 2,
  MTRT_STATUS_INVALID_ARGUMENT = 3,
  MTRT_STATUS_DEADLINE_EXCEEDED = 4,
  MTRT_STATUS_NOT_FOUND = 5,
  MTRT_STATUS_ALREADY_EXISTS = 6,
  MTRT_STATUS_PERMISSION_DENIED = 7,
  MTRT_STATUS_RESOURCE_EXHAUSTED = 8,
  MTRT_STATUS_FAILED_PRECONDITION = 9,
  MTRT_STATUS_ABORTED = 10,
  MTRT_STATUS_OUT_OF_RANGE = 11,
  MTRT_STATUS_UNIMPLEMENTED = 12,
  MTRT_STATUS_INTERNAL = 13,
  MTRT_STATUS_UNAVAILABLE = 14,
  MTRT_STATUS_DATA_LOSS = 15
} mtrt_status_code_t;

/* The result of a call: NULL is success, anything else an error with a code
 * and a message.
 * Ownership: the caller that receives a non-NULL status owns it and frees it
 * with mtrt_status_free.
 * Thread-safety: a status is immutable; any number of threads may read it
 * concurrently, and one of them frees it once no thread reads it anymore. */
typedef struct mtrt_status_s *mtrt_status_t;

/* The code of `status`; MTRT_STATUS_OK for NULL. */
MTRT_API mtrt_status_code_t mtrt_status_code(mtrt_status_t status);

/* The message of `status`, NUL-terminated, owned by the status and valid
 * until mtrt_status_free(status); "" for NULL. */
MTRT_API const char *mtrt_status_message(mtrt_status_t status);

/* Releases `status`; NULL is accepted and ignored. */
MTRT_API void mtrt_status_free(mtrt_status_t status);

/* The name of `code` ("OK", "INVALID_ARGUMENT", ...), a static string owned by
 * the library; "UNRECOGNIZED_STATUS_CODE" for values outside the enum. */
MTRT_API const char *mtrt_status_code_string(mtrt_status_code_t code);

/*===------------------------------------------------------------------===*
 * Version
 *===------------------------------------------------------------------===*/

/* A plain value; copy it freely. */
typedef struct mtrt_version_t {
  int major;
  int minor;
  int patch;
} mtrt_version_t;

/* The version of the library actually loaded. */
MTRT_API mtrt_version_t mtrt_version(void);

/* The same version as "MAJOR.MINOR.PATCH": a static string owned by the
 * library. */
MTRT_API const char *mtrt_version_string(void);

/*===------------------------------------------------------------------===*
 * Devices
 *===------------------------------------------------------------------===*/

/* Where computation runs. */
typedef enum mtrt_backend_e {
  /* The CPU: always exactly one device. */
  MTRT_BACKEND_HOST = 0,
  /* NVIDIA GPUs; UNAVAILABLE when the library was built without CUDA. */
  MTRT_BACKEND_CUDA = 1
} mtrt_backend_t;

/* A snapshot of one device's properties; a plain value owned by whoever
 * declared it, filled in by mtrt_device_info. */
typedef struct mtrt_device_info_t {
  /* NUL-terminated; the CPU's "model name" from /proc/cpuinfo ("host" when
   * there is none) or the GPU's product name. */
  char name[256];
  /* Host: physical memory reported by sysconf (container limits are not
   * applied). CUDA: global memory. */
  uint64_t total_memory_bytes;
  /* CUDA compute capability (9 and 0 for sm_90); 0 and 0 for the host. */
  int compute_capability_major;
  int compute_capability_minor;
  /* CUDA: streaming multiprocessors. Host: logical cores, at least 1. */
  int multiprocessor_count;
} mtrt_device_info_t;

/* Stores in *out_count how many devices `backend` has. The host has one. For
 * CUDA, a machine without a GPU or without a driver has 0 (not an error);
 * a library built without CUDA returns UNAVAILABLE. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_device_count(mtrt_backend_t backend, int *out_count);

/* Fills *out_info with the properties of device `index` of `backend`.
 * OUT_OF_RANGE unless 0 <= index < the count from mtrt_device_count. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_device_info(
    mtrt_backend_t backend, int index, mtrt_device_info_t *out_info);

/*===------------------------------------------------------------------===*
 * Tensors
 *===------------------------------------------------------------------===*/

/* Element types; the values are part of the ABI. */
typedef enum mtrt_dtype_e {
  MTRT_DTYPE_F32 = 0,
  MTRT_DTYPE_F64 = 1,
  MTRT_DTYPE_BF16 = 2,
  MTRT_DTYPE_F16 = 3,
  MTRT_DTYPE_I32 = 4,
  MTRT_DTYPE_I64 = 5
} mtrt_dtype_t;

/* The most dimensions a tensor has. */
#define MTRT_MAX_RANK 8

/* A dense, row-major tensor in memory that someone else owns: the caller's
 * (a batch, a destination for a copy) or a session's (a parameter view).
 * The descriptor itself is a plain value; copying it copies no elements.
 * `backend` and `device` say where `data` lives: MTRT_BACKEND_HOST for CPU
 * memory (device 0), MTRT_BACKEND_CUDA for memory of CUDA device `device`.
 * Elements are contiguous: strides are implied by the shape. */
typedef struct mtrt_tensor_t {
  void *data;
  mtrt_dtype_t dtype;
  mtrt_backend_t backend;
  int device;
  int rank;
  int64_t shape[MTRT_MAX_RANK];
} mtrt_tensor_t;

/* The name of `dtype` ("f32", "i64", ...), a static string; "unknown" for
 * values outside the enum. */
MTRT_API const char *mtrt_dtype_name(mtrt_dtype_t dtype);

/* Bytes per element of `dtype`; 0 for values outside the enum. */
MTRT_API size_t mtrt_dtype_size(mtrt_dtype_t dtype);

/*===------------------------------------------------------------------===*
 * Bundles
 *===------------------------------------------------------------------===*/

/* A compiled bundle (docs/BundleFormat.md), validated when loaded.
 * Ownership: mtrt_bundle_load gives the caller one reference; release it
 * with mtrt_bundle_release. A session keeps its own reference, so the
 * caller may release the bundle as soon as its sessions are created.
 * Thread-safety: immutable; any thread may use it concurrently. */
typedef struct mtrt_bundle_s *mtrt_bundle_t;

/* Reads and validates the bundle at `path` (every size, offset, checksum
 * and instruction; docs/BundleFormat.md). Errors name the file and the
 * problem: INVALID_ARGUMENT for NULL arguments, NOT_FOUND when the file
 * does not exist, and the reader's code otherwise (DATA_LOSS for a damaged
 * file, INVALID_ARGUMENT for a malformed one, UNIMPLEMENTED for a newer
 * format version). */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_bundle_load(const char *path, mtrt_bundle_t *out_bundle);

/* Drops the caller's reference; NULL is ignored. */
MTRT_API void mtrt_bundle_release(mtrt_bundle_t bundle);

/* The bundle's name (its file name, or the model's name), owned by the
 * bundle and valid until its last reference is released; "" for NULL. */
MTRT_API const char *mtrt_bundle_name(mtrt_bundle_t bundle);

/* How many ranks the bundle was compiled for (the product of its grid; 1
 * without a grid). INVALID_ARGUMENT for NULL arguments. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_bundle_rank_count(mtrt_bundle_t bundle, int *out_count);

/*===------------------------------------------------------------------===*
 * Communicators
 *===------------------------------------------------------------------===*/

/* NCCL's communicator, declared here without nccl.h (ncclComm_t is
 * `struct ncclComm *`), so this header needs no NCCL to compile. */
struct ncclComm;

/* One rank's membership in a world of ranks, over which a bundle of several
 * ranks runs its collectives.
 * Ownership: the caller owns each communicator and releases it with
 * mtrt_communicator_release after every session made with it has been
 * released. A session borrows its communicator.
 * Thread-safety: a communicator belongs to its rank's thread: that thread
 * alone creates, steps and releases the rank's session. The ranks of an
 * in-process world must each run on their own thread, at the same time. */
typedef struct mtrt_communicator_s *mtrt_communicator_t;

/* The largest world mtrt_communicator_create_in_process makes. */
#define MTRT_MAX_IN_PROCESS_RANKS 1024

/* Creates a world of `size` ranks that are threads of this process, and
 * stores rank r's communicator in out_communicators[r] (an array of `size`
 * the caller provides). Collectives sum in rank order, so results are
 * bit-identical to a one-rank run's sums. INVALID_ARGUMENT when size is
 * outside [1, MTRT_MAX_IN_PROCESS_RANKS] or the array is NULL. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_communicator_create_in_process(
    int size, mtrt_communicator_t *out_communicators);

/* Wraps the caller's NCCL communicator (`comm` stays the caller's: it is
 * neither copied nor destroyed; an NCCL failure or a collective that exceeds
 * 300 s aborts it, and the rank's next call returns ABORTED naming the rank,
 * the call and the step). Collectives run on the communicator's own CUDA
 * stream; host buffers are staged through device memory. UNAVAILABLE in a
 * library built without the CUDA backend or NCCL, or when libnccl.so.2
 * cannot be loaded, with the message saying so; INVALID_ARGUMENT for NULL
 * arguments. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_communicator_create_nccl(
    struct ncclComm *comm, mtrt_communicator_t *out_communicator);

/* This rank's index in its world, and the world's size. INVALID_ARGUMENT
 * for NULL arguments. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_communicator_rank(mtrt_communicator_t communicator, int *out_rank);
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_communicator_size(mtrt_communicator_t communicator, int *out_size);

/* Releases the communicator; NULL is ignored. The other ranks of its world
 * are not affected, except that collectives waiting for this rank fail. */
MTRT_API void mtrt_communicator_release(mtrt_communicator_t communicator);

/*===------------------------------------------------------------------===*
 * Sessions
 *===------------------------------------------------------------------===*/

/* Megatron-LM's learning-rate decay styles. */
typedef enum mtrt_lr_decay_style_e {
  MTRT_LR_DECAY_CONSTANT = 0,
  MTRT_LR_DECAY_LINEAR = 1,
  MTRT_LR_DECAY_COSINE = 2
} mtrt_lr_decay_style_t;

/* How a session is made: filled with defaults by
 * mtrt_session_options_initialize, then changed field by field. A plain
 * value owned by the caller; read only during mtrt_session_create.
 *
 * ABI: `struct_size` is set by mtrt_session_options_initialize to the size
 * the caller was compiled with; later versions only append fields, and a
 * library reads the fields that fit in struct_size, taking defaults for the
 * rest. */
typedef struct mtrt_session_options_t {
  size_t struct_size;
  /* Where the step runs (default MTRT_BACKEND_HOST) and, for CUDA, the
   * device index (default 0). */
  mtrt_backend_t backend;
  int device;
  /* This rank's communicator, borrowed: NULL for a bundle of one rank
   * (the default); required for a bundle of several ranks. */
  mtrt_communicator_t communicator;
  /* Host backend: worker threads (default 0: one per logical core). */
  int threads;
  /* CUDA backend: nonzero lets GEMMs use TF32 (faster, ~1e-3 relative
   * error); default 0, full fp32 like the host backend. */
  int tf32;
  /* Parameters are initialized as the bundle's parameter table says, from
   * this seed (default 1234, megatron-train's); dropout masks are keyed on
   * the bundle's op seeds and the samples consumed (see
   * mtrt_session_accumulate). */
  uint64_t seed;
  /* The optimizer, Megatron-LM's (megatron-train's flags in brackets):
   * learning rate [--lr] (default 1e-4), [--min-lr] (default 0), decay
   * style [--lr-decay-style] (default CONSTANT), [--lr-warmup-iters]
   * (default 0), [--lr-decay-iters] (required > warmup for LINEAR and
   * COSINE), [--lr-warmup-init] (default 0). */
  double lr;
  double min_lr;
  mtrt_lr_decay_style_t lr_decay_style;
  int64_t lr_warmup_iters;
  int64_t lr_decay_iters;
  double lr_warmup_init;
  /* AdamW [--weight-decay 0.01, --adam-beta1 0.9, --adam-beta2 0.95,
   * --adam-eps 1e-8] and global-norm clipping [--clip-grad 1.0; 0 off]. */
  double weight_decay;
  double adam_beta1;
  double adam_beta2;
  double adam_eps;
  double clip_grad;
  /* fp16 loss scaling, for a bundle compiled with megatron-compile --fp16
   * (precision fp16), as megatron-train --fp16 does it: the loss's gradient
   * seed is multiplied by the scale, the gradients by its inverse before
   * clipping, and a step with an inf or nan gradient element (on any rank)
   * skips its update (mtrt_step_metrics_t.skipped). A static scale
   * [--loss-scale] (default 0: dynamic), else dynamic from
   * [--initial-loss-scale] (default 2^32), never below [--min-loss-scale]
   * (default 1), doubling after [--loss-scale-window] (default 1000) clean
   * steps, halving after [--hysteresis] (default 2) overflowing ones.
   * Other bundles need no loss scaling: these fields keep their defaults. */
  double loss_scale;
  double initial_loss_scale;
  double min_loss_scale;
  int64_t loss_scale_window;
  int64_t hysteresis;
} mtrt_session_options_t;

/* Sets every field of *options to its default (see the struct). */
MTRT_API void mtrt_session_options_initialize(mtrt_session_options_t *options);

/* One rank of a bundle, ready to train: its parameters (initialized from
 * the seed), their gradients and AdamW's moments, the executors of
 * train_step and eval_step, the optimizer and the batch.
 * Ownership: the caller owns it and releases it with mtrt_session_release.
 * Thread-safety: none: one thread at a time drives a session, and for a
 * bundle of several ranks it is the rank's thread (the communicator's
 * rule). Different sessions may run concurrently on different threads. */
typedef struct mtrt_session_s *mtrt_session_t;

/* Creates the session of this rank (the communicator's rank; 0 without
 * one). For a bundle of several ranks this is a collective: every rank
 * creates its session at the same time.
 * INVALID_ARGUMENT: NULL arguments, struct_size smaller than the first
 *   version's, an option outside its range (named, with the range), a
 *   communicator whose world size is not the bundle's rank count, or one
 *   passed for a bundle of one rank, or loss-scaling fields changed from
 *   their defaults for a bundle that is not fp16.
 * FAILED_PRECONDITION: a bundle of several ranks without a communicator.
 * UNAVAILABLE: MTRT_BACKEND_CUDA in a library built without CUDA, or a
 *   device index the machine does not have.
 * UNIMPLEMENTED: the CUDA backend with bf16 or f16 parameters.
 * NOT_FOUND: a bundle without train_step. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_create(
    mtrt_bundle_t bundle, const mtrt_session_options_t *options,
    mtrt_session_t *out_session);

/* Releases the session and everything it owns; NULL is ignored. Views of
 * its parameters become invalid. */
MTRT_API void mtrt_session_release(mtrt_session_t session);

/* The batch train_step and eval_step take: the tokens (and labels) tensor's
 * shape [micro_batch, seq_length] and id type (MTRT_DTYPE_I32 or I64), as
 * compiled into the bundle. INVALID_ARGUMENT for NULL arguments. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_batch_info(
    mtrt_session_t session, int64_t *out_micro_batch, int64_t *out_seq_length,
    mtrt_dtype_t *out_dtype);

/* How mtrt_session_set_batch takes the caller's tensors. */
typedef enum mtrt_batch_mode_e {
  /* The elements are copied (and converted between I32 and I64) now; the
   * caller's memory may change as soon as the call returns. Ids are checked
   * against the vocabulary now. */
  MTRT_BATCH_COPY = 0,
  /* The session keeps the pointers and reads the elements at each step,
   * without copying them (a GPU batch stays where it is): the caller keeps
   * them alive and unchanged until the batch is replaced or the session
   * released. The dtype must be the bundle's id type. Ids are checked at
   * each step. */
  MTRT_BATCH_BIND = 1
} mtrt_batch_mode_t;

/* Sets the micro-batch that the next steps read: `tokens` and `labels`,
 * each [micro_batch, seq_length] (mtrt_session_batch_info), I32 or I64, in
 * host memory, or for a CUDA session also in its device's memory. Copy or
 * bind as `mode` says. On error the previous batch stays.
 * INVALID_ARGUMENT: NULL arguments, an unknown mode, a shape or dtype other
 *   than the bundle's (named, with the expected one), memory of another
 *   backend or device, a bound tensor whose dtype is not the bundle's.
 * OUT_OF_RANGE (MTRT_BATCH_COPY from host memory): an id outside the
 *   vocabulary, naming the tensor, the position and the vocabulary size. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_set_batch(
    mtrt_session_t session, const mtrt_tensor_t *tokens,
    const mtrt_tensor_t *labels, mtrt_batch_mode_t mode);

/* What the last optimizer step did. Output struct: the caller sets
 * `struct_size` to sizeof(mtrt_step_metrics_t) before the call (later
 * versions only append fields; the library writes what fits). */
typedef struct mtrt_step_metrics_t {
  size_t struct_size;
  /* Optimizer steps taken so far, this one included (1 after the first);
   * 0 before any. */
  int64_t iteration;
  /* Micro-batches accumulated into this step. */
  int64_t micro_batches;
  /* The mean of those micro-batches' train_step losses. */
  double loss;
  /* The global gradient norm after averaging over micro-batches and
   * before clipping (Megatron-LM's "grad norm"). */
  double grad_norm;
  /* The learning rate the update used. */
  double learning_rate;
  /* fp16 bundles: the loss scale after this step (0 for other bundles), and
   * 1 when the step found an inf or nan gradient element and skipped its
   * update (grad_norm is then NaN; parameters and moments are unchanged;
   * the learning rate is the one the next update will use). */
  double loss_scale;
  int64_t skipped;
  /* Megatron-LM's "lm loss": `loss` less the MoE auxiliary losses that it
   * includes (bundles whose train_step reports them, format 12); `loss`
   * for other bundles. Then its logged MoE losses: load_balancing_loss (or
   * seq_load_balancing_loss, where the bundle's balancing type is
   * seq_aux_loss) and z_loss, each without its coefficient, averaged over
   * the MoE layers and the micro-batches (docs/MoE.md, "The logged
   * losses"); NaN where the bundle reports none. */
  double lm_loss;
  double load_balancing_loss;
  double z_loss;
} mtrt_step_metrics_t;

/* Runs train_step (forward and backward) on the current batch, adding this
 * micro-batch's gradients to the accumulated ones; stores its loss in
 * *out_loss (may be NULL). A collective for a bundle of several ranks.
 * Dropout masks are keyed on samples, as megatron-train's: the session
 * counts the samples it has consumed (every accumulate consumes one global
 * micro-batch, the batch's rows times the data-parallel size; a loaded
 * checkpoint restores its consumed_samples), and row b of data rank d's
 * batch is sample consumed + d * rows + b, so the batches megatron-train
 * would read in that order get its masks.
 * A pipeline bundle's schedule interleaves its micro-batches' stages, so
 * there this copies the batch and returns NaN as its loss; the schedule
 * runs at mtrt_session_apply, over exactly the micro-batches it was
 * compiled for (the global batch over micro-batch x data-parallel size),
 * and the step's metrics give their mean loss. Every rank of the pipeline
 * sets its data rank's micro-batches (the first stage reads the tokens,
 * the last the labels).
 * FAILED_PRECONDITION: no batch was set; a pipeline bundle's schedule has
 *   all its micro-batches already.
 * OUT_OF_RANGE: a bound batch holds an id outside the vocabulary.
 * ABORTED: another rank failed (the message names it).
 * INTERNAL: a CUDA error, naming the instruction. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_session_accumulate(mtrt_session_t session, double *out_loss);

/* One optimizer step over the accumulated micro-batches, as Megatron-LM's:
 * gradients averaged over them, global-norm clipping, AdamW with the
 * learning rate of the schedule; then the gradients are zeroed for the
 * next step. Fills *out_metrics (may be NULL). With fp16 loss scaling the
 * gradients are unscaled first, and a step that finds an inf or nan
 * gradient element skips its update and returns MTRT_STATUS_OK with
 * out_metrics->skipped = 1.
 * FAILED_PRECONDITION: nothing was accumulated since the last step; for
 *   a pipeline bundle, not the micro-batches its schedule takes (both
 *   counts named).
 * ABORTED: the gradient norm is not finite (nothing is updated), or another
 *   rank failed.
 * INVALID_ARGUMENT: out_metrics->struct_size too small. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_apply(
    mtrt_session_t session, mtrt_step_metrics_t *out_metrics);

/* mtrt_session_accumulate then mtrt_session_apply: one iteration of one
 * micro-batch (plus any accumulated before). Errors as those two. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_train_step(
    mtrt_session_t session, mtrt_step_metrics_t *out_metrics);

/* Runs eval_step (the loss, no gradients) on the current batch and stores
 * the loss in *out_loss; a pipeline bundle runs the batch through its
 * stages' eval functions in order (a collective over the ranks).
 * NOT_FOUND: the bundle has no eval_step.
 * Otherwise errors as mtrt_session_accumulate. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_session_eval_step(mtrt_session_t session, double *out_loss);

/* The metrics of the last optimizer step (iteration 0 and zeros before
 * the first). INVALID_ARGUMENT for NULL or a struct_size too small. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_metrics(
    mtrt_session_t session, mtrt_step_metrics_t *out_metrics);

/*--- Parameters ------------------------------------------------------------*/

/* How many parameters the bundle has. INVALID_ARGUMENT for NULL. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_session_parameter_count(mtrt_session_t session, size_t *out_count);

/* The name of parameter `index` (Hugging Face's, e.g.
 * "transformer.h.0.attn.c_attn.weight"), owned by the session.
 * OUT_OF_RANGE unless index < the count. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_parameter_name(
    mtrt_session_t session, size_t index, const char **out_name);

/* The dtype and shape of this rank's part of parameter `name` (the whole
 * parameter on one rank), and where the session keeps it; data is NULL.
 * NOT_FOUND names the parameter and lists a few that exist.
 * FAILED_PRECONDITION: a pipeline bundle's parameter that another pipeline
 * rank holds (named); the same for get, set and view. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_parameter_info(
    mtrt_session_t session, const char *name, mtrt_tensor_t *out_info);

/* Copies parameter `name` into the caller's `destination`, or from the
 * caller's `source`, which must have the parameter's dtype and shape
 * (mtrt_session_parameter_info) and lie in host memory or, for a CUDA
 * session, in its device's memory. Setting a value leaves the optimizer's
 * moments as they are.
 * NOT_FOUND: no such parameter. INVALID_ARGUMENT: NULL arguments, another
 * dtype or shape (both named), memory of another backend or device. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_parameter_get(
    mtrt_session_t session, const char *name,
    const mtrt_tensor_t *destination);
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_parameter_set(
    mtrt_session_t session, const char *name, const mtrt_tensor_t *source);

/* A view of the session's own storage of parameter `name` (host memory, or
 * device memory for a CUDA session): no copy. The elements stay valid until
 * the session is released; they change at each optimizer step and may be
 * read or written between calls on the session's thread (every call has
 * finished its device work when it returns). NOT_FOUND: no such
 * parameter. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_session_parameter_view(
    mtrt_session_t session, const char *name, mtrt_tensor_t *out_view);

/* A CUDA session's stream (a cudaStream_t), on which it runs everything:
 * a producer of a bound batch orders its writes before this stream (DLPack's
 * `stream` argument). FAILED_PRECONDITION for a host session. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_session_cuda_stream(mtrt_session_t session, void **out_stream);

/*--- Checkpoints -----------------------------------------------------------*/

/* Saves this rank's training state as the checkpoint of the current
 * iteration under `directory`, in megatron-train's format
 * (docs/Checkpoints.md: `directory`/iter_NNNNNNN with each rank's shard of
 * the parameters and AdamW's moments, a manifest with the step and
 * micro-batch counters and the optimizer's settings, and
 * latest_checkpointed_iteration.txt), so megatron-train --load resumes it
 * and the other way round. A collective for a bundle of several ranks. The
 * save is atomic: a failure leaves no checkpoint, and an existing one is
 * never overwritten.
 * INVALID_ARGUMENT: NULL arguments. ALREADY_EXISTS: the directory already
 * holds this iteration's checkpoint. Otherwise the file system's error
 * (PERMISSION_DENIED, RESOURCE_EXHAUSTED, ...), naming the path and the
 * step. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_session_save_checkpoint(mtrt_session_t session, const char *directory);

/* Loads the newest checkpoint under `directory` (written by
 * mtrt_session_save_checkpoint or megatron-train --save, with any parallel
 * layout of the same model: it is resharded to this rank's), after
 * checking its manifest and files: the parameters, AdamW's moments and the
 * counters, so the next steps continue the saved run exactly. Accumulated
 * gradients are dropped. A collective for a bundle of several ranks.
 * NOT_FOUND: no checkpoint under `directory`. INVALID_ARGUMENT: NULL
 * arguments, other optimizer settings than the session's (each named), a
 * checkpoint of another model (the tensor, the shapes). DATA_LOSS: a
 * damaged manifest or file (the file, what was found). */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_session_load_checkpoint(mtrt_session_t session, const char *directory);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MTRT_MTRT_H */
