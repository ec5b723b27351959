// The bundle file (docs/BundleFormat.md) read into memory and validated against
// its schema.
#ifndef MTRT_SRC_CORE_BUNDLE_H
#define MTRT_SRC_CORE_BUNDLE_H

#include "core/Error.h"
#include "mtrt/mtrt.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mtrt {

/// Element types of bundle values, by their manifest names.
/// F8E4M3 and F8E5M2 are FP8 codes (Hopper's e4m3fn and e5m2, format
/// new within version 10: the GEMM operands of FP8 training, core/Fp8.h).
enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, F8E4M3, F8E5M2 };

/// "f32", "i64", ...
const char *dtypeName(DType dtype);
bool isFloatingPoint(DType dtype);
/// Bytes per element as stored in the bundle's own type.
size_t dtypeSize(DType dtype);

/// A value's shape and element type. `numElements` is the product of the
/// dimensions, checked at load to be at most kMaxElements.
struct TensorType {
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  int64_t numElements = 1;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  /// "[8, 128] f32".
  std::string str() const;
};

/// The most elements a value may have: its bytes, even as 8-byte elements,
/// must fit in int64_t.
constexpr int64_t kMaxElements = int64_t(1) << 60;

/// "[8, 128]".
std::string shapeString(const std::vector<int64_t> &shape);

/// The instruction set: the mt dialect's ops without the `mt.` prefix.
enum class Op : uint8_t {
  GetParameter,
  AccumulateGradient,
  Fill,
  PositionIds,
  Embedding,
  LayerNorm,
  RmsNorm,
  Linear,
  Matmul,
  Attention,
  Rope,
  Gelu,
  Silu,
  Swiglu,
  Dropout,
  Add,
  Mul,
  Softmax,
  CrossEntropy,
  Reshape,
  Transpose,
  Split,
  Concat,
  EmbeddingGrad,
  LayerNormGrad,
  RmsNormGrad,
  LinearWeightGrad,
  BiasGrad,
  AttentionGrad,
  GeluGrad,
  SiluGrad,
  SwigluGrad,
  SoftmaxGrad,
  CrossEntropyGrad,
  // Several ranks (docs/BundleFormat.md, "Several ranks").
  AllReduce,
  AllGather,
  ReduceScatter,
  AllSlice,
  BiasAdd,
  // Vocabulary-parallel cross-entropy (docs/BundleFormat.md).
  VocabMax,
  VocabPartials,
  VocabCrossEntropy,
  VocabCrossEntropyGrad,
  // GEMMs fused with their epilogues (docs/BundleFormat.md).
  LinearGelu,
  LinearGeluGrad,
  LinearWeightBiasGrad,
  LinearAdd,
  // A group of elementwise ops run as one generated kernel (version 3).
  Fused,
  // An element type conversion of mixed precision (version 8).
  Cast,
  // The output layer and its loss over chunks of tokens, and the seed's
  // scaling of its gradients (docs/BundleFormat.md).
  LinearCrossEntropy,
  Scale,
  // The vocabulary-parallel output layer over chunks of tokens
  // (docs/BundleFormat.md).
  LinearVocabMax,
  LinearVocabPartials,
  LinearVocabCrossEntropyGrad,
  // Ring attention's blocks under context parallelism (docs/BundleFormat.md,
  // "Context parallelism").
  AttentionBlock,
  AttentionMerge,
  AttentionDelta,
  AttentionBlockGrad,
  // The ring's exchange: a rotation over one grid axis (docs/BundleFormat.md,
  // "Context parallelism").
  Shift,
  // The mixture-of-experts layer (docs/BundleFormat.md, "Mixture of
  // experts"; docs/MoE.md).
  MoeRoute,
  MoeAuxLoss,
  MoeZLoss,
  MoePermute,
  MoeUnpermute,
  MoeGroupedLinear,
  MoeRouteGrad,
  MoeAuxLossGrad,
  MoeZLossGrad,
  MoeProbsGrad,
  MoeGroupedLinearWeightGrad,
  // The tokens each expert kept, for the expert bias's update (new within
  // version 12).
  MoeTokensPerExpert,
  // Expert parallelism's dispatch (docs/BundleFormat.md, "Mixture of
  // experts"): the rows' blocks per expert-parallel rank, exchanged by
  // all_to_all.
  MoeDispatchRows,
  MoeDispatchExperts,
  MoeCombineRows,
  AllToAll,
  // FP8 GEMMs and their scaling state (docs/BundleFormat.md, "FP8", new
  // within version 10).
  Fp8Scale,
  Fp8CurrentScale,
  Fp8Quantize,
  Fp8Linear,
  Fp8LinearWeightGrad,
  Fp8Update,
};

/// The number of ops (for tables indexed by Op).
constexpr size_t kOpCount = static_cast<size_t>(Op::Fp8Update) + 1;

/// The manifest name of `op` ("layer_norm_grad").
const char *opName(Op op);

/// Whether `op` is one of the mixture-of-experts layer's (moe_*, and
/// expert parallelism's all_to_all).
inline bool isMoeOp(Op op) {
  return op >= Op::MoeRoute && op <= Op::AllToAll;
}

/// Whether `op` works on a group of the grid's ranks: the collectives, and
/// all_slice (each rank keeps its slice).
inline bool isGridGroupOp(Op op) {
  return op == Op::AllReduce || op == Op::AllGather ||
         op == Op::ReduceScatter || op == Op::AllSlice || op == Op::Shift ||
         op == Op::AllToAll;
}

/// Whether `op` is one of FP8 training's (fp8_*).
inline bool isFp8Op(Op op) {
  return op >= Op::Fp8Scale && op <= Op::Fp8Update;
}

/// Whether `dtype` holds FP8 codes.
inline bool isFp8(DType dtype) {
  return dtype == DType::F8E4M3 || dtype == DType::F8E5M2;
}

enum class GeluApproximate : uint8_t { Erf, Tanh };
enum class Reduction : uint8_t { Mean, Sum, None };
enum class InitMethod : uint8_t { Normal, Zeros, Ones };
/// How all_reduce and reduce_scatter combine the ranks' values.
enum class CollectiveReduction : uint8_t { Sum, Max };

/// Every attribute an op may carry, already type-checked; an op reads the
/// ones its row of the op table lists. Optional attributes that are absent
/// hold the mt dialect's defaults. Axes are normalized to [0, rank).
struct Attributes {
  int64_t parameter = -1;
  double value = 0;   // fill
  /// fill: the seed of the backward pass (the loss's gradient), which fp16
  /// training multiplies by the loss scale (format version 5).
  bool lossSeed = false;
  double epsilon = 0; // layer_norm, rms_norm and their grads
  bool transposeWeight = false;
  bool transposeLhs = false;
  bool transposeRhs = false;
  bool causal = false;
  std::optional<double> scale; // attention: 1/sqrt(head_dim) when absent
  double dropoutP = 0;         // attention
  int64_t seed = 0;            // attention, dropout
  double base = 0;             // rope
  /// rope's frequency scaling (core/RopeFrequencies.h): scaling_factor
  /// alone is "linear"; with low_freq_factor, high_freq_factor and
  /// original_max_positions, "llama3". Absent: 1 and 0s, unscaled.
  double scalingFactor = 1.0;
  double lowFreqFactor = 0;
  double highFreqFactor = 0;
  int64_t originalMaxPositions = 0;
  /// rope's "yarn" scaling: beta_fast and beta_slow with scaling_factor and
  /// original_max_positions; truncate (true when absent) floors and ceils
  /// the ramp's ends. attention_factor multiplies cos and sin.
  double betaFast = 0;
  double betaSlow = 0;
  bool truncate = true;
  double attentionFactor = 1.0;
  std::optional<int64_t> rotaryDim;
  bool inverse = false;
  GeluApproximate approximate = GeluApproximate::Erf;
  double p = 0; // dropout
  int64_t axis = 0;
  Reduction reduction = Reduction::Mean;
  int64_t ignoreIndex = -100;
  int64_t chunkRows = 0; // linear_cross_entropy: tokens per chunk
  /// linear, linear_gelu, linear_gelu_grad: a --tp-comm-overlap chunk's
  /// rows of the GEMM it is a chunk of (the CUDA backend runs it with the
  /// whole's cuBLASLt algorithm, so that each row is summed as there); 0
  /// for a GEMM of its own.
  int64_t wholeRows = 0;
  /// attention_block, attention_block_grad: the grid axis of the
  /// context-parallel group and its size; the ring step whose keys the
  /// block holds (those of rank (r - key_step) mod context_size), absent
  /// when the keys are every rank's, gathered in rank order.
  int64_t contextAxis = 0;
  int64_t contextSize = 1;
  std::optional<int64_t> keyStep;
  /// shift: the grid axis (one of grid_axes) along which the group's ranks
  /// pass the operand, and by how many places: rank i of that axis sends to
  /// (i + offset) mod n and receives from (i - offset) mod n.
  int64_t shiftAxis = 0;
  int64_t offset = 0;
  std::vector<int64_t> permutation;
  /// Collectives: the grid axes of the group, in the order that ranks the
  /// group (the first axis slowest). Their gather_axis, scatter_axis or
  /// slice_axis is in `axis`.
  std::vector<int64_t> gridAxes;
  CollectiveReduction collectiveReduction = CollectiveReduction::Sum;
  /// dropout, attention, attention_grad in a bundle for several ranks: per
  /// dimension of the tensor that keys the random stream (dropout's x,
  /// attention's q [batch, seq, heads, head_dim]), the grid axes that split
  /// it, as a parameter's split_axes; empty when the tensor is whole.
  std::vector<std::vector<int64_t>> splitAxes;
  /// embedding, embedding_grad, vocab_partials, vocab_cross_entropy_grad:
  /// the grid axes the vocabulary is split over; the rank's block starts at
  /// its index along them times the local vocabulary size. Empty: whole.
  std::vector<int64_t> vocabShardAxes;
  /// fused: the index of its kernel in the bundle's fused kernels.
  int64_t kernel = -1;
  /// The mixture-of-experts router (moe_route, moe_aux_loss and their
  /// grads): experts per token, sigmoid scores instead of softmax, the
  /// top-k weights normalized; capacity routing (moe_route with a
  /// capacity_factor) keeps each expert's highest weights, or with
  /// dropByPosition its first tokens. coeff: the auxiliary losses'.
  /// Group-limited routing (moe_route and its grad): the experts form
  /// numGroups groups and the top-k is taken within the groupTopk best; 0
  /// for none.
  int64_t topk = 0;
  bool sigmoid = false;
  bool normalize = false;
  int64_t numGroups = 0;
  int64_t groupTopk = 0;
  /// moe_aux_loss and its grad: the sequence-level loss's tokens per
  /// sequence; 0 for the loss over all the tokens.
  int64_t sequenceLength = 0;
  std::optional<double> capacityFactor;
  bool dropByPosition = false;
  double coeff = 0;
  /// Expert parallelism's dispatch: the experts of the layer and the ranks
  /// they divide among (moe_dispatch_rows, moe_dispatch_experts,
  /// moe_combine_rows).
  int64_t numExperts = 0;
  int64_t expertRanks = 0;
  /// all_to_all: the axis its blocks are gathered along (split_axis is in
  /// `axis`); both are 0 in the plans written here.
  int64_t concatAxis = 0;
  /// fp8_scale, fp8_update: the index of the meta in the bundle's fp8
  /// section. fp8_current_scale: the format its scale is for, and the
  /// margin (scales divided by 2^margin).
  int64_t meta = -1;
  DType fp8Format = DType::F8E4M3;
  int64_t margin = 0;
};

struct Instruction {
  Op op = Op::Fill;
  std::vector<int64_t> operands;
  std::vector<int64_t> results;
  /// Values whose last use this instruction is.
  std::vector<int64_t> free;
  Attributes attrs;
  /// fused: the group's ops, in order, over the function's values: they
  /// read the instruction's operands and earlier body results and define
  /// its results and the group's inner values (Function::innerValue).
  std::vector<Instruction> body;
};

/// A fused group's column sum (docs/BundleFormat.md, "Fused kernels"): the
/// bias_grad of its body that defines results[result], summing the stored
/// results[summed].
struct FusedColumnSum {
  size_t result = 0;
  size_t summed = 0;
};

/// The column sums of fused instruction `inst`, in body order (empty for
/// other instructions).
std::vector<FusedColumnSum> fusedColumnSums(const Instruction &inst);

/// The compiler's static arena for one function (docs/BundleFormat.md,
/// "Memory plan"), validated at load (core/MemoryPlan.h): every value with
/// memory lies inside the arena, and no two values live at the same time
/// overlap, except a result computed in place of an operand that dies there.
struct MemoryPlan {
  uint64_t alignment = 0;
  uint64_t arenaBytes = 0;
  /// By value index; -1 for values without memory (parameter views).
  std::vector<int64_t> offsets;
  /// A block besides the values (docs/BundleFormat.md, "Memory plan"):
  /// `bytes` at `offset`, live from instruction `instruction` through
  /// instruction `until`; the instruction's kernel block (scratch, state kept
  /// for a later instruction) when `copyOf` is -1, else a bf16 copy of value
  /// `copyOf`.
  struct SideBuffer {
    size_t instruction = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    size_t until = 0;
    int64_t copyOf = -1;
  };
  /// In instruction order; per instruction its kernel block first. Empty
  /// when the plan has no `side_buffers` (bundles before format version 3).
  std::vector<SideBuffer> sideBuffers;
  bool hasSideBuffers = false;
  /// Attention views (`views`, issue 21): by value, the whole whose block
  /// holds it (-1: none) and its byte offset there. A whole and its views
  /// are one block, the whole's, live while any of them is.
  std::vector<int64_t> viewOf;
  std::vector<uint64_t> viewOffset;
  /// The plan has `views` (possibly empty): the compiler decided which
  /// splits and concats the flash kernels elide. Without it (bundles
  /// written before issue 21) the CUDA backend decides on its own.
  bool hasViews = false;

  /// The whole whose block holds value `v`, or -1.
  int64_t wholeOf(size_t v) const { return v < viewOf.size() ? viewOf[v] : -1; }
};

/// The MoE losses a training function reports after its output (format
/// 12): "aux_loss" (the auxiliary losses that the loss includes), then any
/// of these, Megatron-LM's logged values, in this order.
inline constexpr const char *kAuxLossName = "aux_loss";
inline constexpr const char *kLoggedMoeLosses[] = {
    "load_balancing_loss", "seq_load_balancing_loss", "z_loss"};

struct Function {
  std::string name;
  std::vector<int64_t> inputs;
  std::vector<int64_t> outputs;
  /// train_step's outputs by name where the loss is followed by reported
  /// losses (version 12): "loss", "aux_loss" (the MoE auxiliary losses that
  /// the loss includes), then any of kLoggedMoeLosses (Megatron-LM's logged
  /// values). Empty otherwise: one output, the loss.
  std::vector<std::string> outputNames;
  std::vector<TensorType> values;
  std::vector<Instruction> instructions;
  /// By value: whether it is computed inside a fused group and never leaves
  /// it (no memory in the plan; only the group's own ops read it).
  std::vector<bool> innerValue;
  /// Absent in bundles written before the plan existed: backends then plan
  /// (or allocate) on their own.
  std::optional<MemoryPlan> memoryPlan;
};

struct Parameter {
  std::string name;
  TensorType type;
  InitMethod init = InitMethod::Normal;
  /// The normal distribution's standard deviation; 0 for zeros and ones.
  double std = 0;
  bool weightDecay = true;
  /// An MoE router's expert bias (aux-loss-free balancing, new within
  /// format version 12): not trained by the optimizer; its gradient holds
  /// the tokens routed to each expert, and each step adds this rate times
  /// sign(mean - count) to each entry (train::updateExpertBias). 0 for
  /// every other parameter.
  double expertBiasUpdateRate = 0;
  bool isExpertBias() const { return expertBiasUpdateRate > 0; }
  /// Per dimension, the grid axes that split it (the first varies slowest);
  /// empty when the parameter is whole on every rank.
  std::vector<std::vector<int64_t>> splitAxes;
  /// The type of one rank's shard: `type` with each split dimension divided
  /// by the product of its axes' sizes. Equal to `type` without splits.
  TensorType localType;
  /// In a pipeline bundle, the pipeline rank (coordinate along the pipeline
  /// axis) that owns it: the gradient norm counts it there and checkpoints
  /// save it from there. -1 otherwise.
  int64_t pipelineRank = -1;
  /// In a pipeline bundle, every pipeline rank that holds a copy, in
  /// increasing order, pipelineRank first: {pipelineRank}, or for a table
  /// tied across stages (format version 7, `pipeline_ranks`) its embedding
  /// group, over which its gradient is summed each iteration. Empty
  /// otherwise.
  std::vector<int64_t> pipelineRanks;

  /// Whether the rank at pipeline coordinate `pipelineCoordinate` holds a
  /// copy (always, outside a pipeline bundle).
  bool heldOnPipelineRank(int64_t pipelineCoordinate) const {
    if (pipelineRanks.empty())
      return true;
    for (int64_t r : pipelineRanks)
      if (r == pipelineCoordinate)
        return true;
    return false;
  }
};

/// One step of a pipeline rank's schedule (docs/BundleFormat.md,
/// "Pipeline parallelism").
struct PipelineStep {
  enum class Kind : uint8_t {
    Forward,
    Backward,
    SendActivation,
    RecvActivation,
    SendGradient,
    RecvGradient
  };
  Kind kind = Kind::Forward;
  int64_t stage = 0;
  int64_t microBatch = 0;
  /// The other pipeline rank of a send or recv; -1 for compute steps.
  int64_t peer = -1;
};

/// A virtual pipeline stage and its functions (indices into functions()).
struct PipelineStageInfo {
  int64_t stage = 0, rank = 0, firstLayer = 0, numLayers = 0;
  size_t forward = 0, backward = 0, eval = 0;
  /// predict_step_stage<k> (version 11): tokens or the previous stage's
  /// activation to the next activation, or the logits on the last stage.
  std::optional<size_t> predict;
  /// The forward's output 1 is the stage's MoE auxiliary losses, a scalar
  /// added to the micro-batch's loss (its gradient is the backward's fill
  /// marked loss_seed); the stash follows it.
  bool auxLoss = false;
  /// `reported_losses` (version 12): the names of the forward's outputs
  /// after aux_loss, any of "load_balancing_loss" and "z_loss" (Megatron-LM's
  /// logged values, the stage's part of their means); the stash follows.
  std::vector<std::string> reportedLosses;
  /// The names of the forward's outputs between its output and its stash:
  /// "aux_loss", then reportedLosses; none without auxLoss.
  std::vector<std::string> reportedOutputs() const {
    std::vector<std::string> names;
    if (auxLoss)
      names.push_back(kAuxLossName);
    names.insert(names.end(), reportedLosses.begin(), reportedLosses.end());
    return names;
  }
  /// The forward's outputs before its stash: the output, aux_loss and the
  /// reported losses.
  size_t leadingOutputs() const { return 1 + auxLoss + reportedLosses.size(); }
};

/// The manifest's `pipeline` section.
struct PipelineInfo {
  /// The grid axis of the pipeline ranks (0).
  int64_t axis = 0;
  int64_t size = 1, virtualStages = 1, microBatches = 1;
  std::string schedule, layout;
  std::vector<PipelineStageInfo> stages;
  /// Per pipeline rank, its steps for one iteration.
  std::vector<std::vector<PipelineStep>> ranks;
  /// Per pipeline rank, the idle fraction the compiler's cost model
  /// predicts (empty when absent).
  std::vector<double> predictedIdleFraction;
};

/// The most ranks a grid may have.
constexpr int64_t kMaxGridRanks = int64_t(1) << 16;

/// The coordinates of linear rank `rank` in a grid of `shape` (the last
/// axis fastest: rank = d * tp + t for [dp, tp]).
std::vector<int64_t> gridCoordinates(const std::vector<int64_t> &shape,
                                     int64_t rank);
/// The product of the grid's sizes along `axes`: a collective's group size.
int64_t gridGroupSize(const std::vector<int64_t> &shape,
                      const std::vector<int64_t> &axes);
/// The linear index of `coordinates` along `axes`, the first axis slowest:
/// a rank's position in its group, or in a split dimension.
int64_t gridGroupIndex(const std::vector<int64_t> &shape,
                       const std::vector<int64_t> &coordinates,
                       const std::vector<int64_t> &axes);
/// The grid axes of the data-parallel ranks, the first slowest: the data
/// axis after the pipeline axis (`pipelined`), and the next one too where
/// the data axis alone is smaller than `dataParallelSize` (expert
/// parallelism over part of the data-parallel ranks: the grid
/// [edp, ep, tp], docs/MoE.md). Empty when the grid has no such axes.
std::vector<int64_t> gridDataAxes(const std::vector<int64_t> &shape,
                                  bool pipelined, int64_t dataParallelSize);
/// Per dimension, the offset of the shard of `parameter` that the rank at
/// `coordinates` holds in the global tensor.
std::vector<int64_t> shardOffsets(const Parameter &parameter,
                                  const std::vector<int64_t> &gridShape,
                                  const std::vector<int64_t> &coordinates);
/// The global tensor's row-major index of element `local` (row-major) of
/// the shard of `parameter` at `offsets` (shardOffsets).
int64_t shardElementIndex(const Parameter &parameter,
                          const std::vector<int64_t> &offsets, int64_t local);

/// The manifest's `model` object.
struct ModelConfig {
  std::string name;
  int64_t numLayers = 0;
  int64_t hiddenSize = 0;
  int64_t numAttentionHeads = 0;
  int64_t numQueryGroups = 0;
  int64_t ffnHiddenSize = 0;
  int64_t seqLength = 0;
  int64_t vocabSize = 0;
  int64_t paddedVocabSize = 0;
  int64_t microBatchSize = 0;
  int64_t globalBatchSize = 0;
  int64_t tensorModelParallelSize = 0;
  int64_t pipelineModelParallelSize = 0;
  int64_t dataParallelSize = 0;
  std::string precision;
};

/// The manifest's `kernels` section (format version 3): the generated
/// kernels of the fused groups, compiled by megatron-compile with nvrtc.
/// Their launch contract is include/megatron/Target/FusedKernels.h's.
struct FusedKernels {
  /// The GPU architecture of `cubin` ("sm_90"); `ptx` is for later ones.
  std::string arch;
  /// Entry points, by the index a fused instruction's `kernel` holds.
  std::vector<std::string> names;
  std::string cubin, ptx, source;
  /// Format version 6: the kernels take a storage-type mask (each operand
  /// and result fp32 or bf16); versions 3 to 5: no mask, all fp32.
  bool typeMask = false;
  /// Format version 7: the kernels key their dropout masks on the sample
  /// (a random::MaskTile argument); before, on the micro-batch step, which
  /// the runtime no longer draws (it refuses such a kernel's dropout).
  bool sampleKeys = false;
  /// Format version 10: one dropout draw serves four positions, as the
  /// runtime draws them; versions 7 to 9 drew one per element (the runtime
  /// refuses such a kernel's dropout).
  bool fourPositionDraws = false;
  /// The bundle's format version (for messages).
  int64_t version = 0;
};

/// The manifest's `gradient_buffer` (format version 2): the contiguous
/// buffer that the data-parallel gradient reduction works on once per
/// iteration, as Megatron-LM's DistributedDataParallel does. Parameter
/// parameters[i]'s (shard's) gradient, flattened, lies at elements
/// [offsets[i], offsets[i] + its local element count); the rest, up to
/// `size`, is padding (zero).
/// One bucket of a gradient buffer (format version 9, Megatron-LM's
/// --overlap-grad-reduce): elements [offset, offset + size) of the buffer,
/// reduced by `reduceFunction` ([size] -> [size], an all-reduce over the
/// buffer's group), in the last micro-batch of an iteration as soon as
/// instruction `readyAfter` of function `readyFunction` has run (every
/// gradient in the bucket is then accumulated), while the step goes on;
/// with an empty `readyFunction`, after the step (a pipeline rank: after
/// its schedule). The buckets tile the buffer in order.
///
/// New within format version 10, under the distributed optimizer, with a
/// `gatherFunction`: the shards are per bucket (Megatron-LM's), each bucket
/// padded to a multiple of the group. `reduceFunction` reduce-scatters
/// ([size] ->
/// [size / group]: group rank r receives the bucket's elements
/// [offset + r size / group, offset + (r + 1) size / group)) and
/// `gatherFunction` all-gathers the bucket's updated parameters ([size /
/// group] -> [size]); a rank's shard is its part of every bucket, in bucket
/// order. With the buffer's overlapParamGather, the bucket's gather of the
/// updated parameters runs in the next iteration's first micro-batch,
/// before instruction `gatherBefore` of `gatherBeforeFunction` (the first
/// that reads one of the bucket's parameters), or with none named before
/// the step.
struct GradientBucket {
  int64_t offset = 0, size = 0;
  std::string reduceFunction;
  std::string readyFunction;
  int64_t readyAfter = -1;
  std::string gatherFunction;
  std::string gatherBeforeFunction;
  int64_t gatherBefore = -1;
};

struct GradientBuffer {
  std::vector<int64_t> parameters;
  std::vector<int64_t> offsets;
  int64_t size = 0;
  /// The group the buffer is reduced over (the data-parallel axis).
  std::vector<int64_t> gridAxes;
  /// Reduce-scatter and shard the optimizer (function reduce_gradients:
  /// [size] -> [size / group], gather_parameters: [size / group] -> [size])
  /// instead of all-reduce (reduce_gradients: [size] -> [size]).
  bool distributedOptimizer = false;
  /// The functions that reduce the buffer and gather the parameters: those
  /// above, or in a pipeline bundle's `gradient_buffers` (format version 7)
  /// the pipeline rank's own (reduce_gradients_pp<r>, gather_parameters_pp<r>).
  std::string reduceFunction = "reduce_gradients";
  std::string gatherFunction = "gather_parameters";
  /// The pipeline rank whose stages' gradients the buffer holds; -1 for the
  /// one buffer of a bundle without a pipeline.
  int64_t pipelineRank = -1;
  /// Empty: the buffer is reduced whole, by reduceFunction, after the last
  /// micro-batch. Else the buckets replace that reduction (with the
  /// distributed optimizer the rank then keeps its range of the reduced
  /// buffer; gatherFunction is unchanged).
  std::vector<GradientBucket> buckets;
  /// Whether the buckets hold the distributed optimizer's shards (their
  /// gatherFunction is set).
  bool bucketShards() const {
    return !buckets.empty() && !buckets.front().gatherFunction.empty();
  }
  /// Megatron-LM's --overlap-param-gather: after the optimizer step each
  /// bucket's parameters are gathered only before their first use
  /// (GradientBucket::gatherBefore).
  bool overlapParamGather = false;
};

/// One tensor's delayed-scaling state (an mt.fp8_meta): the format its
/// casts make; the runtime keeps its scale and amax history.
struct Fp8Meta {
  std::string name;
  DType format = DType::F8E4M3;
  /// A pipeline bundle's: the pipeline rank whose stages cast with the
  /// meta and update it (checkpoints save its state from there); -1 else.
  int64_t pipelineRank = -1;
};

/// The manifest's `fp8` section (new within format version 10): how the bundle's FP8
/// GEMMs are scaled, and the metas its fp8_scale and fp8_update name.
struct Fp8Settings {
  /// "e4m3" or "hybrid"; "delayed" or "tensorwise".
  std::string format, scaling;
  int64_t amaxHistoryLen = 1;
  /// "max" or "most_recent".
  std::string amaxComputeAlgo = "most_recent";
  int64_t margin = 0;
  std::vector<Fp8Meta> metas;
};

namespace bundle_detail {
class ManifestReader;
} // namespace bundle_detail

/// A bundle that passed every check of docs/BundleFormat.md: the container
/// (magic, version, flags, lengths, SHA-256) and the manifest's schema, with
/// every index, shape, count, attribute and op signature in range. Code that
/// runs a bundle can trust it: value indices address `values`, operands are
/// defined before use, and every op's shapes agree with the op's rules.
///
/// Thread-safety: immutable after load; share it freely.
class Bundle {
public:
  /// The newest version of the format this reader understands, and the
  /// oldest it still reads (version 1 has no gradient_buffer: its steps
  /// reduce every gradient themselves).
  static constexpr uint32_t kFormatVersion = 12;
  static constexpr uint32_t kOldestFormatVersion = 1;
  static constexpr size_t kHeaderSize = 64;

  /// Reads and validates the file at `path`. Throws Error: NOT_FOUND when it
  /// cannot be opened, DATA_LOSS when it is truncated or corrupted,
  /// UNIMPLEMENTED for another format version, INVALID_ARGUMENT for anything
  /// else that breaks the format. Messages name `path`.
  static Bundle load(const std::string &path);

  /// Validates the bytes of a whole bundle file; `name` is what messages
  /// call it.
  static Bundle parse(std::string_view name, const uint8_t *data, size_t size);

  /// Validates a manifest alone (no container), e.g. one built in a test.
  static Bundle parseManifest(std::string_view name, std::string_view json);

  /// As parseManifest, with the payload the manifest's `kernels` section
  /// points into.
  static Bundle parseManifest(std::string_view name, std::string_view json,
                              std::string_view payload);

  const std::string &name() const { return name_; }
  const std::string &producer() const { return producer_; }
  /// The SHA-256 of the manifest and payload, as stored in the container's
  /// header (64 hexadecimal digits); empty for parseManifest.
  const std::string &sha256Hex() const { return sha256_; }
  /// The configuration the bundle was compiled from: present when it was
  /// compiled from a model file (megatron-compile), absent for bundles
  /// translated from IR (megatron-translate), where model() is all zeros.
  bool hasModel() const { return hasModel_; }
  const ModelConfig &model() const { return model_; }
  const std::vector<Parameter> &parameters() const { return parameters_; }
  const std::vector<Function> &functions() const { return functions_; }
  /// Format version 8 on: the values' dtypes say what a backend stores
  /// (mixed precision is the compiler's mt-mixed-precision). Before, a
  /// bf16 bundle declared every value f32 and the CUDA backend chose which
  /// to hold in bf16 (cuda/Bf16Values.cpp).
  bool typedPrecision() const { return typedPrecision_; }
  /// Whether the manifest has an `fp8` section (FP8 GEMMs).
  bool hasFp8() const { return fp8_.has_value(); }
  /// The `fp8` section; only when hasFp8().
  const Fp8Settings &fp8() const { return *fp8_; }
  /// Whether the manifest has a `grid` (a bundle for several ranks).
  bool hasGrid() const { return !gridShape_.empty(); }
  /// The grid's sizes per axis ([dp, tp]); empty without a grid.
  const std::vector<int64_t> &gridShape() const { return gridShape_; }
  /// The number of ranks: the product of the grid's sizes, 1 without one.
  int64_t rankCount() const;

  /// Whether the manifest has a `gradient_buffer` (or, in a pipeline
  /// bundle, `gradient_buffers`): the data-parallel gradient reduction runs
  /// once per iteration, in the buffer's reduce function.
  bool hasGradientBuffer() const { return !gradientBuffers_.empty(); }
  /// The buffer of the rank at `coordinates`: the bundle's one buffer, or
  /// in a pipeline bundle that of its pipeline rank (coordinate 0).
  const GradientBuffer &
  gradientBuffer(const std::vector<int64_t> &coordinates = {}) const;
  /// Every buffer: one, or one per pipeline rank in rank order.
  const std::vector<GradientBuffer> &gradientBuffers() const {
    return gradientBuffers_;
  }

  /// The fused groups' kernels (empty names without any).
  const FusedKernels &fusedKernels() const { return fusedKernels_; }

  /// The function named `name`, or nullptr.
  const Function *findFunction(std::string_view name) const;

  /// The pipeline section of a pipeline-parallel bundle, or nullptr.
  const PipelineInfo *pipeline() const {
    return hasPipeline_ ? &pipeline_ : nullptr;
  }

private:
  friend class bundle_detail::ManifestReader;
  std::string name_;
  std::string producer_;
  std::string sha256_;
  bool hasModel_ = false;
  bool typedPrecision_ = false;
  ModelConfig model_;
  std::vector<Parameter> parameters_;
  std::vector<Function> functions_;
  std::vector<int64_t> gridShape_;
  std::optional<Fp8Settings> fp8_;
  bool hasPipeline_ = false;
  PipelineInfo pipeline_;
  std::vector<GradientBuffer> gradientBuffers_;
  FusedKernels fusedKernels_;
};

} // namespace mtrt

#endif // MTRT_SRC_CORE_BUNDLE_H
