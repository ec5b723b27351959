// Allocation, seeded initialization and host transfers of a bundle's
// parameters on the device.
#include "cuda/ParameterStore.h"

#include "cuda/CudaCheck.h"
#include "cuda/kernels/Kernels.h"
#include "host/ParameterStore.h"

#include <cstring>

namespace mtrt::cuda {

namespace {
/// fp32 elements per 256 bytes: every parameter starts on such a boundary.
constexpr int64_t kAlignElements = 64;
/// bf16 elements per 256 bytes, for the bf16 copies.
constexpr int64_t kBf16AlignElements = 128;

/// Ops whose first two operands are GEMM operands (the chunked output
/// layers' GEMMs read their weight, the second).
bool isGemm(Op op) {
  return op == Op::Linear || op == Op::LinearGelu || op == Op::LinearGeluGrad ||
         op == Op::LinearAdd || op == Op::LinearWeightGrad ||
         op == Op::LinearWeightBiasGrad || op == Op::Matmul ||
         op == Op::LinearCrossEntropy || op == Op::LinearVocabMax ||
         op == Op::LinearVocabPartials || op == Op::LinearVocabCrossEntropyGrad;
}
} // namespace

std::vector<bool> ParameterStore::gemmReadParameters(const Bundle &bundle) {
  std::vector<bool> read(bundle.parameters().size(), false);
  for (const Function &fn : bundle.functions()) {
    std::vector<int64_t> parameterOf(fn.values.size(), -1);
    for (const Instruction &inst : fn.instructions) {
      if (inst.op == Op::GetParameter)
        parameterOf[inst.results[0]] = inst.attrs.parameter;
      // Format version 8: a GEMM reads a master weight through its cast
      // to bf16, which is the persistent copy (OpDispatch.cpp, Op::Cast).
      if (inst.op == Op::Cast)
        parameterOf[inst.results[0]] = parameterOf[inst.operands[0]];
      if (!isGemm(inst.op))
        continue;
      for (size_t i = 0; i < 2 && i < inst.operands.size(); ++i) {
        int64_t p = parameterOf[inst.operands[i]];
        if (p >= 0 && static_cast<size_t>(p) < read.size())
          read[static_cast<size_t>(p)] = true;
      }
    }
  }
  return read;
}

bool ParameterStore::gradientsFitArena(const Bundle &bundle,
                                       const Function &train) {
  bool mixed = bundle.hasModel() && bundle.model().precision != "fp32";
  if (mixed && !bundle.typedPrecision()) // the executor picks storage types
    return false;
  std::vector<int> accumulations(bundle.parameters().size(), 0);
  for (const Instruction &inst : train.instructions) {
    if (inst.op != Op::AccumulateGradient)
      continue;
    auto p = static_cast<size_t>(inst.attrs.parameter);
    const TensorType &gradient = train.values[inst.operands[0]];
    if (p >= accumulations.size() || gradient.dtype != DType::F32 ||
        gradient.numElements != bundle.parameters()[p].localType.numElements)
      return false;
    ++accumulations[p];
  }
  for (int count : accumulations)
    if (count != 1)
      return false;
  return true;
}

ParameterStore::ParameterStore(const Bundle &bundle, Context &context,
                               bool optimizerState, GradientStorage gradients)
    : context_(context), optimizerState_(optimizerState),
      gradientsInArena_(gradients == GradientStorage::Arena),
      arrays_((optimizerState ? 4 : 2) -
              (gradients == GradientStorage::Arena ? 1 : 0)) {
  const auto &parameters = bundle.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Parameter &p = parameters[i];
    if (p.type.dtype != DType::F32 && p.type.dtype != DType::F64)
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  "bundle '" + bundle.name() + "': parameters[" +
                      std::to_string(i) + "] (" + p.name + ") is " +
                      dtypeName(p.type.dtype) +
                      "; the cuda backend computes in f32 only for now: "
                      "compile the model with precision fp32");
    infos_.push_back(&p);
    offsets_.push_back(flat_);
    flat_ += (p.localType.numElements + kAlignElements - 1) / kAlignElements *
             kAlignElements;
    numElements_ += p.localType.numElements;
  }
  size_t bytes = arrays_ * sizeof(float) * static_cast<size_t>(flat_);
  buffer_ =
      DeviceBuffer(bytes, std::string("the parameters") +
                              (gradientsInArena_ ? "" : ", gradients") +
                              (optimizerState ? " and AdamW moments" : "") +
                              " of bundle '" + bundle.name() + "'");
  MTRT_CUDA_CHECK(cudaMemsetAsync(buffer_.data(), 0, bytes, context_.stream()),
                  "zeroing the parameter store");

  bool mixed = bundle.hasModel() && bundle.model().precision == "bf16";
  std::vector<bool> copied = mixed ? gemmReadParameters(bundle)
                                   : std::vector<bool>(infos_.size(), false);
  for (size_t i = 0; i < infos_.size(); ++i) {
    bf16Offsets_.push_back(copied[i] ? bf16Flat_ : -1);
    if (copied[i])
      bf16Flat_ += (count(i) + kBf16AlignElements - 1) / kBf16AlignElements *
                   kBf16AlignElements;
  }
  if (bf16Flat_ > 0) {
    size_t bf16Bytes = sizeof(__nv_bfloat16) * static_cast<size_t>(bf16Flat_);
    bf16_ = DeviceBuffer(bf16Bytes, "the bf16 copies of the parameters of "
                                    "bundle '" +
                                        bundle.name() + "'");
    MTRT_CUDA_CHECK(
        cudaMemsetAsync(bf16_.data(), 0, bf16Bytes, context_.stream()),
        "zeroing the parameters' bf16 copies");
  }
  if (bundle.hasFp8()) {
    fp8Metas_ = bundle.fp8().metas.size();
    fp8HistoryLength_ = bundle.fp8().amaxHistoryLen;
    fp8_ = DeviceBuffer(
        sizeof(float) * fp8Metas_ * static_cast<size_t>(1 + fp8HistoryLength_),
        "the FP8 scaling state of bundle '" + bundle.name() + "'");
    resetFp8();
  }
}

void ParameterStore::resetFp8() {
  if (!hasFp8())
    return;
  cudaStream_t stream = context_.stream();
  MTRT_CUDA_CHECK_LAUNCH(
      fill(stream, static_cast<int64_t>(fp8Metas_), fp8Scale(0), 1.0f),
      "setting the FP8 scales to 1");
  MTRT_CUDA_CHECK(cudaMemsetAsync(fp8History(0), 0,
                                  sizeof(float) * fp8Metas_ *
                                      static_cast<size_t>(fp8HistoryLength_),
                                  stream),
                  "zeroing the FP8 amax histories");
}

void ParameterStore::refreshBf16Copies() {
  for (size_t i = 0; i < infos_.size(); ++i)
    refreshBf16Copy(i);
}

void ParameterStore::refreshBf16Copy(size_t i) {
  if (__nv_bfloat16 *copy = bf16Value(i))
    MTRT_CUDA_CHECK_LAUNCH(
        roundToBf16(context_.stream(), count(i), value(i), copy),
        "rounding parameter " + infos_[i]->name + " to its bf16 copy");
}

bool ParameterStore::overlapsValues(const void *data, size_t bytes) const {
  auto begin = reinterpret_cast<uintptr_t>(buffer_.data());
  auto end = begin + sizeof(float) * static_cast<size_t>(flat_);
  auto at = reinterpret_cast<uintptr_t>(data);
  return at < end && at + bytes > begin;
}

void ParameterStore::initialize(uint64_t seed) {
  for (const Parameter *p : infos_)
    if (!p->splitAxes.empty())
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  "cuda::ParameterStore::initialize: parameter " + p->name +
                      " is split across ranks; initialize the rank's shards "
                      "in a host::ParameterStore (with its coordinates) and "
                      "upload them");
  cudaStream_t stream = context_.stream();
  MTRT_CUDA_CHECK(
      cudaMemsetAsync(buffer_.data(), 0,
                      arrays_ * sizeof(float) * static_cast<size_t>(flat_),
                      stream),
      "zeroing the parameter store");
  for (size_t i = 0; i < infos_.size(); ++i) {
    const Parameter &p = *infos_[i];
    switch (p.init) {
    case InitMethod::Normal:
      MTRT_CUDA_CHECK_LAUNCH(
          initNormal(stream, count(i), value(i), p.std, seed,
                     static_cast<uint64_t>(i)),
          "initializing parameter " + p.name);
      break;
    case InitMethod::Zeros:
      break;
    case InitMethod::Ones:
      MTRT_CUDA_CHECK_LAUNCH(fill(stream, count(i), value(i), 1.0f),
                             "initializing parameter " + p.name);
      break;
    }
  }
  refreshBf16Copies();
  resetFp8();
}

void ParameterStore::bindGradients(std::vector<float *> slots) {
  if (!gradientsInArena_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "cuda::ParameterStore::bindGradients: the store holds the "
                "gradients itself (GradientStorage::Store)");
  if (slots.size() != infos_.size())
    throw Error(
        MTRT_STATUS_INVALID_ARGUMENT,
        "cuda::ParameterStore::bindGradients: " + std::to_string(slots.size()) +
            " slots for " + std::to_string(infos_.size()) + " parameters");
  boundGradients_ = std::move(slots);
}

void ParameterStore::zeroGradients() {
  if (gradientsInArena_)
    return;
  MTRT_CUDA_CHECK(cudaMemsetAsync(gradients(), 0,
                                  sizeof(float) * static_cast<size_t>(flat_),
                                  context_.stream()),
                  "zeroing the gradients");
}

void ParameterStore::checkPeer(const host::ParameterStore &other,
                               const char *what) const {
  bool same = other.size() == infos_.size() &&
              (infos_.empty() || &other.info(0) == infos_[0]);
  if (!same || other.floatType() != DType::F32)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                std::string("cuda::ParameterStore::") + what +
                    ": the host store must be an f32 store of the same "
                    "bundle");
}

void ParameterStore::upload(const host::ParameterStore &from) {
  checkPeer(from, "upload");
  auto &source = const_cast<host::ParameterStore &>(from);
  int kinds = from.hasOptimizerState() ? 4 : 2;
  for (size_t i = 0; i < infos_.size(); ++i) {
    if (!from.holds(i)) // another pipeline rank's: stays zero here
      continue;
    size_t bytes = sizeof(float) * static_cast<size_t>(count(i));
    const host::Tensor *tensors[4] = {&source.value(i), &source.gradient(i),
                                      &source.expAvg(i), &source.expAvgSq(i)};
    for (int kind = 0; kind < kinds; ++kind)
      if (holdsKind(kind))
        MTRT_CUDA_CHECK(
            cudaMemcpyAsync(at(kind, i), tensors[kind]->buffer.data(), bytes,
                            cudaMemcpyHostToDevice, context_.stream()),
            "uploading parameter " + infos_[i]->name);
  }
  refreshBf16Copies();
  if (hasFp8() && from.hasFp8()) {
    const Fp8State &state = from.fp8();
    MTRT_CUDA_CHECK(cudaMemcpyAsync(fp8Scale(0), state.scales().data(),
                                    sizeof(float) * state.scales().size(),
                                    cudaMemcpyHostToDevice, context_.stream()),
                    "uploading the FP8 scales");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(fp8History(0), state.histories().data(),
                                    sizeof(float) * state.histories().size(),
                                    cudaMemcpyHostToDevice, context_.stream()),
                    "uploading the FP8 amax histories");
  }
  context_.synchronize("uploading the parameters");
}

void ParameterStore::download(host::ParameterStore &to) const {
  checkPeer(to, "download");
  int kinds = to.hasOptimizerState() && hasOptimizerState() ? 4 : 2;
  for (size_t i = 0; i < infos_.size(); ++i) {
    if (!to.holds(i)) // another pipeline rank's (empty there)
      continue;
    size_t bytes = sizeof(float) * static_cast<size_t>(count(i));
    host::Tensor *tensors[4] = {&to.value(i), &to.gradient(i), &to.expAvg(i),
                                &to.expAvgSq(i)};
    for (int kind = 0; kind < kinds; ++kind) {
      const float *from = kind == kGradient ? gradient(i) : at(kind, i);
      if (from)
        MTRT_CUDA_CHECK(cudaMemcpyAsync(tensors[kind]->buffer.data(), from,
                                        bytes, cudaMemcpyDeviceToHost,
                                        context_.stream()),
                        "downloading parameter " + infos_[i]->name);
      else // gradients in the arena, not bound yet
        std::memset(tensors[kind]->buffer.data(), 0, bytes);
    }
  }
  if (hasFp8() && to.hasFp8()) {
    Fp8State &state = to.fp8();
    MTRT_CUDA_CHECK(cudaMemcpyAsync(state.mutableScales().data(), fp8Scale(0),
                                    sizeof(float) * state.scales().size(),
                                    cudaMemcpyDeviceToHost, context_.stream()),
                    "downloading the FP8 scales");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(state.mutableHistories().data(),
                                    fp8History(0),
                                    sizeof(float) * state.histories().size(),
                                    cudaMemcpyDeviceToHost, context_.stream()),
                    "downloading the FP8 amax histories");
  }
  context_.synchronize("downloading the parameters");
}

host::Tensor ParameterStore::toHost(const float *data, size_t i) const {
  host::Tensor tensor(DType::F32, infos_[i]->localType.shape);
  MTRT_CUDA_CHECK(cudaMemcpyAsync(tensor.buffer.data(), data,
                                  tensor.buffer.size(), cudaMemcpyDeviceToHost,
                                  context_.stream()),
                  "copying parameter " + infos_[i]->name + " to the host");
  context_.synchronize("copying parameter " + infos_[i]->name +
                       " to the host");
  return tensor;
}

host::Tensor ParameterStore::valueToHost(size_t i) const {
  return toHost(value(i), i);
}

host::Tensor ParameterStore::gradientToHost(size_t i) const {
  return toHost(gradient(i), i);
}

} // namespace mtrt::cuda
