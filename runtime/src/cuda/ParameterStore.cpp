// Allocation, seeded initialization and host transfers of a bundle's
// parameters on the device.
#include "cuda/ParameterStore.h"

#include "cuda/CudaCheck.h"
#include "cuda/kernels/Kernels.h"
#include "host/ParameterStore.h"

namespace mtrt::cuda {

namespace {
/// Elements per 256 bytes: every parameter starts on such a boundary.
constexpr int64_t kAlignElements = 64;
} // namespace

ParameterStore::ParameterStore(const Bundle &bundle, Context &context)
    : context_(context) {
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
  size_t bytes = 4 * sizeof(float) * static_cast<size_t>(flat_);
  buffer_ = DeviceBuffer(bytes, "the parameters, gradients and AdamW moments "
                                "of bundle '" +
                                    bundle.name() + "'");
  MTRT_CUDA_CHECK(cudaMemsetAsync(buffer_.data(), 0, bytes, context_.stream()),
                  "zeroing the parameter store");
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
  MTRT_CUDA_CHECK(cudaMemsetAsync(buffer_.data(), 0,
                                  4 * sizeof(float) * static_cast<size_t>(flat_),
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
}

void ParameterStore::zeroGradients() {
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
  for (size_t i = 0; i < infos_.size(); ++i) {
    size_t bytes = sizeof(float) * static_cast<size_t>(count(i));
    const host::Tensor *tensors[4] = {&source.value(i), &source.gradient(i),
                                      &source.expAvg(i), &source.expAvgSq(i)};
    for (int kind = 0; kind < 4; ++kind)
      MTRT_CUDA_CHECK(cudaMemcpyAsync(at(kind, i), tensors[kind]->buffer.data(),
                                      bytes, cudaMemcpyHostToDevice,
                                      context_.stream()),
                      "uploading parameter " + infos_[i]->name);
  }
  context_.synchronize("uploading the parameters");
}

void ParameterStore::download(host::ParameterStore &to) const {
  checkPeer(to, "download");
  for (size_t i = 0; i < infos_.size(); ++i) {
    size_t bytes = sizeof(float) * static_cast<size_t>(count(i));
    host::Tensor *tensors[4] = {&to.value(i), &to.gradient(i), &to.expAvg(i),
                                &to.expAvgSq(i)};
    for (int kind = 0; kind < 4; ++kind)
      MTRT_CUDA_CHECK(cudaMemcpyAsync(tensors[kind]->buffer.data(), at(kind, i),
                                      bytes, cudaMemcpyDeviceToHost,
                                      context_.stream()),
                      "downloading parameter " + infos_[i]->name);
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
