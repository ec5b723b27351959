// The gradient buffer and the distributed optimizer on the device.
#include "cuda/DataParallel.h"

#include "comm/RankContext.h"
#include "cuda/CudaCheck.h"
#include "cuda/Executor.h"
#include "cuda/Optimizer.h"
#include "cuda/ParameterStore.h"
#include "cuda/kernels/Kernels.h"
#include "train/DistributedOptimizer.h"
#include "train/ExactSquareSum.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace mtrt::cuda {

DataParallelBuffer::DataParallelBuffer(const Bundle &bundle,
                                       ParameterStore &parameters,
                                       comm::RankContext &rank)
    : layout_(bundle.gradientBuffer(rank.coordinates())),
      parameters_(parameters) {
  if (!bundle.hasGradientBuffer())
    throw Error(MTRT_STATUS_INTERNAL, "cuda::DataParallelBuffer: bundle '" +
                                          bundle.name() +
                                          "' has no gradient_buffer");
  const Function *reduce = bundle.findFunction(layout_.reduceFunction);
  if (reduce->values[reduce->inputs[0]].dtype != DType::F32)
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                "bundle '" + bundle.name() + "': the gradient buffer is " +
                    dtypeName(reduce->values[reduce->inputs[0]].dtype) +
                    "; the cuda backend reduces f32 gradients only");
  reduce_ = std::make_unique<Executor>(bundle, layout_.reduceFunction,
                                       parameters, &rank);
  shard_ = train::bufferShard(bundle, rank.coordinates());
  // Each bucket's collective runs beside the rest of the backward pass;
  // reduceGradients joins it before taking its result.
  for (const GradientBucket &bucket : layout_.buckets) {
    buckets_.push_back(std::make_unique<Executor>(bundle, bucket.reduceFunction,
                                                  parameters, &rank));
    buckets_.back()->setDeferredCollectiveJoin(true);
  }
  bucketDone_.assign(buckets_.size(), false);
  bucketOutputs_.assign(buckets_.size(), nullptr);
  if (layout_.distributedOptimizer) {
    gather_ = std::make_unique<Executor>(bundle, layout_.gatherFunction,
                                         parameters, &rank);
    if (layout_.bucketShards())
      for (const GradientBucket &bucket : layout_.buckets) {
        bucketGathers_.push_back(std::make_unique<Executor>(
            bundle, bucket.gatherFunction, parameters, &rank));
        bucketGathers_.back()->setDeferredCollectiveJoin(true);
      }
    if (layout_.bucketShards())
      deferred_ = train::DeferredGathers(layout_);
    gatherOutputs_.assign(bucketGathers_.size(), nullptr);
    // The rank's shard of the updated values, packed for the gathers (the
    // padding stays zero), and with per-bucket shards of the summed
    // gradients, which the buckets' reduce-scatters write part by part.
    size_t shardBytes = sizeof(float) * static_cast<size_t>(shard_.size);
    if (layout_.bucketShards())
      shardGradients_ = DeviceBuffer(
          shardBytes, "the distributed optimizer's shard of the gradients");
    packedValues_ = DeviceBuffer(
        shardBytes, "the distributed optimizer's shard of the values");
    MTRT_CUDA_CHECK(cudaMemsetAsync(packedValues_.data(), 0, shardBytes,
                                    parameters.context().stream()),
                    "zeroing the packed values' padding");
  }
  size_t bytes = sizeof(float) * static_cast<size_t>(layout_.size);
  buffer_ = DeviceBuffer(bytes, "the gradient buffer of bundle '" +
                                    bundle.name() + "'");
  // The padding is never written: zero once.
  Context &context = parameters.context();
  MTRT_CUDA_CHECK(cudaMemsetAsync(buffer_.data(), 0, bytes, context.stream()),
                  "zeroing the gradient buffer");
  context.synchronize("zeroing the gradient buffer");
}

DataParallelBuffer::~DataParallelBuffer() = default;

void DataParallelBuffer::pack(bool values, int64_t begin, int64_t end,
                              float *out) {
  cudaStream_t stream = parameters_.context().stream();
  for (size_t i = 0; i < layout_.parameters.size(); ++i) {
    size_t p = static_cast<size_t>(layout_.parameters[i]);
    int64_t first = layout_.offsets[i], last = first + parameters_.count(p);
    int64_t lo = std::max(first, begin), hi = std::min(last, end);
    if (lo >= hi)
      continue;
    const float *from = values ? parameters_.value(p) : parameters_.gradient(p);
    MTRT_CUDA_CHECK(
        cudaMemcpyAsync(out + (lo - begin), from + (lo - first),
                        sizeof(float) * static_cast<size_t>(hi - lo),
                        cudaMemcpyDeviceToDevice, stream),
        std::string("packing the ") + (values ? "value" : "gradient") + " of " +
            parameters_.info(p).name + " into the gradient buffer");
  }
}

void DataParallelBuffer::unpack(const float *from, bool values, int64_t begin,
                                int64_t end) {
  cudaStream_t stream = parameters_.context().stream();
  for (size_t i = 0; i < layout_.parameters.size(); ++i) {
    if (layout_.offsets[i] < begin || layout_.offsets[i] >= end)
      continue;
    size_t p = static_cast<size_t>(layout_.parameters[i]);
    float *to = values ? parameters_.value(p) : parameters_.gradient(p);
    MTRT_CUDA_CHECK(
        cudaMemcpyAsync(to, from + (layout_.offsets[i] - begin),
                        sizeof(float) *
                            static_cast<size_t>(parameters_.count(p)),
                        cudaMemcpyDeviceToDevice, stream),
        std::string("unpacking the ") + (values ? "value" : "gradient") +
            " of " + parameters_.info(p).name + " from the gradient buffer");
  }
}

namespace {
/// Runs `executor` on one device buffer and returns its one output's device
/// data, left in the executor's arena until its next run.
float *runInPlace(Executor &executor, int64_t count, const float *input) {
  const void *output = nullptr;
  executor.run({{DType::F32, {count}, input}}, {}, /*inputsOnDevice=*/true,
               [&](size_t, const void *data, size_t) { output = data; });
  return static_cast<float *>(const_cast<void *>(output));
}
} // namespace

void DataParallelBuffer::reduceBucket(size_t b) {
  const GradientBucket &bucket = layout_.buckets[b];
  float *slice = buffer_.as<float>() + bucket.offset;
  pack(false, bucket.offset, bucket.offset + bucket.size, slice);
  // Enqueued only: the step it runs inside checks its own faults, and the
  // collective runs on the communication stream until joinBucket.
  const void *output = nullptr;
  buckets_[b]->run(
      {{DType::F32, {bucket.size}, slice}}, {}, /*inputsOnDevice=*/true,
      [&](size_t, const void *data, size_t) { output = data; },
      /*wait=*/false);
  bucketOutputs_[b] = output;
  bucketDone_[b] = true;
}

void DataParallelBuffer::joinBucket(size_t b) {
  const GradientBucket &bucket = layout_.buckets[b];
  buckets_[b]->joinCollectives();
  // Per-bucket shards: the rank's part of the bucket, at its place in the
  // shard; else the whole bucket's sum, in place.
  bool part = layout_.bucketShards();
  const train::BufferShard::Segment &segment = shard_.segments[part ? b : 0];
  MTRT_CUDA_CHECK(
      cudaMemcpyAsync(part ? shardGradients_.as<float>() + segment.shardOffset
                           : buffer_.as<float>() + bucket.offset,
                      bucketOutputs_[b],
                      sizeof(float) * static_cast<size_t>(part ? segment.size
                                                               : bucket.size),
                      cudaMemcpyDeviceToDevice, parameters_.context().stream()),
      "copying the reduced gradient bucket " + std::to_string(b) +
          " into the gradient buffer");
}

void DataParallelBuffer::afterInstruction(const std::string &function,
                                          size_t position) {
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const GradientBucket &bucket = layout_.buckets[b];
    if (!bucketDone_[b] && bucket.readyFunction == function &&
        bucket.readyAfter == static_cast<int64_t>(position))
      reduceBucket(b);
  }
}

void DataParallelBuffer::reduceGradients() {
  if (bucketed()) {
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (!bucketDone_[b])
        reduceBucket(b);
    for (size_t b = 0; b < buckets_.size(); ++b)
      joinBucket(b);
    bucketDone_.assign(buckets_.size(), false);
    if (layout_.bucketShards()) { // each bucket wrote the rank's part
      reduced_ = shardGradients_.as<float>();
      return;
    }
    // Every element was all-reduced in place; the distributed optimizer
    // reads its range there.
    if (layout_.distributedOptimizer) {
      reduced_ = buffer_.as<float>() + shard_.segments[0].begin;
      return;
    }
    unpack(buffer_.as<float>(), false, 0, layout_.size);
    return;
  }
  pack(false, 0, layout_.size, buffer_.as<float>());
  float *out = runInPlace(*reduce_, layout_.size, buffer_.as<float>());
  if (layout_.distributedOptimizer) {
    reduced_ = out;
    return;
  }
  unpack(out, false, 0, layout_.size);
}

void DataParallelBuffer::gatherParameters(bool deferred) {
  if (!gather_)
    throw Error(MTRT_STATUS_INTERNAL,
                "cuda::DataParallelBuffer::gatherParameters: the gradient "
                "buffer is all-reduced; only the distributed optimizer "
                "gathers parameters");
  // The rank's updated values, in the shard's layout.
  for (const train::BufferShard::Segment &segment : shard_.segments)
    pack(true, segment.begin, segment.begin + segment.size,
         packedValues_.as<float>() + segment.shardOffset);
  if (layout_.bucketShards()) {
    // Every bucket's gather starts now on the communication stream; each
    // is joined (and its parameters written) where the next step first
    // reads them, or at once.
    for (size_t b = 0; b < bucketGathers_.size(); ++b) {
      const train::BufferShard::Segment &segment = shard_.segments[b];
      const void *output = nullptr;
      bucketGathers_[b]->run(
          {{DType::F32,
            {segment.size},
            packedValues_.as<float>() + segment.shardOffset}},
          {}, /*inputsOnDevice=*/true,
          [&](size_t, const void *data, size_t) { output = data; },
          /*wait=*/false);
      gatherOutputs_[b] = output;
    }
    deferred_.deferAll();
    if (!(deferred && layout_.overlapParamGather))
      finishParameterGather();
    return;
  }
  unpack(runInPlace(*gather_, shard_.size, packedValues_.as<float>()), true, 0,
         layout_.size);
  parameters_.refreshBf16Copies();
}

void DataParallelBuffer::gatherBucket(size_t b) {
  const GradientBucket &bucket = layout_.buckets[b];
  int64_t end = bucket.offset + bucket.size;
  bucketGathers_[b]->joinCollectives();
  unpack(static_cast<const float *>(gatherOutputs_[b]), true, bucket.offset,
         end);
  for (size_t i = 0; i < layout_.parameters.size(); ++i)
    if (layout_.offsets[i] >= bucket.offset && layout_.offsets[i] < end)
      parameters_.refreshBf16Copy(static_cast<size_t>(layout_.parameters[i]));
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

DistributedOptimizer::DistributedOptimizer(ParameterStore &parameters,
                                           DataParallelBuffer &buffer,
                                           const train::OptimizerConfig &config,
                                           comm::RankContext &rank)
    : parameters_(parameters), buffer_(buffer), config_(config), rank_(rank),
      unscaler_(parameters, &rank) {
  if (!buffer.distributed())
    throw Error(MTRT_STATUS_INTERNAL,
                "cuda::DistributedOptimizer: the bundle's gradient buffer is "
                "all-reduced, not sharded");
  const train::BufferShard &shard = buffer.shard();
  Context &context = parameters.context();
  size_t bytes = 2 * sizeof(float) * static_cast<size_t>(shard.size);
  moments_ = DeviceBuffer(bytes, "the distributed optimizer's AdamW moments");
  MTRT_CUDA_CHECK(cudaMemsetAsync(moments_.data(), 0, bytes, context.stream()),
                  "zeroing the distributed optimizer's moments");
  // The multi-tensor AdamW's table: each piece cut into chunks, the value
  // in the store, the gradient and moments in the shard.
  std::vector<AdamWChunk> chunks;
  for (size_t i = 0; i < parameters.size(); ++i)
    hasExpertBias_ |= parameters.info(i).isExpertBias();
  for (const train::BufferPiece &piece : shard.pieces) {
    if (parameters.info(piece.parameter).isExpertBias())
      continue; // updateExpertBiases moves it
    appendAdamWChunks(chunks, parameters, piece.parameter,
                      piece.parameterOffset, piece.count, piece.shardOffset,
                      piece.shardOffset);
  }
  chunkCount_ = static_cast<int64_t>(chunks.size());
  // The parameters outside the buffer: their own moments and chunks.
  const int64_t pipelineCoordinate =
      rank.coordinates().empty() ? 0 : rank.coordinates()[0];
  std::vector<AdamWChunk> localChunks;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (buffer.contains(i) ||
        !parameters.info(i).heldOnPipelineRank(pipelineCoordinate) ||
        parameters.count(i) == 0)
      continue;
    local_.push_back(i);
    localGradientBase_ = localGradientBase_ ? std::min(localGradientBase_,
                                                       parameters.gradient(i))
                                            : parameters.gradient(i);
  }
  for (size_t i : local_) {
    appendAdamWChunks(localChunks, parameters, i, 0, parameters.count(i),
                      localElements_,
                      parameters.gradient(i) - localGradientBase_);
    localElements_ += parameters.count(i);
  }
  localChunkCount_ = static_cast<int64_t>(localChunks.size());
  if (localElements_ > 0) {
    size_t momentBytes =
        2 * sizeof(float) * static_cast<size_t>(localElements_);
    localMoments_ = DeviceBuffer(
        momentBytes, "the distributed optimizer's moments of the experts");
    MTRT_CUDA_CHECK(
        cudaMemsetAsync(localMoments_.data(), 0, momentBytes, context.stream()),
        "zeroing the distributed optimizer's moments");
    size_t tableBytes = sizeof(AdamWChunk) * localChunks.size();
    localChunks_ = DeviceBuffer(tableBytes, "the experts' AdamW chunk table");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(localChunks_.data(), localChunks.data(),
                                    tableBytes, cudaMemcpyHostToDevice,
                                    context.stream()),
                    "uploading the experts' AdamW chunk table");
  }
  squares_ = DeviceBuffer(2 * sizeof(uint64_t) * kSquareHistogramBins,
                          "the gradient norm's histogram of squares");
  if (!chunks.empty()) {
    size_t tableBytes = sizeof(AdamWChunk) * chunks.size();
    chunks_ = DeviceBuffer(tableBytes, "the AdamW chunk table");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(chunks_.data(), chunks.data(), tableBytes,
                                    cudaMemcpyHostToDevice, context.stream()),
                    "uploading the AdamW chunk table");
  }
  context.synchronize("setting up the distributed optimizer");
}

namespace {
/// The host optimizer's moment tensors, checked against the shard.
std::pair<host::Tensor *, host::Tensor *>
hostMoments(train::DistributedOptimizer &host, int64_t size, const char *what) {
  host::Tensor *tensors[2] = {&host.expAvg(), &host.expAvgSq()};
  for (host::Tensor *t : tensors)
    if (t->dtype != DType::F32 || t->numElements() != size)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  std::string("cuda::DistributedOptimizer::") + what +
                      ": the host optimizer's moments are " +
                      std::to_string(t->numElements()) + " " +
                      dtypeName(t->dtype) + " elements, expected " +
                      std::to_string(size) + " f32 (the same rank's shard)");
  return {tensors[0], tensors[1]};
}

/// Checks that the host optimizer holds the same parameters outside the
/// buffer as `local`.
void checkLocalParameters(const train::DistributedOptimizer &host,
                          const std::vector<size_t> &local, const char *what) {
  if (host.localParameters() != local)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                std::string("cuda::DistributedOptimizer::") + what +
                    ": the host optimizer holds " +
                    std::to_string(host.localParameters().size()) +
                    " parameters outside the buffer, this one " +
                    std::to_string(local.size()) +
                    " (the same rank's, expected)");
}
} // namespace

void DistributedOptimizer::download(train::DistributedOptimizer &to) const {
  int64_t size = buffer_.shard().size;
  auto [expAvg, expAvgSq] = hostMoments(to, size, "download");
  Context &context = parameters_.context();
  size_t bytes = sizeof(float) * static_cast<size_t>(size);
  const float *moments = moments_.as<float>();
  MTRT_CUDA_CHECK(cudaMemcpyAsync(expAvg->buffer.data(), moments, bytes,
                                  cudaMemcpyDeviceToHost, context.stream()),
                  "downloading the distributed optimizer's moments");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(expAvgSq->buffer.data(), moments + size,
                                  bytes, cudaMemcpyDeviceToHost,
                                  context.stream()),
                  "downloading the distributed optimizer's moments");
  checkLocalParameters(to, local_, "download");
  const float *local = localMoments_.as<float>();
  for (size_t k = 0, at = 0; k < local_.size(); ++k) {
    size_t n = static_cast<size_t>(parameters_.count(local_[k]));
    MTRT_CUDA_CHECK(cudaMemcpyAsync(to.localExpAvg(k).buffer.data(), local + at,
                                    n * sizeof(float), cudaMemcpyDeviceToHost,
                                    context.stream()),
                    "downloading the experts' moments");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(to.localExpAvgSq(k).buffer.data(),
                                    local + localElements_ + at,
                                    n * sizeof(float), cudaMemcpyDeviceToHost,
                                    context.stream()),
                    "downloading the experts' moments");
    at += n;
  }
  context.synchronize("downloading the distributed optimizer's moments");
}

void DistributedOptimizer::upload(const train::DistributedOptimizer &from) {
  int64_t size = buffer_.shard().size;
  auto [expAvg, expAvgSq] = hostMoments(
      const_cast<train::DistributedOptimizer &>(from), size, "upload");
  Context &context = parameters_.context();
  size_t bytes = sizeof(float) * static_cast<size_t>(size);
  float *moments = moments_.as<float>();
  MTRT_CUDA_CHECK(cudaMemcpyAsync(moments, expAvg->buffer.data(), bytes,
                                  cudaMemcpyHostToDevice, context.stream()),
                  "uploading the distributed optimizer's moments");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(moments + size, expAvgSq->buffer.data(),
                                  bytes, cudaMemcpyHostToDevice,
                                  context.stream()),
                  "uploading the distributed optimizer's moments");
  auto &host = const_cast<train::DistributedOptimizer &>(from);
  checkLocalParameters(host, local_, "upload");
  float *local = localMoments_.as<float>();
  for (size_t k = 0, at = 0; k < local_.size(); ++k) {
    size_t n = static_cast<size_t>(parameters_.count(local_[k]));
    MTRT_CUDA_CHECK(cudaMemcpyAsync(local + at,
                                    host.localExpAvg(k).buffer.data(),
                                    n * sizeof(float), cudaMemcpyHostToDevice,
                                    context.stream()),
                    "uploading the experts' moments");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(local + localElements_ + at,
                                    host.localExpAvgSq(k).buffer.data(),
                                    n * sizeof(float), cudaMemcpyHostToDevice,
                                    context.stream()),
                    "uploading the experts' moments");
    at += n;
  }
  context.synchronize("uploading the distributed optimizer's moments");
}

bool DistributedOptimizer::unscaleAndCheckFinite(double factor,
                                                 int64_t iteration) {
  return unscaler_.unscaleAndCheckFinite(
      buffer_.reduced(), buffer_.shard().size, factor, iteration);
}

void DistributedOptimizer::updateExpertBiases(int64_t iteration,
                                              const std::string &what) {
  // train::DistributedOptimizer::updateExpertBiases on the host: this
  // rank's pieces of the biases and their counts come over, the world sums
  // each bias's count, the pieces go back; the gather brings the rest.
  Context &context = parameters_.context();
  cudaStream_t stream = context.stream();
  const train::BufferShard &shard = buffer_.shard();
  const float *g = buffer_.reduced();
  std::vector<const train::BufferPiece *> pieces;
  for (const train::BufferPiece &piece : shard.pieces)
    if (parameters_.info(piece.parameter).isExpertBias())
      pieces.push_back(&piece);
  std::vector<std::vector<float>> values(pieces.size()), counts(pieces.size());
  for (size_t k = 0; k < pieces.size(); ++k) {
    const train::BufferPiece &piece = *pieces[k];
    size_t bytes = sizeof(float) * static_cast<size_t>(piece.count);
    values[k].resize(static_cast<size_t>(piece.count));
    counts[k].resize(static_cast<size_t>(piece.count));
    MTRT_CUDA_CHECK(cudaMemcpyAsync(values[k].data(),
                                    parameters_.value(piece.parameter) +
                                        piece.parameterOffset,
                                    bytes, cudaMemcpyDeviceToHost, stream),
                    what + " (reading an expert bias)");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(counts[k].data(), g + piece.shardOffset,
                                    bytes, cudaMemcpyDeviceToHost, stream),
                    what + " (reading an expert bias's tokens per expert)");
  }
  context.synchronize(what + " (the expert biases)");
  std::vector<double> totals(parameters_.size(), 0.0);
  for (size_t k = 0; k < pieces.size(); ++k)
    if (train::countsInNorm(parameters_.info(pieces[k]->parameter),
                            rank_.coordinates(), buffer_.gridAxes()))
      for (float c : counts[k])
        totals[pieces[k]->parameter] += c;
  rank_.world().allReduce<double>(
      totals.data(), totals.data(), static_cast<int64_t>(totals.size()),
      comm::ReduceOp::Sum,
      comm::CallInfo{"expert loads of iteration " + std::to_string(iteration),
                     iteration});
  for (size_t k = 0; k < pieces.size(); ++k) {
    const train::BufferPiece &piece = *pieces[k];
    const Parameter &info = parameters_.info(piece.parameter);
    train::updateExpertBias<float>(
        values[k].data(), counts[k].data(), piece.count,
        train::expertLoadMean<float>(totals[piece.parameter],
                                     info.type.numElements),
        info.expertBiasUpdateRate);
    MTRT_CUDA_CHECK(
        cudaMemcpyAsync(
            parameters_.value(piece.parameter) + piece.parameterOffset,
            values[k].data(), sizeof(float) * static_cast<size_t>(piece.count),
            cudaMemcpyHostToDevice, stream),
        what + " (writing an expert bias)");
    if (parameters_.bf16Offset(piece.parameter) >= 0)
      parameters_.refreshBf16Copy(piece.parameter);
  }
  context.synchronize(what + " (the expert biases)");
}

train::OptimizerStepResult DistributedOptimizer::step(int64_t iteration,
                                                      double gradScale,
                                                      bool deferGather) {
  Context &context = parameters_.context();
  cudaStream_t stream = context.stream();
  std::string what =
      "distributed optimizer step of iteration " + std::to_string(iteration);
  const train::BufferShard &shard = buffer_.shard();
  float *g = buffer_.reduced();

  // train::DistributedOptimizer's norm: the squares of the scaled gradient
  // (formed on the fly, the same float product the AdamW kernel stores) of
  // each piece whose replicas no other rank counts, summed exactly: a
  // histogram by exponent on the device, an integer on the host, all-
  // reduced over the world (train::ExactSquareSum).
  float scale = gradScale != 1.0 ? static_cast<float>(gradScale) : 1.0f;
  if (hasExpertBias_)
    updateExpertBiases(iteration, what);
  size_t count = shard.pieces.size();
  size_t histogramBytes = squares_.size();
  MTRT_CUDA_CHECK(cudaMemsetAsync(squares_.data(), 0, histogramBytes, stream),
                  what);
  for (size_t k = 0; k < count; ++k) {
    const train::BufferPiece &piece = shard.pieces[k];
    if (parameters_.info(piece.parameter).isExpertBias() ||
        !train::countsInNorm(parameters_.info(piece.parameter),
                             rank_.coordinates(), buffer_.gridAxes()))
      continue;
    MTRT_CUDA_CHECK_LAUNCH(squareHistogram(stream, piece.count,
                                           g + piece.shardOffset, scale,
                                           squares_.as<uint64_t>()),
                           what);
  }
  // A parameter outside the buffer counts on one of its replicas.
  for (size_t i : local_)
    if (!parameters_.info(i).isExpertBias() &&
        train::countsInNorm(parameters_.info(i), rank_.coordinates(), {}))
      MTRT_CUDA_CHECK_LAUNCH(squareHistogram(stream, parameters_.count(i),
                                             parameters_.gradient(i), scale,
                                             squares_.as<uint64_t>()),
                             what);
  std::vector<uint64_t> histogram(histogramBytes / sizeof(uint64_t));
  MTRT_CUDA_CHECK(cudaMemcpyAsync(histogram.data(), squares_.data(),
                                  histogramBytes, cudaMemcpyDeviceToHost,
                                  stream),
                  what);
  context.synchronize(what);
  train::ExactSquareSum squares(/*f64=*/false);
  squares.addFloatHistogram(histogram.data());
  std::string label = "gradient norm of iteration " + std::to_string(iteration);
  train::allReduceExact(squares, rank_.world(),
                        comm::CallInfo{label, iteration});
  double sum = squares.value();
  train::OptimizerStepResult result;
  result.gradNorm = std::sqrt(sum);
  train::checkGradNorm(result.gradNorm, iteration);
  AdamWScalars s = adamwScalars(config_, iteration, gradScale, result.gradNorm);
  result.learningRate = host::learningRate(config_.schedule, iteration - 1);

  float *expAvg = moments_.as<float>();
  if (chunkCount_ > 0) // the store's flat values start at parameter 0
    MTRT_CUDA_CHECK_LAUNCH(
        adamwStepChunks(stream, chunkCount_, chunks_.as<AdamWChunk>(),
                        parameters_.value(0), g, expAvg, expAvg + shard.size,
                        parameters_.bf16Values(), s),
        what + " (AdamW over " + std::to_string(count) +
            " pieces of parameters)");
  if (localChunkCount_ > 0) {
    float *localAvg = localMoments_.as<float>();
    MTRT_CUDA_CHECK_LAUNCH(
        adamwStepChunks(stream, localChunkCount_, localChunks_.as<AdamWChunk>(),
                        parameters_.value(0), localGradientBase_, localAvg,
                        localAvg + localElements_, parameters_.bf16Values(), s),
        what + " (AdamW over the " + std::to_string(local_.size()) +
            " parameters outside the buffer)");
  }
  buffer_.gatherParameters(deferGather);
  return result;
}

} // namespace mtrt::cuda
