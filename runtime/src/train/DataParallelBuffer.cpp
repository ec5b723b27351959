// Packing gradients and parameters into the bundle's gradient buffer and
// running its reduction and gather functions.
#include "train/DataParallelBuffer.h"

#include "comm/RankContext.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"

#include <algorithm>
#include <cstring>

namespace mtrt::train {

BufferShard bufferShard(const Bundle &bundle,
                        const std::vector<int64_t> &coordinates) {
  const GradientBuffer &layout = bundle.gradientBuffer(coordinates);
  BufferShard shard;
  shard.size = layout.size;
  if (!layout.distributedOptimizer)
    return shard;
  int64_t group = gridGroupSize(bundle.gridShape(), layout.gridAxes);
  shard.size = layout.size / group;
  shard.begin =
      gridGroupIndex(bundle.gridShape(), coordinates, layout.gridAxes) *
      shard.size;
  int64_t shardEnd = shard.begin + shard.size;
  for (size_t i = 0; i < layout.parameters.size(); ++i) {
    size_t p = static_cast<size_t>(layout.parameters[i]);
    // A pipeline rank steps only the parameters of its stages.
    if (!coordinates.empty() &&
        !bundle.parameters()[p].heldOnPipelineRank(coordinates[0]))
      continue;
    int64_t begin = layout.offsets[i];
    int64_t end = begin + bundle.parameters()[p].localType.numElements;
    int64_t from = std::max(begin, shard.begin), to = std::min(end, shardEnd);
    if (from < to)
      shard.pieces.push_back({p, from - shard.begin, from - begin, to - from});
  }
  return shard;
}

DataParallelBuffer::DataParallelBuffer(const Bundle &bundle,
                                       host::ParameterStore &parameters,
                                       host::ThreadPool &pool,
                                       comm::RankContext &rank)
    : layout_(bundle.gradientBuffer(rank.coordinates())),
      parameters_(parameters), pool_(pool) {
  if (!bundle.hasGradientBuffer())
    throw Error(MTRT_STATUS_INTERNAL, "DataParallelBuffer: bundle '" +
                                          bundle.name() +
                                          "' has no gradient_buffer");
  reduce_ = std::make_unique<host::Executor>(bundle, layout_.reduceFunction,
                                             parameters, pool, &rank);
  DType dtype = parameters.floatType();
  buffer_ = host::Tensor(dtype, {layout_.size});
  shard_ = bufferShard(bundle, rank.coordinates());
  if (!layout_.distributedOptimizer)
    return;
  gather_ = std::make_unique<host::Executor>(bundle, layout_.gatherFunction,
                                             parameters, pool, &rank);
  reduced_ = host::Tensor(dtype, {shard_.size});
}

DataParallelBuffer::~DataParallelBuffer() = default;

/// Copies the store's gradients (or values) that lie in [begin, end) of the
/// buffer into buffer_, and zeroes the padding there.
template <typename T>
void DataParallelBuffer::pack(bool values, int64_t begin, int64_t end) {
  T *out = buffer_.data<T>();
  int64_t covered = begin;
  for (size_t i = 0; i < layout_.parameters.size(); ++i) {
    size_t p = static_cast<size_t>(layout_.parameters[i]);
    const host::Tensor &from =
        values ? parameters_.value(p) : parameters_.gradient(p);
    int64_t first = layout_.offsets[i], last = first + from.numElements();
    int64_t lo = std::max(first, begin), hi = std::min(last, end);
    if (lo >= hi)
      continue;
    std::memcpy(out + lo, from.data<T>() + (lo - first),
                static_cast<size_t>(hi - lo) * sizeof(T));
    covered = std::max(covered, hi);
  }
  if (covered < end)
    std::memset(out + covered, 0,
                static_cast<size_t>(end - covered) * sizeof(T));
}

/// Writes every parameter's gradient (or value) from a whole buffer.
template <typename T>
void DataParallelBuffer::unpack(const host::Tensor &from, bool values) {
  const T *in = from.data<T>();
  for (size_t i = 0; i < layout_.parameters.size(); ++i) {
    size_t p = static_cast<size_t>(layout_.parameters[i]);
    host::Tensor &to = values ? parameters_.value(p) : parameters_.gradient(p);
    std::memcpy(to.data<T>(), in + layout_.offsets[i],
                static_cast<size_t>(to.numElements()) * sizeof(T));
  }
}

void DataParallelBuffer::reduceGradients() {
  bool f64 = parameters_.floatType() == DType::F64;
  if (f64)
    pack<double>(false, 0, layout_.size);
  else
    pack<float>(false, 0, layout_.size);
  std::vector<host::Tensor> out =
      reduce_->run({{buffer_.dtype, buffer_.shape, buffer_.data<void>()}}, {});
  if (layout_.distributedOptimizer) {
    reduced_ = std::move(out[0]);
    return;
  }
  if (f64)
    unpack<double>(out[0], false);
  else
    unpack<float>(out[0], false);
}

void DataParallelBuffer::gatherParameters() {
  bool f64 = parameters_.floatType() == DType::F64;
  int64_t begin = shard_.begin, end = shard_.begin + shard_.size;
  if (f64)
    pack<double>(true, begin, end);
  else
    pack<float>(true, begin, end);
  std::vector<host::Tensor> out = gather_->run(
      {{buffer_.dtype,
        {shard_.size},
        static_cast<const uint8_t *>(buffer_.buffer.data()) +
            static_cast<size_t>(begin) * dtypeSize(buffer_.dtype)}},
      {});
  if (f64)
    unpack<double>(out[0], true);
  else
    unpack<float>(out[0], true);
}

} // namespace mtrt::train
