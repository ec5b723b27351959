// Packing gradients and parameters into the bundle's gradient buffer and
// running its reduction and gather functions.
#include "train/DataParallelBuffer.h"

#include "comm/RankContext.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"

#include <algorithm>
#include <cstring>
#include <utility>

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
  for (const GradientBucket &bucket : layout_.buckets)
    buckets_.push_back(std::make_unique<host::Executor>(
        bundle, bucket.reduceFunction, parameters, pool, &rank));
  bucketDone_.assign(buckets_.size(), false);
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

void DataParallelBuffer::reduceBucket(size_t b) {
  const GradientBucket &bucket = layout_.buckets[b];
  bool f64 = parameters_.floatType() == DType::F64;
  int64_t end = bucket.offset + bucket.size;
  if (f64)
    pack<double>(false, bucket.offset, end);
  else
    pack<float>(false, bucket.offset, end);
  size_t bytes = dtypeSize(buffer_.dtype);
  uint8_t *slice = static_cast<uint8_t *>(buffer_.buffer.data()) +
                   static_cast<size_t>(bucket.offset) * bytes;
  std::vector<host::Tensor> out =
      buckets_[b]->run({{buffer_.dtype, {bucket.size}, slice}}, {});
  std::memcpy(slice, out[0].buffer.data(),
              static_cast<size_t>(bucket.size) * bytes);
  bucketDone_[b] = true;
}

void DataParallelBuffer::afterInstruction(const std::string &function,
                                          size_t position) {
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const GradientBucket &bucket = layout_.buckets[b];
    if (!bucketDone_[b] && bucket.readyFunction == function &&
        bucket.readyAfter == static_cast<int64_t>(position)) {
      reduceBucket(b);
      ++startedInStep_;
    }
  }
}

std::string DataParallelBuffer::describeBuckets() const {
  int64_t count = static_cast<int64_t>(layout_.buckets.size());
  return "gradient buckets (--overlap-grad-reduce): " + std::to_string(count) +
         " over " + std::to_string(layout_.size) +
         " elements; the last iteration reduced " +
         std::to_string(lastStartedInStep_) +
         " during the last micro-batch's backward pass and " +
         std::to_string(count - lastStartedInStep_) + " after it";
}

void DataParallelBuffer::reduceGradients() {
  bool f64 = parameters_.floatType() == DType::F64;
  if (bucketed()) {
    // The buckets the last micro-batch did not start: those reduced after
    // the step, in order.
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (!bucketDone_[b])
        reduceBucket(b);
    bucketDone_.assign(buckets_.size(), false);
    lastStartedInStep_ = std::exchange(startedInStep_, 0);
    if (layout_.distributedOptimizer) {
      // Every element was all-reduced; the rank keeps its range.
      size_t bytes = dtypeSize(buffer_.dtype);
      std::memcpy(reduced_.buffer.data(),
                  static_cast<const uint8_t *>(buffer_.buffer.data()) +
                      static_cast<size_t>(shard_.begin) * bytes,
                  static_cast<size_t>(shard_.size) * bytes);
      return;
    }
    if (f64)
      unpack<double>(buffer_, false);
    else
      unpack<float>(buffer_, false);
    return;
  }
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
