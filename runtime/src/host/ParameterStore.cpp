// Allocation and seeded initialization of a bundle's parameters on the host.
#include "host/ParameterStore.h"

#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include <algorithm>
#include <cstring>

namespace mtrt::host {

namespace {

template <typename T> void zero(ThreadPool &pool, Tensor &tensor) {
  fill<T>(pool, tensor.numElements(), tensor.data<T>(), T(0));
}

template <typename T>
void initializeOne(ThreadPool &pool, const Parameter &info, size_t index,
                   uint64_t seed, const std::vector<int64_t> &offsets,
                   Tensor &value) {
  int64_t n = value.numElements();
  switch (info.init) {
  case InitMethod::Normal:
    if (info.splitAxes.empty())
      initNormal<T>(pool, n, value.data<T>(), info.std, seed,
                    static_cast<uint64_t>(index));
    else
      initNormalShard<T>(pool, static_cast<int>(info.type.shape.size()),
                         info.type.shape.data(), offsets.data(),
                         info.localType.shape.data(), value.data<T>(), info.std,
                         seed, static_cast<uint64_t>(index));
    break;
  case InitMethod::Zeros:
    fill<T>(pool, n, value.data<T>(), T(0));
    break;
  case InitMethod::Ones:
    fill<T>(pool, n, value.data<T>(), T(1));
    break;
  }
}

} // namespace

ParameterStore::ParameterStore(const Bundle &bundle, DType floatType,
                               std::vector<int64_t> coordinates,
                               bool optimizerState)
    : floatType_(floatType), gridShape_(bundle.gridShape()),
      coordinates_(std::move(coordinates)), optimizerState_(optimizerState) {
  if (coordinates_.empty())
    coordinates_.assign(gridShape_.size(), 0);
  bool inGrid = coordinates_.size() == gridShape_.size();
  for (size_t a = 0; inGrid && a < gridShape_.size(); ++a)
    inGrid = coordinates_[a] >= 0 && coordinates_[a] < gridShape_[a];
  if (!inGrid)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "ParameterStore: rank coordinates " +
                    shapeString(coordinates_) + " are not in bundle '" +
                    bundle.name() + "''s grid " + shapeString(gridShape_));
  if (floatType != DType::F32 && floatType != DType::F64)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                std::string("ParameterStore: float type ") +
                    dtypeName(floatType) +
                    " is not supported; expected f32 "
                    "or f64");
  const auto &parameters = bundle.parameters();
  entries_.resize(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Parameter &p = parameters[i];
    if (p.type.dtype != DType::F32 && p.type.dtype != DType::F64)
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  "bundle '" + bundle.name() + "': parameters[" +
                      std::to_string(i) + "] (" + p.name + ") is " +
                      dtypeName(p.type.dtype) +
                      "; the host backend computes in f32 or f64 only: "
                      "compile the model with precision fp32");
    Entry &e = entries_[i];
    e.info = &p;
    // A pipeline rank holds only its stages' parameters.
    bool held = holds(i);
    for (Tensor *t : {&e.value, &e.gradient, &e.expAvg, &e.expAvgSq}) {
      bool moment = t == &e.expAvg || t == &e.expAvgSq;
      *t = Tensor(floatType, !held || (moment && !optimizerState)
                                 ? std::vector<int64_t>{0}
                                 : p.localType.shape);
      if (t->buffer.size())
        std::memset(t->buffer.data(), 0, t->buffer.size());
    }
    if (held)
      numElements_ += p.localType.numElements;
  }
  if (bundle.hasFp8())
    fp8_.emplace(bundle.fp8());
}

void ParameterStore::initialize(ThreadPool &pool, uint64_t seed) {
  if (fp8_) {
    std::fill(fp8_->mutableScales().begin(), fp8_->mutableScales().end(),
              1.0f);
    std::fill(fp8_->mutableHistories().begin(),
              fp8_->mutableHistories().end(), 0.0f);
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry &e = entries_[i];
    if (!holds(i))
      continue;
    if (floatType_ == DType::F32) {
      initializeOne<float>(pool, *e.info, i, seed, shardOffsets(i), e.value);
      for (Tensor *t : {&e.gradient, &e.expAvg, &e.expAvgSq})
        zero<float>(pool, *t);
    } else {
      initializeOne<double>(pool, *e.info, i, seed, shardOffsets(i), e.value);
      for (Tensor *t : {&e.gradient, &e.expAvg, &e.expAvgSq})
        zero<double>(pool, *t);
    }
  }
}

size_t ParameterStore::optimizerStateBytes() const {
  size_t bytes = 0;
  for (const Entry &e : entries_)
    bytes += e.expAvg.buffer.size() + e.expAvgSq.buffer.size();
  return bytes;
}

std::vector<int64_t> ParameterStore::shardOffsets(size_t i) const {
  return mtrt::shardOffsets(*entries_[i].info, gridShape_, coordinates_);
}

void ParameterStore::zeroGradients(ThreadPool &pool) {
  for (Entry &e : entries_) {
    if (floatType_ == DType::F32)
      zero<float>(pool, e.gradient);
    else
      zero<double>(pool, e.gradient);
  }
}

} // namespace mtrt::host
