// FP8 training's instructions on the device (issue 26, docs/MixedPrecision.md
// "FP8"): the scales (a meta's, from the store's delayed-scaling state, or
// the tensor's own), the casts with their amax, the linear layer's GEMMs on
// the FP8 tensor cores (cuda::Fp8Gemm) and delayed scaling's update, with
// the host emulation's arithmetic (core/Fp8.h).
//
// cuBLASLt's FP8 products on Hopper take both operands k-contiguous ("TN"),
// so a weight stored [in, out] (a forward with transpose_weight false, or a
// data gradient of an [out, in] weight) and both operands of a weight
// gradient (k is the rows) are transposed first, into the Fp8Gemm's
// staging, as are the inverse scales (a weight's and an output gradient's
// transposes are written by their casts). A linear's bias goes into cuBLASLt's
// epilogue, rounded to bf16 first (its bias type for a bf16 result, and
// what the bf16 GEMMs add: Gemm.cpp); where cuBLASLt has no algorithm for
// that, the product is written in fp32 to the staging and the bias added
// by a kernel, rounding once as the host does. Forward products (those
// before train_step's loss seed, and all of eval_step's and predict_step's)
// use the tensor cores' fast accumulation, as Transformer Engine's do; the
// gradients' products sum in fp32.
#include "cuda/Executor.h"

#include "core/Fp8State.h"
#include "core/OpShapes.h"
#include "core/ValueTrace.h"
#include "cuda/CudaCheck.h"
#include "cuda/ParameterStore.h"
#include "cuda/kernels/Fp8Scaling.h"
#include "cuda/kernels/NormFp8.h"

#include <algorithm>
#include <map>

namespace mtrt::cuda {

namespace {

size_t alignUp(size_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

/// The staging's first block: the two inverse scales, kInverseStride floats
/// apart.
constexpr size_t kInverseStride = kArenaAlignment / sizeof(float);
constexpr size_t kInverseBytes = 2 * kArenaAlignment;

/// The staging an FP8 GEMM instruction uses (executeFp8's layout): the
/// inverse scales, then the transposed weight or output gradient, then the
/// bf16 bias and the fp32 product a bias is added to without the epilogue;
/// 0 for every other instruction (whose operands, if any, are not read:
/// get_parameter has none). A weight gradient's transposed input lies
/// beyond every instruction's block (transposedInputBytes), where the next
/// weight gradient of the same input finds it.
size_t stagingBytes(const Function &fn, const Instruction &inst) {
  if (inst.op != Op::Fp8Linear && inst.op != Op::Fp8LinearWeightGrad)
    return 0;
  const std::vector<int64_t> &x = fn.values[inst.operands[0]].shape;
  int64_t in = x.back(), rows = fn.values[inst.operands[0]].numElements / in;
  if (inst.op == Op::Fp8Linear) {
    const std::vector<int64_t> &w = fn.values[inst.operands[2]].shape;
    int64_t out = inst.attrs.transposeWeight ? w[0] : w[1];
    size_t transposed =
        inst.attrs.transposeWeight ? 0 : alignUp(static_cast<size_t>(in * out));
    size_t bias = inst.operands.size() == 5
                      ? alignUp(sizeof(__nv_bfloat16) * size_t(out)) +
                            alignUp(sizeof(float) * size_t(rows * out))
                      : 0;
    return kInverseBytes + transposed + bias;
  }
  int64_t out = fn.values[inst.operands[2]].shape.back();
  return kInverseBytes + alignUp(static_cast<size_t>(rows * out));
}

/// A weight gradient's transposed input codes (x^T), 0 for other
/// instructions.
size_t transposedInputBytes(const Function &fn, const Instruction &inst) {
  if (inst.op != Op::Fp8LinearWeightGrad)
    return 0;
  return alignUp(static_cast<size_t>(fn.values[inst.operands[0]].numElements));
}

/// Whether the instruction at `position` comes before the function's loss
/// seed (or the function has none): a forward product.
bool inForwardPass(const Function &fn, size_t position) {
  for (size_t i = 0; i < position; ++i)
    if (fn.instructions[i].op == Op::Fill && fn.instructions[i].attrs.lossSeed)
      return false;
  return true;
}

} // namespace

void Executor::reserveFp8Staging() {
  const Function &fn = *function_;
  size_t count = fn.instructions.size();
  // The output gradients whose casts (castToFp8Transposed, or a fused
  // swiglu_grad's) also write their transposed codes for the weight
  // gradient after them: an fp8_quantize read by a weight gradient, each
  // in a region of the staging free from the cast (its producer, when
  // fused: a swiglu_grad writes two gradients' codes at once) to the
  // weight gradient; at most kTransposedGradRegions at once, the rest
  // transposed by their weight gradients.
  constexpr size_t kTransposedGradRegions = 2;
  fp8TransposedGradOf_.assign(count, kNoPartner);
  fp8GradTransposedIn_.assign(count, kNoPartner);
  std::vector<size_t> definedAt(fn.values.size(), kNoPartner);
  for (size_t position = 0; position < count; ++position)
    for (int64_t v : fn.instructions[position].results)
      definedAt[v] = position;
  size_t blocks = 0, transposedInput = 0;
  fp8TransposedGradBytes_ = 0;
  std::vector<size_t> regionBusyUntil;
  for (size_t position = 0; position < count; ++position) {
    const Instruction &inst = fn.instructions[position];
    blocks = std::max(blocks, stagingBytes(fn, inst));
    transposedInput = std::max(transposedInput, transposedInputBytes(fn, inst));
    if (inst.op != Op::Fp8LinearWeightGrad)
      continue;
    size_t cast = definedAt[inst.operands[2]];
    if (cast == kNoPartner || fn.instructions[cast].op != Op::Fp8Quantize ||
        fp8TransposedGradOf_[cast] != kNoPartner)
      continue;
    size_t start = cast, producer = fp8CastProducer_[cast];
    if (producer != kNoPartner) {
      if (fn.instructions[producer].op != Op::SwigluGrad)
        continue; // a norm's or SwiGLU's fused cast writes no transpose
      start = producer;
    }
    size_t region = 0;
    while (region < regionBusyUntil.size() && regionBusyUntil[region] >= start)
      ++region;
    if (region == kTransposedGradRegions)
      continue;
    if (region == regionBusyUntil.size())
      regionBusyUntil.push_back(0);
    regionBusyUntil[region] = position;
    fp8TransposedGradOf_[cast] = region;
    fp8GradTransposedIn_[position] = region;
    fp8TransposedGradBytes_ =
        std::max(fp8TransposedGradBytes_,
                 alignUp(size_t(fn.values[inst.operands[2]].numElements)));
  }
  size_t transposedGrad = fp8TransposedGradBytes_ * regionBusyUntil.size();
  // The GEMMs whose two scales are metas' (delayed scaling) read their
  // inverses from a table of every meta's, made once a run, by the first
  // of them: the scales change only in the step's closing fp8_updates. A
  // kernel per GEMM took 336 launches a step at llama-1.5b.
  fp8MetaOfValue_.assign(fn.values.size(), kNoPartner);
  fp8InverseTableMadeAt_ = kNoPartner;
  for (size_t position = 0; position < count; ++position) {
    const Instruction &inst = fn.instructions[position];
    if (inst.op == Op::Fp8Scale)
      fp8MetaOfValue_[inst.results[0]] = size_t(inst.attrs.meta);
    bool gemm = inst.op == Op::Fp8Linear || inst.op == Op::Fp8LinearWeightGrad;
    if (gemm && fp8InverseTableMadeAt_ == kNoPartner &&
        fp8MetaOfValue_[inst.operands[1]] != kNoPartner &&
        fp8MetaOfValue_[inst.operands[3]] != kNoPartner)
      fp8InverseTableMadeAt_ = position;
  }
  size_t table = fp8InverseTableMadeAt_ == kNoPartner
                     ? 0
                     : alignUp(sizeof(float) * kFp8InverseTableStride *
                               bundle_.fp8().metas.size());
  // A weight's codes read by a data gradient (a product with the weight
  // [out, in] not transposed, which cuBLASLt takes only as [in, out]) are
  // written transposed by the weight's cast too, from the one read of its
  // fp32 master, and kept until then: a transpose of the codes a data
  // gradient (112 a step at llama-1.5b, 0.93 GB read and written) for
  // their bytes of staging (Transformer Engine keeps the weights'
  // "columnwise" copies too).
  fp8KeptTransposeOf_.assign(fn.values.size(), kNoPartner);
  size_t kept = 0;
  for (size_t position = 0; position < count; ++position) {
    const Instruction &inst = fn.instructions[position];
    if (inst.op != Op::Fp8Linear || inst.attrs.transposeWeight)
      continue;
    int64_t weight = inst.operands[2];
    size_t cast = definedAt[weight];
    if (fp8KeptTransposeOf_[weight] != kNoPartner || cast == kNoPartner ||
        fn.instructions[cast].op != Op::Fp8Quantize ||
        fp8CastProducer_[cast] != kNoPartner ||
        fp8TransposedGradOf_[cast] != kNoPartner ||
        fn.values[weight].shape.size() != 2)
      continue;
    fp8KeptTransposeOf_[weight] = kept;
    kept += alignUp(size_t(fn.values[weight].numElements));
  }
  fp8TransposedInputAt_ = alignUp(blocks);
  fp8TransposedGradAt_ = fp8TransposedInputAt_ + transposedInput;
  fp8InverseTableAt_ = fp8TransposedGradAt_ + transposedGrad;
  fp8KeptTransposesAt_ = fp8InverseTableAt_ + table;
  fp8StagingBytes_ = fp8KeptTransposesAt_ + kept;
  if (fp8StagingBytes_ > 0)
    context_.fp8Gemm().staging(fp8StagingBytes_);
  // A weight gradient whose input the previous one transposed (q, k and v
  // read one input, as do gate and up) reads that copy: nothing else
  // writes there.
  fp8ReusesTransposedInput_.assign(count, false);
  int64_t transposedValue = -1;
  for (size_t position = 0; position < count; ++position) {
    const Instruction &inst = fn.instructions[position];
    if (inst.op != Op::Fp8LinearWeightGrad)
      continue;
    fp8ReusesTransposedInput_[position] = inst.operands[0] == transposedValue;
    transposedValue = inst.operands[0];
  }
}

void Executor::planFp8Casts() {
  const Function &fn = *function_;
  size_t count = fn.instructions.size();
  fp8CastOf_.assign(count, kNoPartner);
  fp8CastMeta_.assign(count, kNoPartner);
  fp8SecondCastOf_.assign(count, kNoPartner);
  fp8SecondCastMeta_.assign(count, kNoPartner);
  fp8CastProducer_.assign(count, kNoPartner);
  for (std::vector<int64_t> &values : fp8DeferredCodes_)
    values.clear();
  // A traced run reads every result after its instruction.
  if (ValueTrace::fromEnvironment())
    return;
  std::vector<size_t> uses(fn.values.size(), 0), lastRead(fn.values.size(), 0);
  for (size_t position = 0; position < count; ++position)
    for (int64_t v : fn.instructions[position].operands) {
      ++uses[v];
      lastRead[v] = position;
    }
  for (int64_t v : fn.outputs) {
    ++uses[v];
    lastRead[v] = count;
  }
  size_t deferredBusyUntil = 0;
  for (size_t position = 0; position < count; ++position) {
    const Instruction &producer = fn.instructions[position];
    bool casts = producer.op == Op::Swiglu || producer.op == Op::RmsNorm ||
                 producer.op == Op::LayerNorm || producer.op == Op::SwigluGrad;
    if (!casts)
      continue;
    // The results cast (a norm's others, if any, are not): each read by
    // its quantize only.
    size_t castResults = producer.op == Op::SwigluGrad ? 2 : 1;
    bool used = false;
    for (size_t i = 0; i < castResults; ++i)
      used = used || uses[producer.results[i]] != 1;
    if (used)
      continue;
    std::map<int64_t, size_t> metaOfScale; // fp8_scale results on the way
    // The quantize of `result` at q with a meta's scale: its meta.
    auto castOf = [&](const Instruction &next, int64_t result) {
      auto meta =
          metaOfScale.find(next.op == Op::Fp8Quantize ? next.operands[1] : -1);
      return next.op == Op::Fp8Quantize && next.operands[0] == result &&
                     meta != metaOfScale.end()
                 ? meta->second
                 : kNoPartner;
    };
    size_t first = kNoPartner, firstMeta = kNoPartner;
    for (size_t q = position + 1; q < count; ++q) {
      const Instruction &next = fn.instructions[q];
      if (next.op == Op::Fp8Scale) {
        metaOfScale[next.results[0]] = size_t(next.attrs.meta);
        continue;
      }
      if (next.op == Op::GetParameter)
        continue;
      for (size_t i = 0; i < castResults; ++i)
        if (castOf(next, producer.results[i]) != kNoPartner) {
          first = q;
          firstMeta = castOf(next, producer.results[i]);
        }
      break;
    }
    if (first == kNoPartner)
      continue;
    if (producer.op != Op::SwigluGrad) {
      fp8CastOf_[position] = first;
      fp8CastMeta_[position] = firstMeta;
      fp8CastProducer_[first] = position;
      continue;
    }
    // A swiglu_grad's two gradients: the one whose cast follows, and the
    // other's, cast later (after the first's data and weight gradients).
    // The fused kernel writes both codes into buffers of their own
    // (fp8DeferredCodesBuffer_), which no other value's codes hold
    // meanwhile: the second's arena slot may (the first's codes at
    // llama-1.5b), and the first's may be a gradient's operand (dy, freed
    // there: 3 of llama-1.5b's 16 layers).
    const std::vector<int64_t> &shape = fn.values[producer.results[0]].shape;
    int64_t cols = shape.empty() ? 0 : shape.back();
    int64_t rows =
        cols > 0 ? fn.values[producer.results[0]].numElements / cols : 0;
    if (cols % 16 != 0 || rows % 16 != 0 || rows == 0 ||
        position < deferredBusyUntil)
      continue;
    int64_t other = fn.instructions[first].operands[0] == producer.results[0]
                        ? producer.results[1]
                        : producer.results[0];
    size_t second = kNoPartner, secondMeta = kNoPartner;
    for (size_t q = first + 1; q < count && second == kNoPartner; ++q) {
      const Instruction &next = fn.instructions[q];
      if (next.op == Op::Fp8Scale)
        metaOfScale[next.results[0]] = size_t(next.attrs.meta);
      else if (castOf(next, other) != kNoPartner) {
        second = q;
        secondMeta = castOf(next, other);
      }
    }
    if (second == kNoPartner)
      continue;
    int64_t codes[2] = {fn.instructions[first].results[0],
                        fn.instructions[second].results[0]};
    fp8CastOf_[position] = first;
    fp8CastMeta_[position] = firstMeta;
    fp8SecondCastOf_[position] = second;
    fp8SecondCastMeta_[position] = secondMeta;
    fp8CastProducer_[first] = fp8CastProducer_[second] = position;
    for (int i = 0; i < 2; ++i)
      fp8DeferredCodes_[i].push_back(codes[i]);
    deferredBusyUntil = std::max(lastRead[codes[0]], lastRead[codes[1]]) + 1;
  }
}

bool Executor::fp8CastFused(size_t position) const {
  size_t q = fp8CastOf_[position];
  if (q == kNoPartner)
    return false;
  const Function &fn = *function_;
  auto range = [&](int64_t v) {
    auto *begin = static_cast<const char *>(slots_[v]);
    return std::make_pair(begin, begin + fn.values[v].numElements *
                                             dtypeSize(storageType(v)));
  };
  const Instruction &producer = fn.instructions[position];
  for (size_t cast : {q, fp8SecondCastOf_[position]}) {
    if (cast == kNoPartner)
      continue;
    for (int64_t written : fn.instructions[cast].results)
      for (int64_t read : producer.operands) {
        auto [a, b] = range(written);
        auto [c, d] = range(read);
        if (a < d && c < b)
          return false;
        // swigluBackwardToFp8's 16-byte accesses (of the codes, not the
        // amax).
        if (producer.op == Op::SwigluGrad &&
            ((written == fn.instructions[cast].results[0] &&
              reinterpret_cast<uintptr_t>(a) % 16 != 0) ||
             reinterpret_cast<uintptr_t>(c) % 16 != 0))
          return false;
      }
  }
  return true;
}

void Executor::planFp8Amaxes() {
  const Function &fn = *function_;
  fp8AmaxValues_.clear();
  fp8AmaxesZeroedAt_ = kNoPartner;
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    if (inst.op != Op::Fp8Quantize)
      continue;
    fp8AmaxValues_.push_back(inst.results[1]);
    // A fused producer comes before its quantize, and writes the amax when
    // the pair is fused this run (fp8CastFused): zeroed before either.
    size_t first = fp8CastProducer_[position] != kNoPartner
                       ? fp8CastProducer_[position]
                       : position;
    fp8AmaxesZeroedAt_ = std::min(fp8AmaxesZeroedAt_, first);
  }
  if (!fp8AmaxValues_.empty())
    fp8Amaxes_ = DeviceBuffer(sizeof(float) * fp8AmaxValues_.size(),
                              "the FP8 casts' amaxes of " + fn.name);
  for (int i = 0; i < 2; ++i) {
    size_t deferred = 0;
    for (int64_t codes : fp8DeferredCodes_[i])
      deferred = std::max(deferred, size_t(fn.values[codes].numElements));
    if (deferred > 0)
      fp8DeferredCodesBuffer_[i] =
          DeviceBuffer(deferred, "the FP8 codes a fused swiglu_grad writes "
                                 "ahead of their casts in " +
                                     fn.name);
  }
}

void Executor::bindFp8Amaxes() {
  for (size_t i = 0; i < fp8AmaxValues_.size(); ++i)
    slots_[fp8AmaxValues_[i]] = fp8Amaxes_.as<float>() + i;
  for (int i = 0; i < 2; ++i)
    for (int64_t codes : fp8DeferredCodes_[i])
      slots_[codes] = fp8DeferredCodesBuffer_[i].data();
}

void Executor::executeFusedFp8Cast(size_t position, const Instruction &inst) {
  const Function &fn = *function_;
  const Instruction &cast = fn.instructions[fp8CastOf_[position]];
  cudaStream_t stream = context_.stream();
  std::string what = where(position);
  auto *amax = static_cast<float *>(slots_[cast.results[1]]);
  auto *codes = static_cast<uint8_t *>(slots_[cast.results[0]]);
  const float *scale = parameters_.fp8Scale(fp8CastMeta_[position]);
  fp8::Format format = fp8FormatOf(fn.values[cast.results[0]].dtype);
  auto in = [&](size_t i) -> InElements {
    if (heldInBf16(inst.operands[i]))
      return static_cast<const __nv_bfloat16 *>(slots_[inst.operands[i]]);
    return static_cast<const float *>(slots_[inst.operands[i]]);
  };
  switch (inst.op) { // the amax was zeroed at the run's first cast
  case Op::LayerNorm:
  case Op::RmsNorm: {
    auto [rows, hidden] = normDims(fn, inst);
    NormRows x{slots_[inst.operands[0]], heldInBf16(inst.operands[0])};
    NormRowsOut y{slots_[inst.results[0]], heldInBf16(inst.results[0])};
    NormFp8Out into{codes, scale, amax, format};
    auto *weight = static_cast<const float *>(slots_[inst.operands[1]]);
    if (inst.op == Op::LayerNorm)
      MTRT_CUDA_CHECK_LAUNCH(layerNormToFp8(stream, rows, hidden, x, weight,
                                            inst.operands.size() == 3
                                                ? static_cast<const float *>(
                                                      slots_[inst.operands[2]])
                                                : nullptr,
                                            inst.attrs.epsilon, y, into),
                             what);
    else
      MTRT_CUDA_CHECK_LAUNCH(rmsNormToFp8(stream, rows, hidden, x, weight,
                                          inst.attrs.epsilon, y, into),
                             what);
    break;
  }
  case Op::Swiglu:
    MTRT_CUDA_CHECK_LAUNCH(
        swigluToFp8(stream, fn.values[inst.operands[0]].numElements, in(0),
                    in(1), heldInBf16(inst.results[0]), codes, format, scale,
                    amax),
        what);
    break;
  case Op::SwigluGrad: { // dy, gate, up -> dgate, dup: both cast
    SwigluGradFp8 sinks[2];
    for (auto [q, meta] :
         {std::pair{fp8CastOf_[position], fp8CastMeta_[position]},
          std::pair{fp8SecondCastOf_[position],
                    fp8SecondCastMeta_[position]}}) {
      const Instruction &quantize = fn.instructions[q];
      size_t k = quantize.operands[0] == inst.results[0] ? 0 : 1;
      SwigluGradFp8 &sink = sinks[k];
      sink.codes = static_cast<uint8_t *>(slots_[quantize.results[0]]);
      if (fp8TransposedGradOf_[q] != kNoPartner)
        sink.transposed = reinterpret_cast<uint8_t *>(
            static_cast<char *>(context_.fp8Gemm().staging(fp8StagingBytes_)) +
            transposedGradAt(fp8TransposedGradOf_[q]));
      sink.scale = parameters_.fp8Scale(meta);
      sink.amax = static_cast<float *>(slots_[quantize.results[1]]);
      sink.format = fp8FormatOf(fn.values[quantize.results[0]].dtype);
      sink.roundToBf16 = heldInBf16(inst.results[k]);
    }
    int64_t cols = fn.values[inst.results[0]].shape.back();
    int64_t rows = fn.values[inst.results[0]].numElements / cols;
    bool launched = false;
    MTRT_CUDA_CHECK_LAUNCH(launched = swigluBackwardToFp8(stream, rows, cols,
                                                          in(1), in(2), in(0),
                                                          sinks[0], sinks[1]),
                           what);
    if (!launched) // planFp8Casts and fp8CastFused check what it needs
      throw Error(MTRT_STATUS_INTERNAL,
                  what + ": swiglu_grad's fused FP8 casts were declined");
    break;
  }
  default:
    throw Error(MTRT_STATUS_INTERNAL,
                what + ": " + opName(inst.op) + " does not cast to FP8");
  }
}

void Executor::executeFp8(size_t position, const Instruction &inst) {
  const Function &fn = *function_;
  const Attributes &a = inst.attrs;
  cudaStream_t stream = context_.stream();
  std::string what = where(position);
  auto operand = [&](size_t i) { return slots_[inst.operands[i]]; };
  auto result = [&](size_t i) { return slots_[inst.results[i]]; };
  auto scalar = [&](void *slot) { return static_cast<float *>(slot); };
  auto codes = [&](void *slot) { return static_cast<uint8_t *>(slot); };
  auto formatOf = [&](int64_t v) { return fp8FormatOf(fn.values[v].dtype); };
  auto source = [&](size_t i) -> InElements {
    if (heldInBf16(inst.operands[i]))
      return static_cast<const __nv_bfloat16 *>(operand(i));
    return static_cast<const float *>(operand(i));
  };
  auto zero = [&](void *amax) {
    MTRT_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream), what);
  };
  Fp8Gemm &gemm = context_.fp8Gemm();
  // One product: first [m, k] @ second [n, k]^T (codes k-contiguous) with
  // the inverse scales at inverses[0] and inverses[kInverseStride] (each in
  // its own aligned block: cuBLASLt refuses a scale that is not 16-byte
  // aligned), into y (bf16 or fp32).
  // With a bias, false when cuBLASLt has no epilogue for it (nothing ran).
  auto product = [&](int64_t m, int64_t n, int64_t k, const uint8_t *first,
                     int64_t firstValue, const uint8_t *second,
                     int64_t secondValue, const float *const *inverses, void *y,
                     bool yBf16, const __nv_bfloat16 *bias = nullptr,
                     bool fast = false) -> bool {
    try {
      return gemm.run(m, n, k, first, formatOf(firstValue), inverses[0], second,
                      formatOf(secondValue), inverses[1], y, yBf16, bias, fast);
    } catch (const Error &e) {
      throw Error(e.code(), what + ": " + e.what());
    }
  };

  // The inverse scales of the product's first and second operands, whose
  // scales are operands firstScale and secondScale: the step's table of
  // the metas' inverses (made at its first reader), or computed into the
  // staging's first block.
  auto inversesOf = [&](size_t firstScale, size_t secondScale,
                        const float *(&inverses)[2]) {
    char *staging = static_cast<char *>(gemm.staging(fp8StagingBytes_));
    size_t firstMeta = fp8MetaOfValue_[inst.operands[firstScale]],
           secondMeta = fp8MetaOfValue_[inst.operands[secondScale]];
    if (firstMeta != kNoPartner && secondMeta != kNoPartner) {
      auto *table = reinterpret_cast<float *>(staging + fp8InverseTableAt_);
      if (position == fp8InverseTableMadeAt_)
        MTRT_CUDA_CHECK_LAUNCH(
            fp8InverseTable(stream,
                            static_cast<int64_t>(bundle_.fp8().metas.size()),
                            parameters_.fp8Scale(0), table),
            what);
      inverses[0] = table + kFp8InverseTableStride * firstMeta;
      inverses[1] = table + kFp8InverseTableStride * secondMeta;
      return;
    }
    auto *block = reinterpret_cast<float *>(staging);
    MTRT_CUDA_CHECK_LAUNCH(fp8InverseScales(stream, scalar(operand(firstScale)),
                                            scalar(operand(secondScale)), block,
                                            block + kInverseStride),
                           what);
    inverses[0] = block;
    inverses[1] = block + kInverseStride;
  };

  switch (inst.op) {
  case Op::Fp8Scale:
    // A function output is read after the closing fp8_updates rewrote the
    // store's scale (a pipeline stage's forward returns the scales it cast
    // with, stashed for its backward): a copy.
    if (std::find(fn.outputs.begin(), fn.outputs.end(), inst.results[0]) !=
        fn.outputs.end()) {
      MTRT_CUDA_CHECK(cudaMemcpyAsync(slots_[inst.results[0]],
                                      parameters_.fp8Scale(size_t(a.meta)),
                                      sizeof(float), cudaMemcpyDeviceToDevice,
                                      stream),
                      what);
      break;
    }
    // Else the store's scale itself, as get_parameter gives a parameter's
    // value: fp8_update, the one writer, ends train_step, after every
    // reader. A copy cost a graph node per meta (288 at gpt-1.3b, 1.2 ms a
    // step).
    slots_[inst.results[0]] = parameters_.fp8Scale(size_t(a.meta));
    break;
  case Op::Fp8Update: {
    // A run of fp8_updates (a training step ends with one per meta) goes
    // in launches of kFp8UpdateBatch metas at its first instruction; their
    // amaxes are all computed before it.
    if (position > 0 && fn.instructions[position - 1].op == Op::Fp8Update)
      break;
    const Fp8Settings &settings = bundle_.fp8();
    auto algorithm = settings.amaxComputeAlgo == "max"
                         ? fp8::AmaxAlgorithm::Max
                         : fp8::AmaxAlgorithm::MostRecent;
    Fp8UpdateBatch batch;
    auto launch = [&] {
      MTRT_CUDA_CHECK_LAUNCH(
          fp8UpdateMetas(stream, batch,
                         static_cast<int>(parameters_.fp8HistoryLength()),
                         algorithm, static_cast<int>(settings.margin)),
          what);
      batch.count = 0;
    };
    for (size_t p = position;
         p < fn.instructions.size() && fn.instructions[p].op == Op::Fp8Update;
         ++p) {
      const Instruction &update = fn.instructions[p];
      auto meta = size_t(update.attrs.meta);
      batch.amax[batch.count] = scalar(slots_[update.operands[0]]);
      batch.scale[batch.count] = parameters_.fp8Scale(meta);
      batch.history[batch.count] = parameters_.fp8History(meta);
      batch.format[batch.count] = fp8FormatOf(settings.metas[meta].format);
      if (++batch.count == kFp8UpdateBatch)
        launch();
    }
    launch();
    break;
  }
  case Op::Fp8CurrentScale: { // the amax, then the scale, in the result
    float *scale = scalar(result(0));
    zero(scale);
    MTRT_CUDA_CHECK_LAUNCH(fp8Amax(stream,
                                   fn.values[inst.operands[0]].numElements,
                                   source(0), scale),
                           what);
    MTRT_CUDA_CHECK_LAUNCH(fp8ScaleFromAmax(stream, scale, scale,
                                            fp8FormatOf(a.fp8Format),
                                            static_cast<int>(a.margin)),
                           what);
    break;
  }
  case Op::Fp8Quantize:
    if (fp8CastProducer_[position] != kNoPartner &&
        fp8CastFused(fp8CastProducer_[position]))
      break; // its producer wrote the codes and the amax
    // The amax was zeroed at the run's first cast (planFp8Amaxes).
    if (fp8TransposedGradOf_[position] != kNoPartner ||
        fp8KeptTransposeOf_[inst.results[0]] != kNoPartner) {
      // [rows, cols] and [cols, rows]: an output gradient's for the weight
      // gradient after it, or a weight's kept for its data gradients.
      int64_t cols = fn.values[inst.operands[0]].shape.back();
      int64_t rows = fn.values[inst.operands[0]].numElements / cols;
      auto *transposed = reinterpret_cast<uint8_t *>(
          static_cast<char *>(gemm.staging(fp8StagingBytes_)) +
          (fp8TransposedGradOf_[position] != kNoPartner
               ? transposedGradAt(fp8TransposedGradOf_[position])
               : fp8KeptTransposesAt_ + fp8KeptTransposeOf_[inst.results[0]]));
      bool launched = false;
      MTRT_CUDA_CHECK_LAUNCH(
          launched = castToFp8Transposed(
              stream, rows, cols, source(0), codes(result(0)), transposed,
              formatOf(inst.results[0]), scalar(operand(1)), scalar(result(1))),
          what);
      if (launched)
        break;
      MTRT_CUDA_CHECK_LAUNCH(castToFp8(stream, rows * cols, source(0),
                                       codes(result(0)),
                                       formatOf(inst.results[0]),
                                       scalar(operand(1)), scalar(result(1))),
                             what);
      MTRT_CUDA_CHECK_LAUNCH(
          transposeBytes(stream, rows, cols, codes(result(0)), transposed),
          what);
      break;
    }
    MTRT_CUDA_CHECK_LAUNCH(
        castToFp8(stream, fn.values[inst.operands[0]].numElements, source(0),
                  codes(result(0)), formatOf(inst.results[0]),
                  scalar(operand(1)), scalar(result(1))),
        what);
    break;
  case Op::Fp8Linear: { // y = (x w) / (sx sw) + b
    const std::vector<int64_t> &w = fn.values[inst.operands[2]].shape;
    int64_t in = fn.values[inst.operands[0]].shape.back();
    int64_t out = a.transposeWeight ? w[0] : w[1];
    int64_t rows = fn.values[inst.operands[0]].numElements / in;
    bool bias = inst.operands.size() == 5;
    bool yBf16 = heldInBf16(inst.results[0]);
    size_t transposed =
        a.transposeWeight ? 0 : alignUp(static_cast<size_t>(in * out));
    auto *staging = static_cast<char *>(gemm.staging(fp8StagingBytes_));
    const float *inverses[2];
    inversesOf(1, 3, inverses);
    const uint8_t *weight = codes(operand(2));
    if (!a.transposeWeight &&
        fp8KeptTransposeOf_[inst.operands[2]] != kNoPartner) // by its cast
      weight =
          reinterpret_cast<uint8_t *>(staging + fp8KeptTransposesAt_ +
                                      fp8KeptTransposeOf_[inst.operands[2]]);
    else if (!a.transposeWeight) { // [in, out] -> [out, in]
      auto *wT = reinterpret_cast<uint8_t *>(staging + kInverseBytes);
      MTRT_CUDA_CHECK_LAUNCH(transposeBytes(stream, in, out, weight, wT), what);
      weight = wT;
    }
    bool fast = inForwardPass(fn, position);
    if (!bias) {
      product(rows, out, in, codes(operand(0)), inst.operands[0], weight,
              inst.operands[2], inverses, result(0), yBf16, nullptr, fast);
      break;
    }
    char *biasBlock = staging + kInverseBytes + transposed;
    if (yBf16) {
      auto *bf16Bias = reinterpret_cast<__nv_bfloat16 *>(biasBlock);
      MTRT_CUDA_CHECK_LAUNCH(
          roundToBf16(stream, out, scalar(operand(4)), bf16Bias), what);
      if (product(rows, out, in, codes(operand(0)), inst.operands[0], weight,
                  inst.operands[2], inverses, result(0), true, bf16Bias, fast))
        break;
    }
    // No epilogue for it: the fp32 product, then the bias by a kernel.
    auto *sums = reinterpret_cast<float *>(
        biasBlock + alignUp(sizeof(__nv_bfloat16) * size_t(out)));
    product(rows, out, in, codes(operand(0)), inst.operands[0], weight,
            inst.operands[2], inverses, sums, false, nullptr, fast);
    OutElements into = static_cast<float *>(result(0));
    if (yBf16)
      into = static_cast<__nv_bfloat16 *>(result(0));
    MTRT_CUDA_CHECK_LAUNCH(biasAdd(stream, rows, out, sums,
                                   static_cast<const float *>(operand(4)),
                                   into),
                           what);
    break;
  }
  case Op::Fp8LinearWeightGrad: { // dw = x^T dy (or dy^T x), fp32
    int64_t in = fn.values[inst.operands[0]].shape.back();
    int64_t out = fn.values[inst.operands[2]].shape.back();
    int64_t rows = fn.values[inst.operands[0]].numElements / in;
    auto *staging = static_cast<char *>(gemm.staging(fp8StagingBytes_));
    const float *inverses[2];
    auto *xT = reinterpret_cast<uint8_t *>(staging + fp8TransposedInputAt_);
    if (!fp8ReusesTransposedInput_[position])
      MTRT_CUDA_CHECK_LAUNCH(
          transposeBytes(stream, rows, in, codes(operand(0)), xT), what);
    auto *dyT = reinterpret_cast<uint8_t *>(staging + kInverseBytes);
    if (fp8GradTransposedIn_[position] != kNoPartner) // by its cast
      dyT = reinterpret_cast<uint8_t *>(
          staging + transposedGradAt(fp8GradTransposedIn_[position]));
    else
      MTRT_CUDA_CHECK_LAUNCH(
          transposeBytes(stream, rows, out, codes(operand(2)), dyT), what);
    if (!a.transposeWeight) { // [in, out]: x^T [in, rows] @ dy^T [out, rows]^T
      inversesOf(1, 3, inverses);
      product(in, out, rows, xT, inst.operands[0], dyT, inst.operands[2],
              inverses, result(0), false);
    } else { // [out, in]: dy^T [out, rows] @ x^T [in, rows]^T
      inversesOf(3, 1, inverses);
      product(out, in, rows, dyT, inst.operands[2], xT, inst.operands[0],
              inverses, result(0), false);
    }
    break;
  }
  default:
    throw Error(MTRT_STATUS_INTERNAL,
                what + ": " + opName(inst.op) + " is not an FP8 instruction");
  }
}

} // namespace mtrt::cuda
