// Runs one function of a bundle on a GPU: one kernel (or cuBLASLt call) per
// instruction, over a static device arena.
#ifndef MTRT_SRC_CUDA_EXECUTOR_H
#define MTRT_SRC_CUDA_EXECUTOR_H

#include "core/Bundle.h"
#include "core/MicroBatchKey.h"
#include "core/ScratchPlan.h"
#include "cuda/ArenaPlan.h"
#include "cuda/Context.h"
#include "cuda/DeviceCollective.h"
#include "cuda/FusedKernels.h"
#include "cuda/SharedArena.h"
#include "cuda/StepGraph.h"
#include "host/HostTensor.h"
#include "host/kernels/Kernels.h"

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mtrt {
class ValueTrace;
} // namespace mtrt

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm
/// The multi-rank instructions, which a CUDA executor runs in RankOps.cpp
/// (executeRankInstruction): X(Name) for each Op::Name; the one list behind
/// Executor::isRankInstruction and the device dispatch's guard. (Embedding
/// and its gradient over a vocabulary shard join them per instruction:
/// isRankInstruction.)
#define MTRT_CUDA_RANK_OPS(X)                                                  \
  X(AllReduce)                                                                 \
  X(AllGather)                                                                 \
  X(ReduceScatter)                                                             \
  X(AllSlice)                                                                  \
  X(BiasAdd)                                                                   \
  X(VocabMax)                                                                  \
  X(VocabPartials)                                                             \
  X(VocabCrossEntropy)                                                         \
  X(VocabCrossEntropyGrad)                                                     \
  X(Shift)                                                                     \
  X(AllToAll)

namespace mtrt::cuda {

class DeviceCollective;
class ParameterStore;
struct FlashLayout;

/// The device twin of host::Executor: same function, same inputs and
/// outputs (host tensors), same semantics, so that a trainer can swap one
/// for the other.
///
/// Memory: at construction the instruction stream is planned once
/// (ArenaPlan: results allocated where they are defined, released at the
/// instruction that lists them in `free`), and one arena of the plan's size
/// is allocated; runs allocate nothing. get_parameter binds the store's
/// device value (no copy; GEMMs under bf16 read the store's bf16 copy);
/// accumulate_gradient adds into its gradient, or its weight-gradient GEMM
/// did (planGemmAccumulation); with the gradients in the arena
/// (ParameterStore::GradientStorage::Arena) it does nothing: the gradient
/// is its operand's slot (gradientSlots).
/// Every floating value is f32 on the device; bf16 and f16 values are
/// rejected. A bundle compiled with precision bf16 (the manifest's
/// model.precision) runs in mixed precision: GEMMs and the attention core
/// take bf16 operands and accumulate in fp32 (docs/Architecture.md, "The
/// cuda backend"); everything else computes in fp32, as in fp32 bundles.
///
/// Checks: token ids and labels (function inputs) are checked on the host
/// before upload, with the host executor's messages (OUT_OF_RANGE). Every
/// CUDA and cuBLASLt call is checked; an error names the function, the
/// instruction and the call. Kernel faults surface at the run's final
/// synchronization unless the context synchronizes after each instruction
/// (ContextOptions::syncEachInstruction).
///
/// Thread-safety: one run at a time per executor; executors of one store may
/// not run concurrently (they share gradients).
class Executor {
public:
  /// Throws Error: NOT_FOUND when the bundle has no such function,
  /// UNIMPLEMENTED for bf16/f16 values or shapes the kernels cannot run,
  /// INVALID_ARGUMENT if the store is another bundle's, or the arena's
  /// allocation failure.
  ///
  /// A bundle of several ranks (a grid) runs one rank per executor, given
  /// its RankContext (prepared for the bundle: RankContext::prepare) and a
  /// store holding its shards. Its multi-rank instructions (collectives,
  /// all_slice, bias_add, the vocabulary-parallel loss and embedding) run
  /// on the device (RankOps.cpp): the collectives through DeviceCollective
  /// on the rank's communicators (NCCL: in place on the arena; in-process
  /// ranks on one GPU: PeerGroup's kernels; their other calls staged
  /// through the host), the rest as kernels.
  ///
  /// The collectives over several ranks that run on the device without the
  /// host waiting (NCCL; PeerGroup with ContextOptions::peerCollectives)
  /// run on the executor's communication stream (a staged call waits for
  /// its result anyway, and stays on the compute stream): each starts there
  /// once the compute stream has
  /// passed its instruction (an event), and the compute stream waits for it
  /// (another) only before the first later instruction that reads its
  /// result, frees its operand or result, or at the run's end
  /// (planCollectiveWaits). A collective the compiler split
  /// (--overlap-collectives) therefore runs beside the instructions between
  /// its start and its wait, as the bundle's memory plan allows
  /// (docs/BundleFormat.md); an unsplit one is read at once. A function
  /// whose collectives are all PeerGroup's is captured in a CUDA graph like
  /// a one-rank function, the communication stream forked and joined inside
  /// the capture, and launched through PeerGroup's gate; with NCCL it runs
  /// without one unless ContextOptions::ncclGraphs (NcclCommunicator then
  /// enqueues the captured calls without its watchdog's events).
  ///
  /// Mixed precision keeps function inputs and outputs in f32, except those
  /// named in `bf16Boundary` (input and output indices): each of those may
  /// be held in bf16 like the values inside (storageType says which), and
  /// the caller converts at the boundary (a pipeline stage's stash,
  /// cuda/PipelineStages.h). A value that is also another input or output
  /// stays f32.
  struct Bf16Boundary {
    std::vector<size_t> inputs, outputs;
  };
  ///
  /// With `sharedArena` (which must outlive it), the function's arena is a
  /// reservation in that arena, bound at the first run, instead of its own
  /// (a pipeline rank's stage functions, cuda/PipelineStages.h).
  Executor(const Bundle &bundle, std::string_view functionName,
           ParameterStore &parameters, comm::RankContext *rank = nullptr,
           Bf16Boundary bf16Boundary = {},
           SharedArena *sharedArena = nullptr);
  ~Executor();
  Executor(const Executor &) = delete;
  Executor &operator=(const Executor &) = delete;

  const Function &function() const { return *function_; }
  /// Whether GEMMs and attention take bf16 operands (precision bf16).
  bool mixedPrecision() const { return bf16_; }
  /// The storage type of value `v`: BF16 for a value held in bf16
  /// (planBf16Values), else F32 for floating values, I32 or I64; FP8 codes
  /// (F8E4M3, F8E5M2) as declared. An older bundle's slot keeps the F32
  /// size either way.
  DType storageType(int64_t v) const;
  /// Whether value `v` is held in bf16 (storageType BF16): its kernels then
  /// read or write `__nv_bfloat16`.
  bool heldInBf16(int64_t v) const {
    return storageType(v) == DType::BF16;
  }

  /// Uploads `inputs` (one per function input, of its declared shape and
  /// storage type), runs the function, waits for it and returns copies of
  /// its outputs. `key`'s first sample keys the dropout masks
  /// (core/Random.h), its step names the collectives. Throws Error:
  /// INVALID_ARGUMENT for inputs of the wrong count, shape or type;
  /// OUT_OF_RANGE for ids outside the vocabulary; a CUDA or cuBLASLt error
  /// naming the instruction.
  ///
  /// With `inputsOnDevice`, the inputs' data are device memory of this
  /// context's device, read in place (no copy; the C API's bound GPU
  /// batches): the caller orders their writes before this context's stream
  /// and keeps them alive during the run. Their ids are then checked by the
  /// kernels (the fault word) instead of on the host.
  ///
  /// Without `inputsOnDevice`, each input is copied into its arena slot from
  /// host memory or from this device's memory (cudaMemcpyDefault: a
  /// pipeline stage's activation); ids in device memory are then checked by
  /// the kernels too.
  ///
  /// With `keepOutputs`, the outputs stay on the device: it is called with
  /// each output's index and its slot (its storage type's bytes), before
  /// the run synchronizes, to enqueue a copy on the context's stream (the
  /// slot is the arena's, reused by the next run); run() then returns
  /// nothing.
  ///
  /// Without `wait` (only with `keepOutputs`), run() returns once the run
  /// is enqueued on the context's stream: the host does not wait for the
  /// device, the run is not profiled, and the fault word is neither cleared
  /// nor read (the caller clears it before and reads it after a series of
  /// such runs: a pipeline schedule, cuda/PipelineStages.h). Host inputs
  /// must then stay unchanged until the stream has passed the run (pinned
  /// memory; pageable memory makes the copy wait for the stream).
  using OutputSink =
      std::function<void(size_t output, const void *data, size_t bytes)>;
  std::vector<host::Tensor> run(const std::vector<host::TensorView> &inputs,
                                const MicroBatchKey &key,
                                bool inputsOnDevice = false,
                                const OutputSink &keepOutputs = nullptr,
                                bool wait = true);

  /// fp16 loss scaling: from the next run on, the backward pass's seed (the
  /// fill marked `loss_seed`) is its value times `scale`, as
  /// host::Executor::setLossScale. A launch argument: the fill is a stepped
  /// instruction of the CUDA graph, refreshed when the scale changes.
  void setLossScale(double scale) { lossScale_ = scale; }

  /// From the next run on, the run's end does not make the compute stream
  /// wait for the collectives still running on the communication stream
  /// (those whose results are outputs): joinCollectives() does, later, and
  /// the outputs may be read only after it. The compute stream goes on
  /// beside them (a gradient bucket's reduction beside the rest of the
  /// backward pass). Such runs execute without a CUDA graph.
  void setDeferredCollectiveJoin(bool defer) { deferJoin_ = defer; }
  /// Makes the compute stream wait for the last run's collectives left
  /// running by setDeferredCollectiveJoin.
  void joinCollectives();

  /// Whether runs without an instruction observer replay a CUDA graph
  /// (from the second run on; graphSummary() says why not otherwise).
  bool graphsEligible() const {
    return graphOff_.empty() && context_.options().cudaGraphs && !deferJoin_;
  }

  /// Called with each instruction's position once it is enqueued, until set
  /// to nullptr (host::Executor::setInstructionObserver): the last
  /// micro-batch's gradient buckets are enqueued there, on the same stream.
  /// A run with an observer runs instruction by instruction, not as a CUDA
  /// graph.
  void setInstructionObserver(std::function<void(size_t)> observer) {
    observer_ = std::move(observer);
  }

  /// The arena's size (what it needs of a shared arena): every value and
  /// scratch byte of a run.
  size_t arenaBytes() const { return viewRegion_ + viewBytes_; }

  /// Mixed precision: how many values are held in bf16
  /// (ContextOptions::bf16Values).
  size_t bf16ValueCount() const;

  /// Mixed precision: how many split and concat instructions copy nothing
  /// because flash attention reads their pieces in place
  /// (planAttentionViews).
  size_t elidedCopyCount() const;

  /// How many attention and attention_grad instructions run through cuDNN's
  /// fused attention (planCudnnAttention), and for the others without
  /// dropout the first reason they do not ("" if none).
  size_t cudnnAttentionCount() const;
  const std::string &cudnnAttentionDeclined() const { return cudnnDeclined_; }

  /// How many weight-gradient GEMMs add straight into their parameter's
  /// gradient (planGemmAccumulation).
  size_t gemmAccumulationCount() const;

  /// Allocates a shared arena (once all its executors are made) and points
  /// the values' slots and the attention views into it, as the first run
  /// would; an own arena is bound at construction. Idempotent.
  void bindArena();

  /// For a store whose gradients live in the arena
  /// (ParameterStore::GradientStorage::Arena): each parameter's gradient
  /// after a run, the slot of its accumulate_gradient's operand, which the
  /// arena keeps until the next run (ParameterStore::bindGradients). Throws
  /// Error (FAILED_PRECONDITION) unless the function fits
  /// (ParameterStore::gradientsFitArena) and has its own arena.
  std::vector<float *> gradientSlots() const;

  /// With ContextOptions::profile: milliseconds per op over the runs so
  /// far but the first (whose GEMM algorithm timing and kernel loading are
  /// not the step's), one line per op, slowest first, after the run's wall
  /// time on the host; empty otherwise.
  std::string profile() const;
  /// With ContextOptions::profileInstructions: each distinct instruction's
  /// (op, operand and result types) microseconds a run, as `calibration:`
  /// lines (bench/make-calibration.py reads them).
  std::string instructionProfile() const;

  /// With ContextOptions::cudaGraphs: how the runs went ("train_step: CUDA
  /// graph of N nodes, K kernels updated per step, replayed in R of T
  /// runs"), or why the function runs without one; empty otherwise.
  std::string graphSummary() const;
  /// Runs replayed from the CUDA graph so far.
  int64_t graphReplays() const { return graphReplays_; }

  /// With ContextOptions::profile, the last timed run's intervals: each
  /// instruction on the compute stream, and each collective on the
  /// communication stream (from when that stream started it to its end),
  /// in milliseconds from the run's first instruction.
  struct TimelineEntry {
    size_t position;
    bool communication;
    double startMs, endMs;
  };
  const std::vector<TimelineEntry> &timeline() const { return timeline_; }

  /// Whether `inst` is a multi-rank instruction (RankOps.cpp).
  static bool isRankInstruction(const Instruction &inst);

private:
  /// A function input whose ids an instruction reads: checked on upload.
  struct IdCheck {
    size_t input;
    size_t position;
    size_t operand;
    int64_t limit;
    const char *what;
    const char *limitName;
    bool hasIgnore;
    int64_t ignore;
  };

  /// Instruction `position`'s kernel block (core/ScratchPlan.h).
  size_t scratchBytes(size_t position) const {
    return static_cast<size_t>(kernelBlocks_.bytes[position]);
  }
  /// Pairs each flash attention with its attention_grad (the forward keeps
  /// its logsumexp, output copy and dropout mask for it, which then reruns
  /// nothing) and each cross_entropy with its cross_entropy_grad (the rows'
  /// logsumexps), and sizes every kernel block: core/ScratchPlan's
  /// planScratch, the sizes the compiler's plan uses.
  void planKernelBlocks();
  /// The values a GEMM instruction passes as A and B (-1, -1 for others).
  std::pair<int64_t, int64_t> gemmOperandValues(const Instruction &inst) const;
  /// Mixed precision: each value that GEMMs read gets one bf16 copy, made by
  /// its first GEMM and kept until its last (its own block in the arena);
  /// except parameter views, whose copy is the store's persistent one
  /// (ParameterStore::bf16Value), and values held in bf16.
  void planBf16Copies();
  /// The store's bf16 copy of value `v` when it is a view of a parameter
  /// that has one, else null.
  const __nv_bfloat16 *parameterBf16(int64_t v) const;
  /// Weight gradients accumulated by their GEMM: a linear_weight_grad or
  /// linear_weight_bias_grad whose weight gradient is read only by one
  /// accumulate_gradient runs with beta = 1 straight into that parameter's
  /// gradient, and the accumulate_gradient does nothing.
  void planGemmAccumulation();
  /// The bf16 copies instruction `position` makes (first operand first).
  std::vector<SideBufferNeed> bf16CopiesMadeAt(size_t position) const;
  /// Mixed precision, flash attention in place (AttentionViews.cpp): a split
  /// whose every result only flash attentions read, as q, k or v, and a
  /// concat of exactly one flash attention_grad's results (read by it
  /// only), both on the last two axes of a 4-D tensor, become view groups:
  /// the whole, the values sharing its bytes through reshapes, and the
  /// pieces at their offsets (strides in viewStrides_), in one block of a
  /// region after the plan's arena, live from the first member's producer
  /// through the members' last reader. The split or concat is elided.
  /// A bundle whose plan has `views` (issue 21) says which groups there
  /// are, inside the plan (core/AttentionViews.h): no region then.
  /// Clears aliasOf_ for members and values aliasing them. After
  /// planBf16Values (members share a storage type), before the arena.
  void planAttentionViews();
  /// Which flash attention and attention_grad instructions run through
  /// cuDNN (cudnnAttention_): without dropout, in bf16, where cuDNN builds
  /// a plan (built here, before any launch or CUDA graph capture) within
  /// the memory plan's workspace (core/OpScratch.h); an attention_grad's
  /// flag covers its forward rerun too. After planAttentionViews (the
  /// tensors' strides).
  void planCudnnAttention();
  /// Checks, after the arena's plan, that each paired flash attention
  /// whose output the plan holds through its gradient
  /// (ScratchPlan::outputHeld: its block keeps no copy, the gradient reads
  /// the output in its slot) runs in the compiler's plan, with a bf16
  /// output in the packed layout the backward kernels read; throws
  /// INTERNAL otherwise.
  void checkHeldAttentionOutputs() const;
  /// The flash forward (out, its kept copy, logsumexp, dropout bits) on
  /// the Hopper kernels where ContextOptions::hopperAttention is on and
  /// they take the call (kernels/HopperAttention.h), else the own ones.
  void flashForward(cudaStream_t stream, const AttentionParams &p,
                    const FlashTensors &io, __nv_bfloat16 *kept, float *lse,
                    uint64_t *mask) const;
  /// The flash backward (dq, dk, dv from the forward's kept copy,
  /// logsumexp and dropout bits) on the Hopper kernels under the same
  /// switch where they take the call (not the deterministic backward),
  /// else the own ones.
  void flashBackward(cudaStream_t stream, const AttentionParams &p,
                     const FlashTensors &io, const __nv_bfloat16 *kept,
                     const float *lse, const uint64_t *mask,
                     void *scratch) const;
  /// The flash tensors' element types and strides of an attention (first
  /// 0) or attention_grad (first 1); no pointers.
  FlashTensors flashTensorLayout(const Instruction &inst, size_t first) const;
  /// Points the members' slots into the region at `region`.
  void bindAttentionViews(char *region);
  /// The flash kernels' strides of value `v` (unset: packed).
  FlashLayout flashLayout(int64_t v) const;
  /// Mixed precision: the values held in bf16. From format version 8 the
  /// bundle's types (planTypedBf16Values). Before (ContextOptions::
  /// bf16Values), in their slot's first half: a value is, when its producer writes it
  /// in bf16 (writesBf16) and every reader reads it so (readsBf16), and so
  /// is every value that must share its type (a reshape's, split's or
  /// concat's operands and results; a GeLU epilogue's result and auxiliary
  /// matrix; a collective's operand and result). Function inputs, outputs
  /// and parameters stay as declared.
  void planBf16Values();
  /// Format version 8: the values the bundle declares bf16, each checked
  /// against its kernels (readsBf16, writesBf16).
  void planTypedBf16Values();
  /// Whether the device kernels of `inst` read operand `operand` in bf16
  /// when it is held so (and in fp32 otherwise). Each op's dispatch in
  /// OpDispatch.cpp picks its kernels by storageType.
  bool readsBf16(const Instruction &inst, size_t operand) const;
  /// Whether they can write result `result` in bf16.
  bool writesBf16(const Instruction &inst, size_t result) const;
  /// The bf16 copies of a GEMM's operands; made here when `position` is
  /// their first GEMM.
  Bf16Operands bf16Operands(size_t position, const Instruction &inst);
  /// Whether this attention runs on the flash kernels (mixed precision and
  /// shapes they take).
  bool flashAttention(const host::AttentionParams &params) const;
  void checkShapes(size_t position, const Instruction &inst) const;
  std::string where(size_t position) const;
  void *slot(int64_t value) const { return slots_[value]; }
  void *scratch(size_t position) const;
  void checkInputIds(const std::vector<host::TensorView> &inputs) const;
  void execute(size_t position, const Instruction &inst,
               const MicroBatchKey &key);
  /// One GEMM of the chunked output layers (OpDispatch.cpp): C = op(A)
  /// op(B) in fp32, or from bf16 operands (`bf16`) with fp32 accumulation
  /// and C in bf16 (`bf16Result`) or fp32; an error names the instruction
  /// at `position`.
  void chunkGemm(size_t position, bool bf16, const GemmEpilogue &epilogue,
                 int64_t m, int64_t n, int64_t k, const void *lhs,
                 bool transLhs, const void *rhs, bool transRhs, void *result,
                 bool bf16Result, bool accumulate);
  /// A chunk's two gradient GEMMs from its logits' gradient `dlogits`
  /// ([n, vocab]): dx_c = dlogits @ op(W)^T (in bf16 when `dxBf16`) and
  /// dweight (+)= the chunk's share (fp32; added when `accumulate`).
  void chunkGradients(size_t position, bool bf16, const GemmEpilogue &epilogue,
                      int64_t n, int64_t inSize, int64_t vocab,
                      const void *dlogits, const void *weight,
                      bool transposeWeight, const void *x, void *dx,
                      bool dxBf16, float *dweight, bool accumulate);
  /// linear_cross_entropy (OpDispatch.cpp): per chunk of tokens, the
  /// logits' GEMM into the kernel block, the row kernel, the GEMMs of dx
  /// and of the accumulated weight gradient.
  void linearCrossEntropy(size_t position, const Instruction &inst);
  /// linear_vocab_max, linear_vocab_partials and
  /// linear_vocab_cross_entropy_grad (OpDispatch.cpp): the
  /// vocabulary-parallel output layer's chunks, in the op's kernel block.
  void linearVocab(size_t position, const Instruction &inst);
  /// FP8 training's instructions (Fp8Ops.cpp): fp8_scale,
  /// fp8_current_scale, fp8_quantize, fp8_linear, fp8_linear_weight_grad,
  /// fp8_update.
  void executeFp8(size_t position, const Instruction &inst);
  /// Sizes the Fp8Gemm's staging for this function's largest FP8 GEMM
  /// (Fp8Ops.cpp), before any run is captured into a graph, and plans the
  /// transposed codes kept there (after planFp8Casts).
  void reserveFp8Staging();
  /// Finds the producers that can write an fp8_quantize's codes themselves
  /// (Fp8Ops.cpp): a swiglu, layer norm or RMS norm whose result only that
  /// quantize reads, with
  /// only views (get_parameter, fp8_scale) between them and a delayed
  /// scale; a swiglu_grad whose two gradients only such quantizes read, the
  /// first so, the second later.
  void planFp8Casts();
  /// Whether the producer at `position` writes its fp8_quantize's codes
  /// and amax this run (and the quantize does nothing): planned, and the
  /// quantize's results do not overlap the producer's operands (which
  /// may die at the producer, their memory then the quantize's).
  bool fp8CastFused(size_t position) const;
  /// The producer at `position` with its fp8_quantize's cast (Fp8Ops.cpp).
  void executeFusedFp8Cast(size_t position, const Instruction &inst);
  /// Gives every fp8_quantize's amax a float of fp8Amaxes_ (Fp8Ops.cpp),
  /// zeroed by one memset a run, at the first instruction that casts
  /// (after planFp8Casts).
  void planFp8Amaxes();
  /// Points the amaxes' slots into fp8Amaxes_, and the deferred codes'
  /// into fp8DeferredCodesBuffer_ (bindArena).
  void bindFp8Amaxes();
  /// Context parallelism's instructions (ContextParallelOps.cpp):
  /// attention_block, attention_merge, attention_delta,
  /// attention_block_grad, and position_ids, rope and dropout at global
  /// positions (context_size > 1).
  void executeContextParallel(size_t position, const Instruction &inst,
                              const MicroBatchKey &key);
  /// Whether `inst` is one of those (ContextParallelOps.cpp).
  static bool isContextParallelInstruction(const Instruction &inst);
  /// The mixture-of-experts instructions (MoeOps.cpp): the refusals by
  /// name (expert parallelism, the kernels' limits), the scratch and host
  /// buffer they share (sized once, outside the memory plan), and their
  /// launches. A grouped GEMM reads its experts' row counts back to the
  /// host (the stream synchronized), so that MoE functions run without a
  /// CUDA graph (graphObstacle).
  void checkMoe(size_t position, const Instruction &inst) const;
  void prepareMoe();
  void executeMoe(size_t position, const Instruction &inst);
  /// A routing instruction's router, from its logits' shape.
  host::MoeRouter moeRouter(const Instruction &inst) const;
  /// The experts a layout instruction's indices may name.
  int64_t moeLayoutExperts(const Instruction &inst) const;
  /// Enqueues every instruction, timed with the profiling events when
  /// `timed`.
  void executeAll(const MicroBatchKey &key, bool timed);
  /// Replays the step's graph (capturing it first, or again when the bound
  /// inputs moved; else updating its stepped kernels to `key`). False, with
  /// graphs off for this executor and the reason kept, when a capture or
  /// update fails: the caller then runs the instructions one by one.
  bool replayGraph(const MicroBatchKey &key);
  /// Why this function runs without a CUDA graph (options, host-run
  /// instructions), or nullopt.
  std::optional<std::string> graphObstacle() const;
  /// Appends each floating result of instruction `position` to the value
  /// trace (core/ValueTrace.h), its stream synchronized.
  void traceResults(ValueTrace &trace, size_t position);
  /// The trace's live values: the instruction that wrote each (-1: not
  /// live), and the sum of its absolute values then.
  std::vector<int64_t> traceLive_;
  std::vector<double> traceSums_;
  /// Whether `inst`'s kernels take the micro-batch's first sample (dropout
  /// keys) or fp16's loss scale (the loss-seed fill): the instructions the
  /// graph updates before each replay. Every op whose dispatch passes the
  /// key (or the loss scale) to a kernel must be here.
  bool usesStep(const Instruction &inst) const;
  /// Whether `inst` is a collective over a group of more than one rank: a
  /// communicator call, on the communication stream.
  bool communicates(const Instruction &inst) const;
  /// Whether `op` exchanges by sends and receives (shift, all_to_all):
  /// PeerGroup's kernels never run it, and in-process ranks stage it
  /// through the host.
  static bool pointToPoint(Op op) {
    return op == Op::Shift || op == Op::AllToAll;
  }
  /// The rank's block of the vocabulary of a vocabulary-split embedding or
  /// cross-entropy instruction, and the number of blocks ({0, 1} if not
  /// split).
  std::pair<int64_t, int64_t> vocabBlock(size_t position,
                                         const Instruction &inst) const;
  /// Makes what the rank instructions need besides the arena: the
  /// DeviceCollective on the context's stream and the staging of gathers
  /// and scatters along an inner axis (rankStaging_).
  void prepareRankInstructions();
  /// Runs a multi-rank instruction on the device: collectives through
  /// DeviceCollective (the rank's communicators), the rest as kernels.
  void executeRankInstruction(size_t position, const Instruction &inst,
                              const MicroBatchKey &key);
  /// all_reduce, all_gather, reduce_scatter, all_slice and shift.
  void executeCollective(size_t position, const Instruction &inst,
                         const MicroBatchKey &key);
  /// For each communicating collective at s, the position before which the
  /// compute stream waits for it (awaitedBefore_): the first later
  /// instruction that reads its result, or whose `free` lists its operand
  /// or result (its memory may be written from there), else the end.
  void planCollectiveWaits();
  /// Makes the compute stream wait for the collectives awaited before
  /// `position` (the instruction count: the run's end).
  void awaitCollectives(size_t position);

  const Bundle &bundle_;
  const Function *function_ = nullptr;
  ParameterStore &parameters_;
  comm::RankContext *rank_ = nullptr;
  /// The communicator calls of the rank instructions, on the context's
  /// stream (multi-rank bundles only).
  std::unique_ptr<DeviceCollective> collective_;
  /// Device staging of the rank instructions: vocab_cross_entropy_grad's
  /// shared factor (compute stream), and apart from it (communication
  /// stream) an all_gather's ranks' blocks before they are interleaved
  /// along an inner axis, a reduce_scatter's blocks made contiguous. Not
  /// in the compiler's memory plan (docs/Memory.md).
  DeviceBuffer rankStaging_, collectiveStaging_;
  /// The mixture-of-experts instructions' scratch (the routing's layout,
  /// capacity marks, the aux loss's sums) and the experts' row offsets read
  /// back by a grouped GEMM. Not in the compiler's memory plan
  /// (docs/MoE.md).
  DeviceBuffer moeScratch_;
  /// By routing value and expert count: the offsets read back in run
  /// moeOffsetsRun_ (a layer's GEMMs share one routing, written once per
  /// run).
  std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> moeOffsets_;
  int64_t moeOffsetsRun_ = -1;
  /// The communication stream (the context's, when the function
  /// communicates on the device), and per instruction the events its
  /// collective starts after and ends with.
  cudaStream_t commStream_ = nullptr;
  std::vector<cudaEvent_t> collectiveStart_, collectiveDone_;
  /// By position: the collectives the compute stream waits for before it
  /// (the last entry: at the end).
  std::vector<std::vector<size_t>> awaitedBefore_;
  /// Profiling: each collective's begin and end on the communication
  /// stream (timed events), and the last timed run's timeline.
  std::vector<cudaEvent_t> commBegin_, commEnd_;
  std::vector<TimelineEntry> timeline_;
  Context &context_;
  bool bf16_ = false;
  double lossScale_ = 1.0;
  /// Each instruction's kernel block, its pairing and how long it is kept
  /// (planKernelBlocks).
  static constexpr size_t kNoPartner = ScratchPlan::kNoPartner;
  ScratchPlan kernelBlocks_;
  /// Each GEMM's kernel block ends with cuBLASLt's workspace (the plan
  /// holds it: planHoldsGemmWorkspace); otherwise the Gemm's own.
  bool gemmWorkspaceInPlan_ = false;
  /// By value: held in bf16 in its slot (its first half; planBf16Values).
  std::vector<bool> bf16Value_;
  Bf16Boundary bf16Boundary_;
  /// By value: the first and the last GEMM reading it (kNoPartner: none);
  /// its bf16 copy lives from one to the other.
  std::vector<size_t> bf16MadeAt_, bf16Until_;
  /// By value: the parameter it is a view of (get_parameter), or -1.
  std::vector<int64_t> parameterOf_;
  /// By producer (planFp8Casts): the fp8_quantize it casts for and the
  /// meta whose scale that quantize reads, or kNoPartner; for a
  /// swiglu_grad, the second gradient's fp8_quantize (later) and meta.
  std::vector<size_t> fp8CastOf_, fp8CastMeta_, fp8SecondCastOf_,
      fp8SecondCastMeta_;
  /// The codes of a swiglu_grad's first and second casts: their slots
  /// point into fp8DeferredCodesBuffer_[0] and [1], one swiglu_grad's at a
  /// time (bindFp8Amaxes).
  std::vector<int64_t> fp8DeferredCodes_[2];
  DeviceBuffer fp8DeferredCodesBuffer_[2];
  /// By fp8_quantize: the producer that may cast for it, or kNoPartner.
  std::vector<size_t> fp8CastProducer_;
  /// The FP8 GEMMs' staging (reserveFp8Staging): its bytes, and where a
  /// weight gradient's transposed input and the regions of transposed
  /// output gradients (each of fp8TransposedGradBytes_) go, beyond every
  /// instruction's block. By instruction: a weight gradient that reads the
  /// transposed input the previous one left there; the region an output
  /// gradient's fp8_quantize (or the swiglu_grad fused with it) writes its
  /// codes transposed to, and the region a weight gradient reads them from
  /// (kNoPartner: none).
  size_t fp8StagingBytes_ = 0, fp8TransposedInputAt_ = 0,
         fp8TransposedGradAt_ = 0, fp8TransposedGradBytes_ = 0;
  std::vector<bool> fp8ReusesTransposedInput_;
  std::vector<size_t> fp8TransposedGradOf_, fp8GradTransposedIn_;
  size_t transposedGradAt(size_t region) const {
    return fp8TransposedGradAt_ + region * fp8TransposedGradBytes_;
  }
  /// The metas' inverse scales in the staging (fp8InverseTable): where,
  /// and the FP8 GEMM that makes them each run (kNoPartner: none reads
  /// them); by value: the meta an fp8_scale reads, or kNoPartner.
  size_t fp8InverseTableAt_ = 0, fp8InverseTableMadeAt_ = kNoPartner;
  std::vector<size_t> fp8MetaOfValue_;
  /// By value: where in the staging a weight's codes are kept transposed
  /// by its cast (fp8_quantize) for the data gradients that read them
  /// (fp8_linear without transpose_weight), from fp8KeptTransposesAt_;
  /// kNoPartner: none.
  size_t fp8KeptTransposesAt_ = 0;
  std::vector<size_t> fp8KeptTransposeOf_;
  /// Every fp8_quantize's amax (planFp8Amaxes): the values, their floats
  /// in that order, and the instruction that zeroes them all each run
  /// (kNoPartner: no cast). A memset a cast was 288 graph nodes a step at
  /// llama-1.5b.
  std::vector<int64_t> fp8AmaxValues_;
  DeviceBuffer fp8Amaxes_;
  size_t fp8AmaxesZeroedAt_ = kNoPartner;
  /// By instruction: the parameter whose gradient a weight-gradient GEMM
  /// adds its product into (planGemmAccumulation), or -1.
  std::vector<int64_t> gemmAccumulates_;
  /// By instruction: an accumulate_gradient done by its GEMM.
  std::vector<bool> accumulatedByGemm_;
  /// By value: the operand whose memory a reshape's result shares, or -1.
  std::vector<int64_t> aliasOf_;
  /// Attention views (planAttentionViews): each group's bytes, members,
  /// live positions and offset in the view region.
  struct ViewGroup {
    size_t bytes = 0, first = 0, last = 0, offset = 0;
    std::vector<int64_t> members;
  };
  std::vector<ViewGroup> viewGroups_;
  /// By value: its group (-1: none), its byte offset in the group's block,
  /// and its strides as a piece (position, head; {0, 0}: packed).
  std::vector<int64_t> viewGroupOf_;
  std::vector<size_t> viewOffset_;
  std::vector<std::array<int64_t, 2>> viewStrides_;
  /// By instruction: a split or concat that copies nothing (a view group's).
  std::vector<bool> elided_;
  /// By instruction: flash attention through cuDNN (planCudnnAttention).
  std::vector<bool> cudnnAttention_;
  std::string cudnnDeclined_;
  /// The view region: its offset in the arena (the plan's bytes, aligned)
  /// and size (0 when the bundle's plan places the views).
  size_t viewRegion_ = 0, viewBytes_ = 0;
  /// The bundle's memory plan places view groups (issue 21).
  bool viewsInPlan_ = false;
  /// The bundle's generated kernels, when the function has fused groups.
  std::unique_ptr<FusedKernelLibrary> fusedKernels_;
  ArenaPlan plan_;
  ArenaMemory arena_;
  /// Whether slots_ point into the arena (a shared one: from the first run).
  bool arenaBound_ = false;
  std::vector<void *> slots_;
  std::vector<IdCheck> idChecks_;
  /// Profiling: an event before each instruction and one after the last;
  /// milliseconds and counts by op.
  std::vector<cudaEvent_t> events_;
  std::vector<double> opMilliseconds_;
  std::vector<int64_t> opCounts_;
  /// By instruction position (ContextOptions::profileInstructions).
  std::vector<double> instructionMilliseconds_;
  int64_t profiledRuns_ = 0;
  /// Host wall-clock milliseconds of the profiled runs (inputs up to outputs
  /// back).
  double profiledWallMilliseconds_ = 0;
  /// Runs so far (the first is never timed nor captured).
  int64_t runs_ = 0;
  /// CUDA graphs: one per set of bound input slots, up to kBoundGraphs (a
  /// pipeline stage's backward reads each stash slot's buffers in place),
  /// the least recently used replaced; each with the step its kernels hold
  /// and the loss scale its loss-seed fill was captured or refreshed with
  /// (the fill is a stepped instruction).
  struct BoundGraph {
    std::vector<void *> inputSlots;
    StepGraph graph;
    MicroBatchKey key;
    double lossScale = 1.0;
    int64_t lastRun = 0;
    /// The in-process groups' calls the graph holds, released at each
    /// launch (PeerGroup::post, await).
    std::vector<DeviceCollective::CapturedCalls> peerCalls;
  };
  static constexpr size_t kBoundGraphs = 8;
  /// The launch gate of graphs holding PeerGroup calls: the group of the
  /// ranks the function's collectives connect (attached at the first such
  /// graph), and this rank in it.
  std::shared_ptr<PeerGroup> launchGate_;
  int gateRank_ = 0;
  std::vector<std::unique_ptr<BoundGraph>> graphs_;
  /// Which instructions a graph updates per step.
  std::vector<bool> stepped_;
  /// Why there is no graph (graphObstacle, or the failure that turned it
  /// off); empty while graphs are on.
  std::string graphOff_;
  /// setDeferredCollectiveJoin.
  bool deferJoin_ = false;
  std::function<void(size_t)> observer_;
  int64_t graphCaptures_ = 0, graphReplays_ = 0;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_EXECUTOR_H
