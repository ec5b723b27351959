// Packing gradients and parameters into the bundle's gradient buffer and
// running its reduction and gather functions.
#include "train/DataParallelBuffer.h"

#include "comm/RankContext.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

namespace mtrt::train {

BufferShard bufferShard(const Bundle &bundle,
                        const std::vector<int64_t> &coordinates) {
  const GradientBuffer &layout = bundle.gradientBuffer(coordinates);
  BufferShard shard;
  if (!layout.distributedOptimizer) {
    shard.size = layout.size;
    shard.segments.push_back({0, layout.size, 0});
    return shard;
  }
  int64_t group = gridGroupSize(bundle.gridShape(), layout.gridAxes);
  int64_t rank =
      gridGroupIndex(bundle.gridShape(), coordinates, layout.gridAxes);
  if (layout.bucketShards()) {
    for (const GradientBucket &bucket : layout.buckets) {
      int64_t part = bucket.size / group;
      shard.segments.push_back({bucket.offset + rank * part, part, shard.size});
      shard.size += part;
    }
  } else {
    shard.size = layout.size / group;
    shard.segments.push_back({rank * shard.size, shard.size, 0});
  }
  for (const BufferShard::Segment &segment : shard.segments) {
    int64_t segmentEnd = segment.begin + segment.size;
    for (size_t i = 0; i < layout.parameters.size(); ++i) {
      size_t p = static_cast<size_t>(layout.parameters[i]);
      // A pipeline rank steps only the parameters of its stages.
      if (!coordinates.empty() &&
          !bundle.parameters()[p].heldOnPipelineRank(coordinates[0]))
        continue;
      int64_t begin = layout.offsets[i];
      int64_t end = begin + bundle.parameters()[p].localType.numElements;
      int64_t from = std::max(begin, segment.begin);
      int64_t to = std::min(end, segmentEnd);
      if (from < to)
        shard.pieces.push_back({p, segment.shardOffset + from - segment.begin,
                                from - begin, to - from});
    }
  }
  return shard;
}

std::vector<size_t> bucketsReadBy(const GradientBuffer &layout,
                                  const Function &function) {
  // Each parameter's bucket, then the buckets of the parameters read.
  std::map<int64_t, size_t> bucketOf;
  for (size_t i = 0; i < layout.parameters.size(); ++i)
    for (size_t b = 0; b < layout.buckets.size(); ++b)
      if (layout.offsets[i] >= layout.buckets[b].offset &&
          layout.offsets[i] < layout.buckets[b].offset + layout.buckets[b].size)
        bucketOf[layout.parameters[i]] = b;
  std::vector<bool> read(layout.buckets.size(), false);
  for (const Instruction &inst : function.instructions)
    if (inst.op == Op::GetParameter) {
      auto it = bucketOf.find(inst.attrs.parameter);
      if (it != bucketOf.end())
        read[it->second] = true;
    }
  std::vector<size_t> buckets;
  for (size_t b = 0; b < read.size(); ++b)
    if (read[b])
      buckets.push_back(b);
  return buckets;
}

bool DeferredGathers::any() const {
  return std::find(pending_.begin(), pending_.end(), true) != pending_.end();
}

std::vector<size_t> DeferredGathers::take(const std::vector<bool> &due) {
  std::vector<size_t> taken;
  for (size_t b = 0; b < pending_.size(); ++b)
    if (pending_[b] && due[b]) {
      pending_[b] = false;
      taken.push_back(b);
    }
  return taken;
}

std::vector<size_t>
DeferredGathers::takeBeforeInstruction(const std::string &function,
                                       size_t position) {
  std::vector<bool> due(pending_.size(), false);
  for (size_t b = 0; b < due.size(); ++b) {
    const GradientBucket &bucket = layout_->buckets[b];
    due[b] = bucket.gatherBeforeFunction == function &&
             bucket.gatherBefore == static_cast<int64_t>(position);
  }
  return take(due);
}

std::vector<size_t> DeferredGathers::takeReadBy(const Function &function) {
  if (!any())
    return {};
  auto [it, added] = readBy_.try_emplace(&function);
  if (added) {
    it->second.assign(pending_.size(), false);
    for (size_t b : bucketsReadBy(*layout_, function))
      it->second[b] = true;
  }
  return take(it->second);
}

std::vector<size_t> DeferredGathers::takeAll() {
  return take(std::vector<bool>(pending_.size(), true));
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
  if (layout_.bucketShards())
    for (const GradientBucket &bucket : layout_.buckets)
      bucketGathers_.push_back(std::make_unique<host::Executor>(
          bundle, bucket.gatherFunction, parameters, pool, &rank));
  if (layout_.bucketShards())
    deferred_ = DeferredGathers(layout_);
  reduced_ = host::Tensor(dtype, {shard_.size});
  packedValues_ = host::Tensor(dtype, {shard_.size});
}

DataParallelBuffer::~DataParallelBuffer() = default;

/// Copies the store's gradients (or values) that lie in [begin, end) of the
/// buffer to `out` (which stands for element `begin`), and zeroes the
/// padding there.
template <typename T>
void DataParallelBuffer::pack(bool values, int64_t begin, int64_t end, T *out) {
  int64_t covered = begin;
  for (size_t i = 0; i < layout_.parameters.size(); ++i) {
    size_t p = static_cast<size_t>(layout_.parameters[i]);
    const host::Tensor &from =
        values ? parameters_.value(p) : parameters_.gradient(p);
    int64_t first = layout_.offsets[i], last = first + from.numElements();
    int64_t lo = std::max(first, begin), hi = std::min(last, end);
    if (lo >= hi)
      continue;
    if (lo > covered)
      std::memset(out + (covered - begin), 0,
                  static_cast<size_t>(lo - covered) * sizeof(T));
    std::memcpy(out + (lo - begin), from.data<T>() + (lo - first),
                static_cast<size_t>(hi - lo) * sizeof(T));
    covered = std::max(covered, hi);
  }
  if (covered < end)
    std::memset(out + (covered - begin), 0,
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

/// Writes the values of the parameters in buffer elements [begin, end) (a
/// bucket: they lie whole in it) from `from`, which holds those elements.
template <typename T>
void DataParallelBuffer::unpackValues(const T *from, int64_t begin,
                                      int64_t end) {
  for (size_t i = 0; i < layout_.parameters.size(); ++i) {
    int64_t first = layout_.offsets[i];
    if (first < begin || first >= end)
      continue;
    host::Tensor &to =
        parameters_.value(static_cast<size_t>(layout_.parameters[i]));
    std::memcpy(to.data<T>(), from + (first - begin),
                static_cast<size_t>(to.numElements()) * sizeof(T));
  }
}

void DataParallelBuffer::reduceBucket(size_t b) {
  const GradientBucket &bucket = layout_.buckets[b];
  bool f64 = parameters_.floatType() == DType::F64;
  int64_t end = bucket.offset + bucket.size;
  if (f64)
    pack<double>(false, bucket.offset, end,
                 buffer_.data<double>() + bucket.offset);
  else
    pack<float>(false, bucket.offset, end,
                buffer_.data<float>() + bucket.offset);
  size_t bytes = dtypeSize(buffer_.dtype);
  uint8_t *slice = static_cast<uint8_t *>(buffer_.buffer.data()) +
                   static_cast<size_t>(bucket.offset) * bytes;
  std::vector<host::Tensor> out =
      buckets_[b]->run({{buffer_.dtype, {bucket.size}, slice}}, {});
  // Per-bucket shards: the rank's part of the bucket, at its place in the
  // shard; else the whole bucket's sum, in place.
  uint8_t *to =
      layout_.bucketShards()
          ? static_cast<uint8_t *>(reduced_.buffer.data()) +
                static_cast<size_t>(shard_.segments[b].shardOffset) * bytes
          : slice;
  std::memcpy(to, out[0].buffer.data(), out[0].buffer.size());
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
    if (layout_.bucketShards()) // each bucket wrote the rank's part
      return;
    if (layout_.distributedOptimizer) {
      // Every element was all-reduced; the rank keeps its range.
      size_t bytes = dtypeSize(buffer_.dtype);
      std::memcpy(reduced_.buffer.data(),
                  static_cast<const uint8_t *>(buffer_.buffer.data()) +
                      static_cast<size_t>(shard_.segments[0].begin) * bytes,
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
    pack<double>(false, 0, layout_.size, buffer_.data<double>());
  else
    pack<float>(false, 0, layout_.size, buffer_.data<float>());
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

void DataParallelBuffer::gatherParameters(bool deferred) {
  bool f64 = parameters_.floatType() == DType::F64;
  // The rank's updated values, in the shard's layout.
  for (const BufferShard::Segment &segment : shard_.segments) {
    int64_t end = segment.begin + segment.size;
    if (f64)
      pack<double>(true, segment.begin, end,
                   packedValues_.data<double>() + segment.shardOffset);
    else
      pack<float>(true, segment.begin, end,
                  packedValues_.data<float>() + segment.shardOffset);
  }
  if (layout_.bucketShards()) {
    deferred_.deferAll();
    if (!(deferred && layout_.overlapParamGather))
      finishParameterGather();
    return;
  }
  std::vector<host::Tensor> out = gather_->run(
      {{packedValues_.dtype, {shard_.size}, packedValues_.data<void>()}}, {});
  if (f64)
    unpack<double>(out[0], true);
  else
    unpack<float>(out[0], true);
}

void DataParallelBuffer::gatherBucket(size_t b) {
  const GradientBucket &bucket = layout_.buckets[b];
  const BufferShard::Segment &segment = shard_.segments[b];
  size_t bytes = dtypeSize(packedValues_.dtype);
  std::vector<host::Tensor> out = bucketGathers_[b]->run(
      {{packedValues_.dtype,
        {segment.size},
        static_cast<const uint8_t *>(packedValues_.buffer.data()) +
            static_cast<size_t>(segment.shardOffset) * bytes}},
      {});
  int64_t end = bucket.offset + bucket.size;
  if (parameters_.floatType() == DType::F64)
    unpackValues<double>(out[0].data<double>(), bucket.offset, end);
  else
    unpackValues<float>(out[0].data<float>(), bucket.offset, end);
}

void DataParallelBuffer::beforeInstruction(const std::string &function,
                                           size_t position) {
  for (size_t b : deferred_.takeBeforeInstruction(function, position))
    gatherBucket(b);
}

void DataParallelBuffer::beforeFunction(const Function &function) {
  for (size_t b : deferred_.takeReadBy(function))
    gatherBucket(b);
}

void DataParallelBuffer::finishParameterGather() {
  for (size_t b : deferred_.takeAll())
    gatherBucket(b);
}

} // namespace mtrt::train
