// Mixed precision on the device: the kernels' table of which operands and
// results they take in bf16; the values held in bf16, as the bundle
// declares them (format version 8: the compiler's mt-mixed-precision typed
// them from the same table) or, for older bf16 bundles, as chosen here;
// and the bf16 copies of the fp32 values that GEMMs read.
#include "cuda/Executor.h"

#include "core/OpShapes.h"
#include "cuda/CudaCheck.h"
#include "cuda/ParameterStore.h"
#include "cuda/kernels/Kernels.h"

#include <algorithm>
#include <numeric>

namespace mtrt::cuda {

namespace {

size_t roundUp(size_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

/// Ops whose kernels read and write every operand and result in fp32 or
/// bf16: the byte copies (reshape, split, concat: operand and result share
/// a type) and Elementwise.cu's, Rope.cu's and Shape.cu's launchers.
bool takesEitherType(Op op) {
  switch (op) {
  case Op::Reshape:
  case Op::Split:
  case Op::Concat:
  case Op::Add:
  case Op::Mul:
  case Op::Dropout:
  case Op::Gelu:
  case Op::GeluGrad:
  case Op::Silu:
  case Op::SiluGrad:
  case Op::Swiglu:
  case Op::SwigluGrad:
  case Op::Softmax:
  case Op::SoftmaxGrad:
  case Op::Rope:
  case Op::Transpose:
  case Op::Cast: // Precision.cu's roundToBf16 and widenBf16
    return true;
  default:
    return false;
  }
}

/// Values that must share one storage type: a byte copy's operand and
/// result, a GeLU epilogue's result and auxiliary matrix, flash attention's
/// inputs (and its gradient's outputs), a result computed in place of an
/// operand.
class TypeGroups {
public:
  explicit TypeGroups(size_t values) : parent_(values) {
    std::iota(parent_.begin(), parent_.end(), 0);
  }
  size_t find(size_t v) {
    while (parent_[v] != v)
      v = parent_[v] = parent_[parent_[v]];
    return v;
  }
  void join(int64_t a, int64_t b) {
    parent_[find(static_cast<size_t>(a))] = find(static_cast<size_t>(b));
  }

private:
  std::vector<size_t> parent_;
};

} // namespace

bool Executor::readsBf16(const Instruction &inst, size_t operand) const {
  if (takesEitherType(inst.op))
    return true;
  switch (inst.op) {
  case Op::Linear:
  case Op::LinearGelu:
  case Op::Matmul:
  case Op::LinearWeightGrad:
  case Op::LinearWeightBiasGrad:
    return operand <= 1; // A and B; a bias stays fp32
  case Op::LinearGeluGrad:
    return operand <= 2; // dy, W and the pre-activation
  case Op::LinearAdd:
    return operand <= 2; // A, B and C; a bias stays fp32
  case Op::LayerNorm:    // x; the weight and bias stay fp32
  case Op::RmsNorm:
    return operand == 0;
  case Op::LayerNormGrad: // dy and x; the weight stays fp32
  case Op::RmsNormGrad:
    return operand <= 1;
  case Op::CrossEntropy: // the logits; the labels are ids
  case Op::BiasGrad:     // dy; the sum is fp32
    return operand == 0;
  case Op::CrossEntropyGrad: // the logits; dloss stays fp32
    return operand == 1;
  case Op::Attention:     // q, k, v: on the flash kernels only (the exact
  case Op::AttentionGrad: // ones are fp32); dy, q, k, v
    return flashAttention(attentionParams(*function_, inst, 0));
  case Op::EmbeddingGrad: // dy; the table's gradient sums in fp32
    return operand == 0;
  case Op::Fused: // the generated kernels' type mask (format version 6)
    return fusedKernels_ && fusedKernels_->takesBf16(operand);
  // The multi-rank instructions (RankOps.cpp), where Megatron-LM keeps bf16:
  // the tensor-parallel sums of activations and their gradients (NCCL's
  // bf16; a max, the vocabulary-parallel loss's, stays fp32), the gathers,
  // scatters and slices of sequence parallelism, bias_add's input (the bias
  // stays fp32) and the vocabulary block's logits.
  case Op::AllReduce:
    return inst.attrs.collectiveReduction == CollectiveReduction::Sum;
  case Op::AllGather:
  case Op::ReduceScatter:
  case Op::AllSlice:
  case Op::Shift:    // the ring's keys and values (and their gradients)
  case Op::AllToAll: // expert parallelism's rows (its experts are ids)
    return true;
  // Context parallelism's blocks (ContextParallelOps.cpp): q, k, v, the
  // outputs and dout either type; the logsumexps and delta stay fp32.
  case Op::AttentionBlock:
    return operand <= 2;
  case Op::AttentionBlockGrad:
    return operand <= 3;
  case Op::AttentionMerge:
    return operand == 0 || operand == 2;
  case Op::AttentionDelta:
    return true;
  case Op::BiasAdd:
  case Op::VocabMax:
  case Op::VocabPartials: // the logits; the labels and the max stay fp32
    return operand == 0;
  case Op::VocabCrossEntropyGrad: // the logits; dloss and the statistics
    return operand == 1;          // stay fp32
  case Op::LinearCrossEntropy: // x and W (one type); the labels are ids.
  case Op::LinearVocabMax:     // (the statistics and the seed stay fp32)
  case Op::LinearVocabPartials:
  case Op::LinearVocabCrossEntropyGrad:
    // Typed bundles only: an older bf16 bundle's W is an fp32 parameter,
    // and the op reads both in one type.
    return bundle_.typedPrecision() && operand <= 1;
  case Op::Scale: // the fused loss's gradient; the factor (a seed) stays fp32
    return operand == 0;
  // The mixture-of-experts layer (MoeOps.cpp): the tokens' rows and the
  // experts' weights; the router, its weights and the indices stay fp32.
  case Op::MoePermute:
  case Op::MoeUnpermute:
  case Op::MoeDispatchRows:
  case Op::MoeCombineRows:
    return operand == 0;
  case Op::MoeProbsGrad:
  case Op::MoeGroupedLinear:
  case Op::MoeGroupedLinearWeightGrad:
    return operand <= 1;

  case Op::Fp8Quantize: // what is cast (a master weight stays fp32)
  case Op::Fp8CurrentScale:
    return operand == 0;
  default:
    return false;
  }
}

bool Executor::writesBf16(const Instruction &inst, size_t result) const {
  if (takesEitherType(inst.op))
    return true;
  using Kind = GemmEpilogue::Kind;
  Kind kind;
  switch (inst.op) {
  case Op::Embedding: // the rows gathered from the fp32 table
  case Op::Fill:
  case Op::CrossEntropyGrad:      // dlogits: Loss.cu writes either type
  case Op::VocabCrossEntropyGrad: // the block's dlogits: VocabParallel.cu's
  case Op::AllGather:             // the collectives: as their operand
  case Op::ReduceScatter:
  case Op::AllSlice:
  case Op::Shift:
  case Op::AllToAll:
  case Op::AttentionBlockGrad: // dq, dk, dv
  case Op::BiasAdd: // Elementwise.cu's addBiasRows
  case Op::Scale:   // Elementwise.cu's scale
  case Op::MoePermute: // the rows (Moe.cu) and the experts' outputs
  case Op::MoeUnpermute:
  case Op::MoeGroupedLinear:
  case Op::MoeDispatchRows: // expert parallelism's blocks (Moe.cu)
  case Op::MoeCombineRows:
    return true;
  case Op::Fp8Linear: // y (a weight gradient stays fp32)
    return result == 0;
  case Op::AllReduce:
    return inst.attrs.collectiveReduction == CollectiveReduction::Sum;
  case Op::LayerNorm: // y
  case Op::RmsNorm:
    return true;
  case Op::AttentionBlock: // out; the logsumexp stays fp32
  case Op::AttentionMerge:
    return result == 0;
  case Op::LayerNormGrad: // dx; the parameter gradients stay fp32
  case Op::RmsNormGrad:
    return result == 0;
  case Op::Attention: // out; dq, dk, dv: on the flash kernels only
  case Op::AttentionGrad:
    return flashAttention(attentionParams(*function_, inst, 0));
  case Op::Fused: // a column sum stays f32
    for (const FusedColumnSum &sum : fusedColumnSums(inst))
      if (sum.result == result)
        return false;
    return fusedKernels_ &&
           fusedKernels_->takesBf16(inst.operands.size() + result);
  case Op::Linear:
  case Op::LinearAdd:
    kind = Kind::None;
    break;
  case Op::LinearGelu: // the result and the pre-activation
    kind = Kind::GeluAux;
    break;
  case Op::LinearGeluGrad: // dx in bf16 (a plain GEMM, then the GeLU
    if (result != 0)       // gradient in place); the bias gradient is fp32
      return false;
    kind = Kind::None;
    break;
  case Op::LinearCrossEntropy:
  case Op::LinearVocabCrossEntropyGrad: {
    // dx, a chunk's rows at a time (OpDispatch.cpp), from bf16 operands
    // (typed bundles); the loss and the weight gradient stay fp32.
    size_t dx = inst.op == Op::LinearCrossEntropy ? 1 : 0;
    if (result != dx || !bundle_.typedPrecision())
      return false;
    const std::vector<int64_t> &w = function_->values[inst.operands[1]].shape;
    int64_t vocab = inst.attrs.transposeWeight ? w[0] : w[1];
    int64_t in = function_->values[inst.operands[0]].shape.back();
    int64_t rows = std::min(inst.attrs.chunkRows,
                            function_->values[inst.operands[2]].numElements);
    return context_.gemm().hasBf16ResultAlgorithm(
        rows, in, vocab, false, !inst.attrs.transposeWeight, Kind::None,
        /*bias=*/false, /*biasGrad=*/false, /*vectorPastResult=*/false);
  }
  default:
    return false;
  }
  LinearDims d = linearDims(*function_, inst);
  bool bias = inst.op == Op::LinearAdd
                  ? inst.operands.size() == 4
                  : inst.op != Op::LinearGeluGrad && inst.operands.size() == 3;
  // Typed plans give a bf16 result's bias vector bytes of its own.
  return context_.gemm().hasBf16ResultAlgorithm(
      d.rows, d.outSize, d.inSize, false, inst.attrs.transposeWeight, kind,
      bias, /*biasGrad=*/false, !bundle_.typedPrecision());
}

void Executor::planTypedBf16Values() {
  const Function &fn = *function_;
  for (size_t v = 0; v < fn.values.size(); ++v)
    bf16Value_[v] = fn.values[v].dtype == DType::BF16;
  // A bundle that asks a kernel for a type it lacks is refused here rather
  // than read as the wrong bytes.
  auto refuse = [&](size_t position, const char *what, size_t index,
                    int64_t v, const char *verb) {
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                where(position) + ": " + what + "[" + std::to_string(index) +
                    "] (value " + std::to_string(v) +
                    ") is bf16, which the CUDA kernels of " +
                    opName(fn.instructions[position].op) + " " + verb +
                    " in fp32 only; recompile the bundle with this "
                    "release's megatron-compile");
  };
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    for (size_t i = 0; i < inst.operands.size(); ++i)
      if (bf16Value_[inst.operands[i]] && !readsBf16(inst, i))
        refuse(position, "operands", i, inst.operands[i], "read");
    for (size_t i = 0; i < inst.results.size(); ++i)
      if (bf16Value_[inst.results[i]] && !writesBf16(inst, i))
        refuse(position, "results", i, inst.results[i], "write");
  }
}

void Executor::planBf16Values() {
  const Function &fn = *function_;
  bf16Value_.assign(fn.values.size(), false);
  if (bundle_.typedPrecision()) {
    planTypedBf16Values();
    return;
  }
  if (!bf16_ || !context_.options().bf16Values)
    return;
  // Held in bf16 only when every producer writes and every reader reads it
  // so; function inputs and outputs (but those of bf16Boundary_) and
  // parameters stay as declared.
  std::vector<bool> eligible(fn.values.size(), false);
  for (const Instruction &inst : fn.instructions)
    for (int64_t r : inst.results)
      eligible[r] = isFloatingPoint(fn.values[r].dtype);
  std::vector<int> boundary(fn.values.size(), 0); // 1: allowed, -1: not
  auto mark = [&](const std::vector<int64_t> &values,
                  const std::vector<size_t> &allowed) {
    for (size_t i = 0; i < values.size(); ++i) {
      bool ok = std::find(allowed.begin(), allowed.end(), i) != allowed.end();
      int &state = boundary[values[i]];
      state = ok && state >= 0 ? 1 : -1;
    }
  };
  mark(fn.inputs, bf16Boundary_.inputs);
  mark(fn.outputs, bf16Boundary_.outputs);
  for (int64_t v : fn.inputs)
    eligible[v] = boundary[v] > 0 && isFloatingPoint(fn.values[v].dtype);
  for (int64_t v : fn.outputs)
    if (boundary[v] < 0)
      eligible[v] = false;
  TypeGroups groups(fn.values.size());
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    for (size_t i = 0; i < inst.results.size(); ++i) {
      int64_t r = inst.results[i];
      if (inst.op == Op::GetParameter || (eligible[r] && !writesBf16(inst, i)))
        eligible[r] = false;
    }
    for (size_t i = 0; i < inst.operands.size(); ++i)
      if (!readsBf16(inst, i))
        eligible[inst.operands[i]] = false;
    switch (inst.op) {
    case Op::AllReduce: // a collective moves one element type
    case Op::AllGather:
    case Op::ReduceScatter:
    case Op::AllSlice:
    case Op::Shift:
    case Op::AllToAll:
      groups.join(inst.operands[0], inst.results[0]);
      break;
    case Op::Reshape:
      groups.join(inst.operands[0], inst.results[0]);
      break;
    case Op::Split:
      for (int64_t piece : inst.results)
        groups.join(inst.operands[0], piece);
      break;
    case Op::Concat:
      for (int64_t piece : inst.operands)
        groups.join(inst.results[0], piece);
      break;
    case Op::LinearGelu: // cuBLASLt's auxiliary matrix has D's type
      groups.join(inst.results[0], inst.results[1]);
      break;
    case Op::LinearAdd: // and so has C
      groups.join(inst.results[0], inst.operands[2]);
      break;
    case Op::Attention:     // the flash kernels take one input type (q, k, v,
    case Op::AttentionGrad: // dout) and one output type (dq, dk, dv)
      for (int64_t operand : inst.operands)
        groups.join(inst.operands[0], operand);
      for (int64_t result : inst.results)
        groups.join(inst.results[0], result);
      break;
    default:
      break;
    }
    // A result the compiler's plan puts in place of an operand (elementwise
    // ops, fused groups) shares its type: element i of each is read and
    // written at the same bytes.
    if (fn.memoryPlan)
      for (int64_t r : inst.results)
        for (int64_t o : inst.operands)
          if (fn.memoryPlan->offsets[r] >= 0 &&
              fn.memoryPlan->offsets[r] == fn.memoryPlan->offsets[o])
            groups.join(r, o);
  }
  std::vector<bool> groupEligible(fn.values.size(), true);
  for (size_t v = 0; v < fn.values.size(); ++v)
    if (!eligible[v])
      groupEligible[groups.find(v)] = false;
  for (size_t v = 0; v < fn.values.size(); ++v)
    bf16Value_[v] = eligible[v] && groupEligible[groups.find(v)];
}

std::pair<int64_t, int64_t>
Executor::gemmOperandValues(const Instruction &inst) const {
  switch (inst.op) {
  case Op::Linear:
  case Op::LinearGelu:
  case Op::LinearGeluGrad:
  case Op::LinearAdd:
  case Op::Matmul:
    return {inst.operands[0], inst.operands[1]};
  case Op::LinearWeightGrad: // x^T dy, or dy^T x for a transposed weight
  case Op::LinearWeightBiasGrad:
    if (inst.attrs.transposeWeight)
      return {inst.operands[1], inst.operands[0]};
    return {inst.operands[0], inst.operands[1]};
  default:
    return {-1, -1};
  }
}

const __nv_bfloat16 *Executor::parameterBf16(int64_t v) const {
  int64_t p = parameterOf_[v];
  return p < 0 ? nullptr : parameters_.bf16Value(static_cast<size_t>(p));
}

void Executor::planBf16Copies() {
  const Function &fn = *function_;
  bf16MadeAt_.assign(fn.values.size(), kNoPartner);
  bf16Until_.assign(fn.values.size(), 0);
  if (!bf16_)
    return;
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    auto [a, b] = gemmOperandValues(fn.instructions[position]);
    for (int64_t v : {a, b}) {
      // A bf16 value is its own copy; a parameter view's is the store's.
      if (v < 0 || bf16Value_[v] || parameterBf16(v))
        continue;
      if (bf16MadeAt_[v] == kNoPartner)
        bf16MadeAt_[v] = position;
      bf16Until_[v] = position;
    }
  }
}

std::vector<SideBufferNeed> Executor::bf16CopiesMadeAt(size_t position) const {
  std::vector<SideBufferNeed> copies;
  auto [a, b] = gemmOperandValues(function_->instructions[position]);
  for (int64_t v : {a, b})
    if (v >= 0 && bf16MadeAt_[v] == position &&
        (copies.empty() || copies.back().copyOf != v))
      copies.push_back(
          {roundUp(sizeof(__nv_bfloat16) *
                   static_cast<size_t>(function_->values[v].numElements)),
           bf16Until_[v], v});
  return copies;
}

Bf16Operands Executor::bf16Operands(size_t position, const Instruction &inst) {
  Bf16Operands operands;
  if (!bf16_)
    return operands;
  auto [a, b] = gemmOperandValues(inst);
  auto copyOf = [&](int64_t v) -> const __nv_bfloat16 * {
    if (bf16Value_[v])
      return static_cast<__nv_bfloat16 *>(slots_[v]);
    if (const __nv_bfloat16 *persistent = parameterBf16(v))
      return persistent;
    auto *copy = reinterpret_cast<__nv_bfloat16 *>(
        static_cast<char *>(arena_.data()) + plan_.copyOffset[v]);
    if (bf16MadeAt_[v] == position)
      MTRT_CUDA_CHECK_LAUNCH(
          roundToBf16(context_.stream(), function_->values[v].numElements,
                      static_cast<const float *>(slots_[v]), copy),
          where(position) + ": rounding an operand to bf16");
    return copy;
  };
  operands.a = copyOf(a);
  operands.b = b == a ? operands.a : copyOf(b);
  operands.result = bf16Value_[inst.results[0]];
  return operands;
}

size_t Executor::bf16ValueCount() const {
  size_t count = 0;
  for (bool held : bf16Value_)
    count += held;
  return count;
}

} // namespace mtrt::cuda
