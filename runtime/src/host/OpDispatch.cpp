// One bundle instruction to host kernel calls: sizes from the values table,
// scratch, id checks.
#include "host/Executor.h"

#include "comm/RankContext.h"
#include "core/ExecutorChecks.h"
#include "core/Fp8State.h"
#include "core/OpShapes.h"
#include "host/ParameterStore.h"
#include "host/RankCollective.h"
#include "host/ThreadPool.h"
#include "host/kernels/Bf16Rounding.h"
#include "host/kernels/Kernels.h"

#include <algorithm>
#include <cstring>

namespace mtrt::host {

/// Kernel scratch (saved statistics, recomputed activations) from the
/// executor's free list, returned when it goes out of scope.
class ScratchBuffer {
public:
  ScratchBuffer(Executor &executor, size_t bytes)
      : executor_(executor), buffer_(executor.takeBuffer(bytes)) {}
  ~ScratchBuffer() { executor_.giveBuffer(std::move(buffer_)); }
  template <typename T> T *as() { return static_cast<T *>(buffer_.data()); }

private:
  Executor &executor_;
  Buffer buffer_;
};

namespace {

void check(const std::string &where, const KernelStatus &status) {
  if (!status.ok())
    throw Error(MTRT_STATUS_OUT_OF_RANGE, where + ": " + status.message());
}

/// The rows' innermost dimension of a [rows..., columns] value (the
/// sequence of [batch, sequence, hidden], which sequence parallelism
/// splits), or 0 when the rows are one dimension: the parameter gradients
/// sum the rows in the canonical order over it (layerNormBackward).
int64_t rowSequence(const std::vector<int64_t> &shape) {
  return shape.size() >= 3 ? shape[shape.size() - 2] : 0;
}

/// The global positions of a tile of `count` rows from `first` of a
/// sequence of `global`: without context parallelism (contextSize 1) the
/// rows themselves; with it the tile is a block of the load-balanced
/// sequence (context rank r holds chunks r and 2 contextSize - 1 - r, in
/// that order), mapped back to the global positions.
std::vector<int64_t> tilePositions(int64_t first, int64_t count,
                                   int64_t global, int64_t contextSize) {
  std::vector<int64_t> positions(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    positions[i] = first + i;
  if (contextSize > 1) {
    int64_t chunk = global / (2 * contextSize);
    for (int64_t &p : positions) {
      int64_t r = p / (2 * chunk), w = p % (2 * chunk);
      p = w < chunk ? r * chunk + w
                    : (2 * contextSize - 1 - r) * chunk + (w - chunk);
    }
  }
  return positions;
}

} // namespace

template <typename T>
void Executor::execute(size_t position, const Instruction &inst,
                       const MicroBatchKey &key) {
  const Function &fn = *function_;
  const Attributes &a = inst.attrs;
  ThreadPool &pool = pool_;
  auto in = [&](size_t i) {
    return static_cast<const T *>(slots_[inst.operands[i]].data);
  };
  auto out = [&](size_t i) {
    return static_cast<T *>(allocate(inst.results[i]));
  };
  auto shapeOf = [&](int64_t v) -> const std::vector<int64_t> & {
    return fn.values[v].shape;
  };
  auto operandShape = [&](size_t i) -> const std::vector<int64_t> & {
    return shapeOf(inst.operands[i]);
  };
  auto count = [&](int64_t v) { return fn.values[v].numElements; };
  auto isI64 = [&](size_t operand) {
    return fn.values[inst.operands[operand]].dtype == DType::I64;
  };
  // Calls body(ids) with operand `operand`'s ids as int32_t or int64_t.
  auto withIds = [&](size_t operand, auto &&body) {
    const void *data = slots_[inst.operands[operand]].data;
    if (isI64(operand))
      body(static_cast<const int64_t *>(data));
    else
      body(static_cast<const int32_t *>(data));
  };

  auto vocabBlock = [&] {
    return vocabularyBlock(bundle_.gridShape(), rank_, a.vocabShardAxes,
                           where(position));
  };

  switch (inst.op) {
  case Op::Fused: // the group's ops one by one: the unfused run's bits
    for (const Instruction &op : inst.body) {
      execute<T>(position, op, key);
      roundBf16Results(op);
    }
    for (const Instruction &op : inst.body)
      for (int64_t v : op.results)
        if (fn.innerValue[v])
          release(v);
    break;
  case Op::Cast: // to bf16: rounded with every bf16 result (run's loop)
    std::memcpy(allocate(inst.results[0]), in(0),
                static_cast<size_t>(count(inst.results[0])) * sizeof(T));
    break;
  case Op::Fp8Scale:
    out(0)[0] = static_cast<T>(parameters_.fp8().scale(a.meta));
    break;
  case Op::Fp8Update:
    parameters_.fp8().update(static_cast<size_t>(a.meta),
                             static_cast<float>(in(0)[0]));
    break;
  case Op::Fp8CurrentScale: {
    float amax = fp8Amax<T>(pool, count(inst.operands[0]), in(0));
    out(0)[0] = static_cast<T>(fp8::scaleFromAmax(
        amax, 1.0f, fp8FormatOf(a.fp8Format), static_cast<int>(a.margin)));
    break;
  }
  case Op::Fp8Quantize: {
    T *codes = out(0);
    float amax = fp8Quantize<T>(
        pool, count(inst.operands[0]), in(0), static_cast<float>(in(1)[0]),
        fp8FormatOf(fn.values[inst.results[0]].dtype), codes);
    out(1)[0] = static_cast<T>(amax);
    break;
  }
  case Op::Fp8Linear: { // the codes' product, descaled, plus the bias
    const std::vector<int64_t> &x = operandShape(0), &w = operandShape(2);
    int64_t inSize = x.back(), outSize = a.transposeWeight ? w[0] : w[1];
    int64_t rows = count(inst.operands[0]) / inSize;
    T *y = out(0);
    linearForward<T>(pool, rows, inSize, outSize, in(0), in(2),
                     a.transposeWeight, nullptr, y);
    float descale = (1.0f / static_cast<float>(in(1)[0])) *
                    (1.0f / static_cast<float>(in(3)[0]));
    fp8Descale<T>(pool, rows, outSize, descale,
                  inst.operands.size() == 5 ? in(4) : nullptr, y);
    break;
  }
  case Op::Fp8LinearWeightGrad: {
    const std::vector<int64_t> &x = operandShape(0), &dy = operandShape(2);
    int64_t inSize = x.back(), outSize = dy.back();
    int64_t rows = count(inst.operands[0]) / inSize;
    T *dw = out(0);
    linearBackward<T>(pool, rows, inSize, outSize, in(0), nullptr,
                      a.transposeWeight, in(2), nullptr, dw, nullptr, false);
    float descale = (1.0f / static_cast<float>(in(1)[0])) *
                    (1.0f / static_cast<float>(in(3)[0]));
    fp8Descale<T>(pool, 1, inSize * outSize, descale, nullptr, dw);
    break;
  }
  case Op::GetParameter: {
    Slot &slot = slots_[inst.results[0]];
    slot.data =
        parameters_.value(static_cast<size_t>(a.parameter)).buffer.data();
    break;
  }
  case Op::AccumulateGradient: {
    Tensor &grad = parameters_.gradient(static_cast<size_t>(a.parameter));
    accumulateInto<T>(pool, grad.numElements(), in(0), grad.data<T>());
    break;
  }
  case Op::Fill:
    fill<T>(pool, count(inst.results[0]), out(0),
            static_cast<T>(a.lossSeed ? a.value * lossScale_ : a.value));
    break;
  case Op::PositionIds: {
    // Under sequence parallelism the ids are the rank's sequence tile: its
    // positions start at the tile's offset in the global sequence.
    // Under context parallelism (context_size > 1) the tile is a block of
    // the load-balanced sequence (context rank r holds chunks r and
    // 2 context_size - 1 - r, in that order), mapped back to the global
    // positions.
    int64_t v = inst.results[0];
    int64_t seq = shapeOf(v).back(), n = count(v), first = 0, global = seq;
    if (!a.splitAxes.empty()) {
      host::GlobalTile tile = globalTile(fn, inst, v, bundle_.gridShape(),
                                         parameters_.coordinates());
      first = tile.offsets.back();
      global = tile.globalShape.back();
    }
    std::vector<int64_t> positions =
        tilePositions(first, seq, global, a.contextSize);
    void *data = allocate(v);
    if (fn.values[v].dtype == DType::I64) {
      auto *ids = static_cast<int64_t *>(data);
      for (int64_t i = 0; i < n; ++i)
        ids[i] = positions[i % seq];
    } else {
      auto *ids = static_cast<int32_t *>(data);
      for (int64_t i = 0; i < n; ++i)
        ids[i] = static_cast<int32_t>(positions[i % seq]);
    }
    break;
  }
  case Op::Embedding: {
    EmbeddingDims d = embeddingDims(fn, inst);
    T *y = out(0);
    if (!a.vocabShardAxes.empty()) {
      auto [block, blocks] = vocabBlock();
      withIds(1, [&](auto *ids) {
        checkIds(where(position), "id", 1, inst.operands[1], ids, d.count,
                 d.vocab * blocks, "the vocabulary size (all ranks' blocks)",
                 nullptr);
        vocabEmbeddingForward<T>(pool, d.count, d.vocab, d.hidden,
                                 block * d.vocab, in(0), ids, y);
      });
      break;
    }
    withIds(1, [&](auto *ids) {
      checkIds(where(position), "id", 1, inst.operands[1], ids, d.count,
               d.vocab, "the embedding table's vocabulary size", nullptr);
      check(where(position), embeddingForward<T>(pool, d.count, d.vocab,
                                                 d.hidden, in(0), ids, y));
    });
    break;
  }
  case Op::EmbeddingGrad: {
    EmbeddingDims d = embeddingDims(fn, inst);
    T *dtable = out(0);
    if (!a.vocabShardAxes.empty()) {
      auto [block, blocks] = vocabBlock();
      withIds(1, [&](auto *ids) {
        checkIds(where(position), "id", 1, inst.operands[1], ids, d.count,
                 d.vocab * blocks, "the vocabulary size (all ranks' blocks)",
                 nullptr);
        vocabEmbeddingBackward<T>(pool, d.count, d.vocab, d.hidden,
                                  block * d.vocab, ids, in(0), dtable);
      });
      break;
    }
    withIds(1, [&](auto *ids) {
      checkIds(where(position), "id", 1, inst.operands[1], ids, d.count,
               d.vocab, "the embedding table's vocabulary size", nullptr);
      check(where(position),
            embeddingBackward<T>(pool, d.count, d.vocab, d.hidden, ids, in(0),
                                 dtable, false));
    });
    break;
  }
  case Op::LayerNorm:
  case Op::RmsNorm: {
    auto [rows, hidden] = normDims(fn, inst);
    ScratchBuffer stats(*this, 2 * sizeof(T) * static_cast<size_t>(rows));
    T *mean = stats.as<T>(), *rstd = mean + rows;
    if (inst.op == Op::LayerNorm)
      layerNormForward<T>(pool, rows, hidden, in(0), in(1),
                          inst.operands.size() == 3 ? in(2) : nullptr,
                          a.epsilon, out(0), mean, rstd);
    else
      rmsNormForward<T>(pool, rows, hidden, in(0), in(1), a.epsilon, out(0),
                        rstd);
    break;
  }
  case Op::LayerNormGrad:
  case Op::RmsNormGrad: {
    // Operands dy, x, weight; the statistics are recomputed from x.
    int64_t n = count(inst.operands[1]);
    auto [rows, hidden] = normDims(fn, inst);
    ScratchBuffer stats(*this, 2 * sizeof(T) * static_cast<size_t>(rows));
    ScratchBuffer y(*this, sizeof(T) * static_cast<size_t>(n));
    T *mean = stats.as<T>(), *rstd = mean + rows;
    T *dx = out(0), *dweight = out(1);
    if (inst.op == Op::LayerNormGrad) {
      layerNormForward<T>(pool, rows, hidden, in(1), in(2), nullptr, a.epsilon,
                          y.as<T>(), mean, rstd);
      layerNormBackward<T>(pool, rows, hidden, in(1), in(2), mean, rstd, in(0),
                           dx, dweight,
                           inst.results.size() == 3 ? out(2) : nullptr, false,
                           rowSequence(operandShape(1)));
    } else {
      rmsNormForward<T>(pool, rows, hidden, in(1), in(2), a.epsilon, y.as<T>(),
                        rstd);
      rmsNormBackward<T>(pool, rows, hidden, in(1), in(2), rstd, in(0), dx,
                         dweight, false, rowSequence(operandShape(1)));
    }
    break;
  }
  case Op::Linear: {
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    linearForward<T>(pool, rows, inSize, outSize, in(0), in(1),
                     a.transposeWeight,
                     inst.operands.size() == 3 ? in(2) : nullptr, out(0));
    break;
  }
  case Op::LinearWeightGrad: {
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    linearBackward<T>(pool, rows, inSize, outSize, in(0), nullptr,
                      a.transposeWeight, in(1), nullptr, out(0), nullptr,
                      false);
    break;
  }
  case Op::LinearWeightBiasGrad: { // linear_weight_grad and bias_grad
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    linearBackward<T>(pool, rows, inSize, outSize, in(0), nullptr,
                      a.transposeWeight, in(1), nullptr, out(0), out(1), false,
                      rowSequence(operandShape(1)));
    break;
  }
  case Op::LinearAdd: { // linear into the result, then the add in place
    // The unfused linear's result had the add's type: a bf16 one is
    // rounded before the add, as it was stored (the cuda backend rounds
    // once, after cuBLASLt adds C: within the GEMMs' tolerance).
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    T *y = out(0);
    int64_t n = count(inst.results[0]);
    linearForward<T>(pool, rows, inSize, outSize, in(0), in(1),
                     a.transposeWeight,
                     inst.operands.size() == 4 ? in(3) : nullptr, y);
    if (fn.values[inst.results[0]].dtype == DType::BF16)
      roundAllToBf16(y, n);
    addForward<T>(pool, n, y, in(2), y);
    break;
  }
  case Op::LinearGelu: { // linear into the pre-activation, then gelu
    // out(i) allocates the result: once each.
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    T *pre = out(1), *y = out(0);
    linearForward<T>(pool, rows, inSize, outSize, in(0), in(1),
                     a.transposeWeight,
                     inst.operands.size() == 3 ? in(2) : nullptr, pre);
    geluForward<T>(pool, count(inst.results[1]), pre, y,
                   toKernel(a.approximate));
    break;
  }
  case Op::LinearGeluGrad: { // linear, gelu_grad in place, then bias_grad
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    T *dx = out(0);
    linearForward<T>(pool, rows, inSize, outSize, in(0), in(1),
                     a.transposeWeight, nullptr, dx);
    geluBackward<T>(pool, count(inst.results[0]), in(2), dx, dx,
                    toKernel(a.approximate));
    if (inst.results.size() == 2)
      linearBackward<T>(pool, rows, 0, outSize, nullptr, nullptr, false, dx,
                        nullptr, nullptr, out(1), false,
                        rowSequence(shapeOf(inst.results[0])));
    break;
  }
  case Op::BiasGrad: {
    LinearDims d = linearDims(fn, inst);
    linearBackward<T>(pool, d.rows, 0, d.outSize, nullptr, nullptr, false,
                      in(0), nullptr, nullptr, out(0), false,
                      rowSequence(operandShape(0)));
    break;
  }
  case Op::Matmul: {
    auto [batch, m, n, k] = matmulDims(fn, inst);
    matmulForward<T>(pool, batch, m, n, k, in(0), a.transposeLhs, in(1),
                     a.transposeRhs, out(0));
    break;
  }
  case Op::Attention: {
    AttentionParams p = attentionParams(fn, inst, key.firstSample);
    setAttentionTile(p, fn, inst, bundle_.gridShape(),
                     parameters_.coordinates());
    ScratchBuffer lse(
        *this, sizeof(T) * static_cast<size_t>(p.batch * p.headsQ * p.seqQ));
    attentionForward<T>(pool, p, in(0), in(1), in(2), out(0), lse.as<T>());
    break;
  }
  case Op::AttentionGrad: {
    // Operands dy, q, k, v; the forward is rerun for its logsumexp.
    AttentionParams p = attentionParams(fn, inst, key.firstSample);
    setAttentionTile(p, fn, inst, bundle_.gridShape(),
                     parameters_.coordinates());
    ScratchBuffer lse(
        *this, sizeof(T) * static_cast<size_t>(p.batch * p.headsQ * p.seqQ));
    ScratchBuffer o(*this,
                    sizeof(T) * static_cast<size_t>(count(inst.operands[0])));
    attentionForward<T>(pool, p, in(1), in(2), in(3), o.as<T>(), lse.as<T>());
    attentionBackward<T>(pool, p, in(1), in(2), in(3), lse.as<T>(), in(0),
                         out(0), out(1), out(2));
    break;
  }
  case Op::AttentionBlock:
  case Op::AttentionBlockGrad: {
    // Context parallelism: the queries' and the keys' global positions from
    // the rank's place on the context axis (docs/Parallelism.md).
    bool grad = inst.op == Op::AttentionBlockGrad;
    AttentionParams p = attentionParams(fn, inst, key.firstSample);
    setAttentionTile(p, fn, inst, bundle_.gridShape(),
                     parameters_.coordinates());
    const std::vector<int64_t> &coordinates = parameters_.coordinates();
    int64_t cp = a.contextSize, seq = p.seqQ * cp;
    int64_t rank = coordinates.empty() ? 0 : coordinates[a.contextAxis];
    std::vector<int64_t> queries(static_cast<size_t>(p.seqQ));
    std::vector<int64_t> keys(static_cast<size_t>(p.seqK));
    contextParallelPositions(rank, cp, seq, queries.data());
    if (a.keyStep)
      contextParallelPositions((rank - *a.keyStep + cp) % cp, cp, seq,
                               keys.data());
    else
      for (int64_t r = 0; r < cp; ++r)
        contextParallelPositions(r, cp, seq, keys.data() + r * p.seqQ);
    AttentionBlock block{queries.data(), keys.data(), seq};
    if (!grad) {
      attentionBlockForward<T>(pool, p, block, in(0), in(1), in(2), out(0),
                               out(1));
      break;
    }
    T *dq = out(0), *dk = out(1), *dv = out(2);
    std::fill_n(dq, count(inst.results[0]), T(0));
    std::fill_n(dk, count(inst.results[1]), T(0));
    std::fill_n(dv, count(inst.results[2]), T(0));
    attentionBlockBackward<T>(pool, p, block, in(1), in(2), in(3), in(4), in(5),
                              in(0), dq, dk, dv);
    break;
  }
  case Op::AttentionMerge:
  case Op::AttentionDelta: {
    // The rows of an output [batch, seq, heads, value_dim].
    const std::vector<int64_t> &o = operandShape(0);
    AttentionParams p;
    p.batch = o[0];
    p.seqQ = o[1];
    p.headsQ = o[2];
    p.headDimV = o[3];
    if (inst.op == Op::AttentionDelta) {
      attentionBackwardDelta<T>(pool, p, in(0), in(1), out(0));
      break;
    }
    T *merged = out(0), *lse = out(1);
    if (merged != in(0))
      std::copy_n(in(0), count(inst.results[0]), merged);
    if (lse != in(1))
      std::copy_n(in(1), count(inst.results[1]), lse);
    attentionMergeBlock<T>(pool, p, in(2), in(3), merged, lse);
    break;
  }
  case Op::Rope: {
    RopeDims d = ropeDims(fn, inst);
    // Under context parallelism the rows are the rank's tile of the
    // load-balanced sequence: rotated by their global positions.
    std::vector<int64_t> positions;
    if (a.contextSize > 1) {
      host::GlobalTile tile =
          globalTile(fn, inst, inst.operands[0], bundle_.gridShape(),
                     parameters_.coordinates());
      positions = tilePositions(tile.offsets[1], d.seq, tile.globalShape[1],
                                a.contextSize);
    }
    const int64_t *rows = positions.empty() ? nullptr : positions.data();
    if (a.inverse)
      ropeBackward<T>(pool, d.batch, d.seq, d.heads, d.headDim, d.rotary,
                      ropeFrequencies(a), in(0), out(0), rows);
    else
      ropeForward<T>(pool, d.batch, d.seq, d.heads, d.headDim, d.rotary,
                     ropeFrequencies(a), in(0), out(0), rows);
    break;
  }
  case Op::Gelu:
    geluForward<T>(pool, count(inst.operands[0]), in(0), out(0),
                   toKernel(a.approximate));
    break;
  case Op::GeluGrad:
    geluBackward<T>(pool, count(inst.operands[1]), in(1), in(0), out(0),
                    toKernel(a.approximate));
    break;
  case Op::Silu:
    siluForward<T>(pool, count(inst.operands[0]), in(0), out(0));
    break;
  case Op::SiluGrad:
    siluBackward<T>(pool, count(inst.operands[1]), in(1), in(0), out(0));
    break;
  case Op::Swiglu:
    swigluForward<T>(pool, count(inst.operands[0]), in(0), in(1), out(0));
    break;
  case Op::SwigluGrad:
    swigluBackward<T>(pool, count(inst.operands[1]), in(1), in(2), in(0),
                      out(0), out(1));
    break;
  case Op::Dropout: {
    random::MaskTile whole =
        dropoutMaskTile(fn, inst, bundle_.gridShape(),
                        parameters_.coordinates(), key.firstSample);
    if (a.contextSize <= 1) {
      dropoutForward<T>(pool, count(inst.operands[0]), in(0), out(0), a.p,
                        static_cast<uint64_t>(a.seed), whole);
      break;
    }
    // Context parallelism: the rows (dimension 1) are a block of the
    // load-balanced sequence. Each sample's runs of rows that are
    // consecutive in the global sequence are a tile of their own, at their
    // global positions, so the mask equals the one-rank run's.
    host::GlobalTile tile =
        globalTile(fn, inst, inst.operands[0], bundle_.gridShape(),
                   parameters_.coordinates());
    const int64_t rows = tile.localShape[1];
    std::vector<int64_t> positions = tilePositions(
        tile.offsets[1], rows, tile.globalShape[1], a.contextSize);
    int64_t inner = 1;
    for (size_t d = 2; d < tile.localShape.size(); ++d)
      inner *= tile.localShape[d];
    const T *x = in(0);
    T *y = out(0);
    for (int64_t b = 0; b < tile.localShape[0]; ++b)
      for (int64_t first = 0, last; first < rows; first = last) {
        for (last = first + 1;
             last < rows && positions[last] == positions[last - 1] + 1; ++last)
          ;
        std::vector<int64_t> local = tile.localShape, offsets = tile.offsets;
        local[0] = 1;
        local[1] = last - first;
        offsets[0] += b;
        offsets[1] = positions[first];
        random::MaskTile run;
        random::makeMaskTile(local.data(), tile.globalShape.data(),
                             offsets.data(),
                             static_cast<unsigned>(local.size()),
                             key.firstSample, run);
        int64_t at = (b * rows + first) * inner;
        dropoutForward<T>(pool, (last - first) * inner, x + at, y + at, a.p,
                          static_cast<uint64_t>(a.seed), run);
      }
    break;
  }
  case Op::Add:
    addForward<T>(pool, count(inst.operands[0]), in(0), in(1), out(0));
    break;
  case Op::Mul:
    mulForward<T>(pool, count(inst.operands[0]), in(0), in(1), out(0));
    break;
  case Op::Softmax:
  case Op::SoftmaxGrad: {
    auto [outer, axis, inner] = softmaxDims(fn, inst);
    if (inst.op == Op::SoftmaxGrad)
      softmaxBackward<T>(pool, outer, axis, inner, in(1), in(0), out(0));
    else
      softmaxForward<T>(pool, outer, axis, inner, in(0), out(0));
    break;
  }
  case Op::VocabMax: {
    const std::vector<int64_t> &shape = operandShape(0);
    int64_t vocab = shape.back();
    vocabMax<T>(pool, count(inst.operands[0]) / vocab, vocab, in(0), out(0));
    break;
  }
  case Op::VocabPartials:
  case Op::VocabCrossEntropyGrad: {
    bool grad = inst.op == Op::VocabCrossEntropyGrad;
    size_t logitsAt = grad ? 1 : 0, labelsAt = logitsAt + 1;
    int64_t vocab = operandShape(logitsAt).back();
    int64_t rows = count(inst.operands[logitsAt]) / vocab;
    auto [block, blocks] = vocabBlock();
    T *result = out(0);
    withIds(labelsAt, [&](auto *labels) {
      checkIds(where(position), "label", labelsAt, inst.operands[labelsAt],
               labels, rows, vocab * blocks,
               "the vocabulary size (all ranks' blocks)",
               grad ? &a.ignoreIndex : nullptr);
      if (grad)
        vocabCrossEntropyGrad<T>(pool, rows, vocab, block * vocab, in(1),
                                 labels, a.ignoreIndex, toKernel(a.reduction),
                                 in(0), in(3), in(4), result);
      else
        vocabPartials<T>(pool, rows, vocab, block * vocab, in(0), labels,
                         in(2), result);
    });
    break;
  }
  case Op::VocabCrossEntropy: {
    int64_t rows = count(inst.operands[1]);
    T *result = out(0);
    withIds(1, [&](auto *labels) {
      vocabCrossEntropy<T>(rows, in(0), labels, a.ignoreIndex,
                           toKernel(a.reduction), result);
    });
    break;
  }
  case Op::CrossEntropy:
  case Op::CrossEntropyGrad: {
    bool grad = inst.op == Op::CrossEntropyGrad;
    CrossEntropyDims d = crossEntropyDims(fn, inst);
    const T *logits = in(d.logitsAt);
    T *result = out(0);
    withIds(d.labelsAt, [&](auto *labels) {
      checkIds(where(position), "label", d.labelsAt, inst.operands[d.labelsAt],
               labels, d.rows, d.vocab, "the logits' vocabulary size",
               &a.ignoreIndex);
      if (grad)
        check(where(position),
              crossEntropyBackward<T>(pool, d.rows, d.vocab, logits, labels,
                                      a.ignoreIndex, toKernel(a.reduction),
                                      in(0), result));
      else
        check(where(position),
              crossEntropyForward<T>(pool, d.rows, d.vocab, logits, labels,
                                     a.ignoreIndex, toKernel(a.reduction),
                                     result));
    });
    break;
  }
  case Op::LinearCrossEntropy: {
    // input [rows..., in], weight, labels [rows...]: one chunk's logits at
    // a time in scratch, never the whole vocabulary's.
    const std::vector<int64_t> &w = operandShape(1);
    int64_t inSize = operandShape(0).back();
    int64_t vocab = a.transposeWeight ? w[0] : w[1];
    int64_t rows = count(inst.operands[2]);
    int64_t chunk = std::min(a.chunkRows, std::max<int64_t>(rows, 1));
    T *loss = out(0), *dx = out(1), *dweight = out(2);
    // The chunk's logits have the input's type (OpScratch.h): the kernel
    // rounds them, and their gradient, where the CUDA kernel stores bf16.
    bool bf16Logits = fn.values[inst.operands[0]].dtype == DType::BF16;
    ScratchBuffer logits(*this, static_cast<size_t>(chunk * vocab) * sizeof(T));
    withIds(2, [&](auto *labels) {
      checkIds(where(position), "label", 2, inst.operands[2], labels, rows,
               vocab, "the weight's vocabulary size", &a.ignoreIndex);
      linearCrossEntropy<T>(pool, rows, inSize, vocab, chunk, in(0), in(1),
                            a.transposeWeight, labels, a.ignoreIndex,
                            toKernel(a.reduction), bf16Logits, logits.as<T>(),
                            loss, dx, dweight);
    });
    break;
  }
  case Op::LinearVocabMax:
  case Op::LinearVocabPartials:
  case Op::LinearVocabCrossEntropyGrad: {
    // input [rows..., in], weight, ...: the rank's vocabulary block's
    // logits one chunk at a time in scratch (docs/Memory.md).
    const std::vector<int64_t> &w = operandShape(1);
    int64_t inSize = operandShape(0).back();
    int64_t vocab = a.transposeWeight ? w[0] : w[1];
    int64_t rows = count(inst.operands[0]) / std::max<int64_t>(inSize, 1);
    int64_t chunk = std::min(a.chunkRows, std::max<int64_t>(rows, 1));
    bool bf16Logits = fn.values[inst.operands[0]].dtype == DType::BF16;
    ScratchBuffer logits(*this, static_cast<size_t>(chunk * vocab) * sizeof(T));
    if (inst.op == Op::LinearVocabMax) {
      linearVocabMax<T>(pool, rows, inSize, vocab, chunk, in(0), in(1),
                        a.transposeWeight, bf16Logits, logits.as<T>(), out(0));
      break;
    }
    auto [block, blocks] = vocabBlock();
    bool grad = inst.op == Op::LinearVocabCrossEntropyGrad;
    withIds(2, [&](auto *labels) {
      checkIds(where(position), "label", 2, inst.operands[2], labels, rows,
               vocab * blocks, "the vocabulary size (all ranks' blocks)",
               grad ? &a.ignoreIndex : nullptr);
      if (grad)
        linearVocabCrossEntropyGrad<T>(
            pool, rows, inSize, vocab, chunk, block * vocab, in(0), in(1),
            a.transposeWeight, labels, a.ignoreIndex, toKernel(a.reduction),
            in(5), in(3), in(4), bf16Logits, logits.as<T>(), out(0), out(1));
      else
        linearVocabPartials<T>(pool, rows, inSize, vocab, chunk, block * vocab,
                               in(0), in(1), a.transposeWeight, labels, in(3),
                               bf16Logits, logits.as<T>(), out(0));
    });
    break;
  }
  case Op::Scale:
    scaleForward<T>(pool, count(inst.operands[0]), in(0), in(1)[0], out(0));
    break;
  case Op::MoeRoute:
  case Op::MoeRouteGrad:
  case Op::MoeAuxLoss:
  case Op::MoeAuxLossGrad: {
    // Router logits [T, E]: operand 0 of the forward ops, 1 of the grads.
    bool grad = inst.op == Op::MoeRouteGrad || inst.op == Op::MoeAuxLossGrad;
    bool isAuxLoss = inst.op == Op::MoeAuxLoss || inst.op == Op::MoeAuxLossGrad;
    const std::vector<int64_t> &logits = operandShape(grad ? 1 : 0);
    MoeRouter router;
    router.tokens = logits[0];
    router.experts = logits[1];
    router.topk = a.topk;
    router.sigmoid = a.sigmoid;
    router.normalize = a.normalize;
    router.numGroups = a.numGroups;
    router.groupTopk = a.groupTopk;
    router.sequenceLength = a.sequenceLength;
    router.capacityFactor = a.capacityFactor.value_or(0.0);
    router.dropByPosition = a.dropByPosition;
    // The expert bias: operand 1 of moe_route, 3 of moe_route_grad.
    size_t biasOperand = inst.op == Op::MoeRoute ? 1 : 3;
    std::vector<double> bias;
    if (!isAuxLoss && inst.operands.size() > biasOperand) {
      const T *values = in(biasOperand);
      bias.assign(values, values + router.experts);
      router.expertBias = bias.data();
    }
    if (inst.op == Op::MoeRoute)
      moeRouteForward<T>(pool, router, in(0), out(0),
                         static_cast<int32_t *>(allocate(inst.results[1])));
    else if (inst.op == Op::MoeRouteGrad)
      moeRouteBackward<T>(
          pool, router, in(1),
          static_cast<const int32_t *>(slots_[inst.operands[2]].data), in(0),
          out(0));
    else if (inst.op == Op::MoeAuxLoss)
      moeAuxLossForward<T>(pool, router, a.coeff, in(0), out(0));
    else
      moeAuxLossBackward<T>(pool, router, a.coeff, in(1), in(0), out(0));
    break;
  }
  case Op::MoeZLoss:
  case Op::MoeZLossGrad: {
    bool grad = inst.op == Op::MoeZLossGrad;
    const std::vector<int64_t> &logits = operandShape(grad ? 1 : 0);
    if (grad)
      moeZLossBackward<T>(pool, logits[0], logits[1], a.coeff, in(1), in(0),
                          out(0));
    else
      moeZLossForward<T>(pool, logits[0], logits[1], a.coeff, in(0), out(0));
    break;
  }
  case Op::MoeTokensPerExpert: {
    // Each expert's kept slots, from the layout that checks the indices.
    const std::vector<int64_t> &routing = operandShape(0);
    const int64_t experts = shapeOf(inst.results[0])[0];
    MoeLayout layout;
    check(where(position),
          moeLayout(routing[0], routing[1], experts,
                    static_cast<const int32_t *>(slots_[inst.operands[0]].data),
                    layout));
    T *counts = out(0);
    for (int64_t e = 0; e < experts; ++e)
      counts[e] = static_cast<T>(layout.offsets[e + 1] - layout.offsets[e]);
    break;
  }
  case Op::MoePermute:
  case Op::MoeUnpermute:
  case Op::MoeProbsGrad:
  case Op::MoeGroupedLinear:
  case Op::MoeGroupedLinearWeightGrad: {
    // The routing indices [T, K]: operand 1 of the permutations, 2 of the
    // rest. The grouped GEMMs bound them by their experts.
    size_t at = inst.op == Op::MoePermute || inst.op == Op::MoeUnpermute ? 1 : 2;
    const std::vector<int64_t> &routing = operandShape(at);
    const int64_t tokens = routing[0], topk = routing[1];
    int64_t experts = -1;
    if (inst.op == Op::MoeGroupedLinear)
      experts = operandShape(1)[0];
    if (inst.op == Op::MoeGroupedLinearWeightGrad)
      experts = shapeOf(inst.results[0])[0];
    MoeLayout layout;
    check(where(position),
          moeLayout(tokens, topk, experts,
                    static_cast<const int32_t *>(slots_[inst.operands[at]].data),
                    layout));
    const T *probs = inst.operands.size() == 3 && at == 1 ? in(2) : nullptr;
    switch (inst.op) {
    case Op::MoePermute:
      moePermute<T>(pool, tokens, topk, operandShape(0)[1], layout, in(0),
                    probs, out(0));
      break;
    case Op::MoeUnpermute:
      moeUnpermute<T>(pool, tokens, topk, operandShape(0)[1], layout, in(0),
                      probs, out(0));
      break;
    case Op::MoeProbsGrad:
      moeProbsGrad<T>(pool, tokens, topk, operandShape(0)[1], layout, in(0),
                      in(1), out(0));
      break;
    case Op::MoeGroupedLinear: {
      const int64_t inSize = operandShape(0)[1];
      const int64_t outSize = shapeOf(inst.results[0])[1];
      moeGroupedLinear<T>(pool, tokens * topk, inSize, outSize, layout, in(0),
                          in(1), a.transposeWeight, out(0));
      break;
    }
    default: // MoeGroupedLinearWeightGrad
      moeGroupedLinearWeightGrad<T>(pool, operandShape(0)[1],
                                    operandShape(1)[1], layout, in(0), in(1),
                                    a.transposeWeight, out(0));
      break;
    }
    break;
  }
  case Op::AllReduce:
  case Op::AllGather:
  case Op::ReduceScatter:
  case Op::AllSlice:
  case Op::Shift:
    collective<T>(position, inst, key.step);
    break;
  case Op::AllToAll:
    allToAll<T>(position, inst, key.step);
    break;
  case Op::MoeDispatchRows:
  case Op::MoeDispatchExperts:
  case Op::MoeCombineRows: {
    size_t at = inst.op == Op::MoeDispatchExperts ? 0 : 1;
    const std::vector<int64_t> &routing = operandShape(at);
    const int64_t slots = routing[0] * routing[1];
    MoeLayout layout;
    check(where(position),
          moeLayout(routing[0], routing[1], a.numExperts,
                    static_cast<const int32_t *>(slots_[inst.operands[at]].data),
                    layout));
    if (inst.op == Op::MoeDispatchExperts)
      moeDispatchExperts(slots, a.expertRanks, layout,
                         static_cast<int32_t *>(allocate(inst.results[0])));
    else
      moeDispatchBlocks<T>(slots, operandShape(0)[1], a.expertRanks, layout,
                           inst.op == Op::MoeCombineRows, in(0), out(0));
    break;
  }
  case Op::BiasAdd: {
    int64_t n = operandShape(0).back();
    int64_t total = count(inst.operands[0]);
    biasAddForward<T>(pool, n ? total / n : 0, n, in(0), in(1), out(0));
    break;
  }
  case Op::Reshape: {
    // In place (the memory plan gave the result its operand's block), the
    // bytes are already there.
    const T *x = in(0);
    T *y = out(0);
    if (y != x)
      std::memcpy(y, x, sizeof(T) * static_cast<size_t>(count(inst.operands[0])));
    break;
  }
  case Op::Transpose: {
    const auto &x = operandShape(0);
    transposeForward<T>(pool, static_cast<int>(x.size()), x.data(),
                        a.permutation.data(), in(0), out(0));
    break;
  }
  case Op::Split:
  case Op::Concat: {
    bool split = inst.op == Op::Split;
    SplitDims d = splitDims(fn, inst);
    const auto &pieces = split ? inst.results : inst.operands;
    std::vector<int64_t> sizes;
    for (int64_t v : pieces)
      sizes.push_back(shapeOf(v)[d.axis]);
    int piecesCount = static_cast<int>(pieces.size());
    if (split) {
      std::vector<T *> outputs;
      for (size_t i = 0; i < pieces.size(); ++i)
        outputs.push_back(out(i));
      splitForward<T>(pool, d.outer, d.inner, piecesCount, sizes.data(), in(0),
                      outputs.data());
    } else {
      std::vector<const T *> inputs;
      for (size_t i = 0; i < pieces.size(); ++i)
        inputs.push_back(in(i));
      concatForward<T>(pool, d.outer, d.inner, piecesCount, sizes.data(),
                       inputs.data(), out(0));
    }
    break;
  }
  }
}

/// The collectives over the rank's group along grid_axes, and all_slice
/// (host/RankCollective.h).
template <typename T>
void Executor::collective(size_t position, const Instruction &inst,
                          uint64_t step) {
  const Function &fn = *function_;
  const T *x = static_cast<const T *>(slots_[inst.operands[0]].data);
  T *y = static_cast<T *>(allocate(inst.results[0]));
  ScratchBuffer staging(
      *this, sizeof(T) * static_cast<size_t>(rankCollectiveStaging(
                             fn, inst, bundle_.gridShape())));
  runRankCollective<T>(pool_, fn, inst, bundle_.gridShape(), rank_,
                       comm::CallInfo{where(position),
                                      static_cast<int64_t>(step)},
                       x, y, staging.as<T>());
}

template <typename T>
void Executor::allToAll(size_t position, const Instruction &inst,
                        uint64_t step) {
  const Function &fn = *function_;
  const TensorType &type = fn.values[inst.operands[0]];
  // The i32 routing travels as 4-byte f32 words: the exchange only moves
  // bytes, and the communicators take floating types.
  const bool ids = type.dtype == DType::I32;
  const DType dtype = ids ? DType::F32 : comm::DTypeOf<T>::value;
  const size_t element = ids ? sizeof(int32_t) : sizeof(T);
  const char *x = static_cast<const char *>(slots_[inst.operands[0]].data);
  char *y = static_cast<char *>(allocate(inst.results[0]));
  const int64_t count = type.numElements;
  const int64_t group = gridGroupSize(bundle_.gridShape(), inst.attrs.gridAxes);
  if (group == 1) {
    std::memcpy(y, x, element * static_cast<size_t>(count));
    return;
  }
  comm::Communicator &comm = rank_->group(inst.attrs.gridAxes);
  const int r = comm.rank(), n = comm.size();
  const int64_t block = count / n;
  const size_t bytes = element * static_cast<size_t>(block);
  std::memcpy(y + r * bytes, x + r * bytes, bytes);
  // Round k: to the rank k ahead, from the rank k behind (pairwise exchange;
  // every pair meets in the same round, so no rank waits on another pair).
  comm::CallInfo info{where(position), static_cast<int64_t>(step)};
  for (int k = 1; k < n; ++k) {
    int to = (r + k) % n, from = (r - k + n) % n;
    comm.sendRecv(x + to * bytes, to, y + from * bytes, from, block, dtype,
                  info);
  }
}

template void Executor::execute<float>(size_t, const Instruction &,
                                       const MicroBatchKey &);
template void Executor::execute<double>(size_t, const Instruction &,
                                        const MicroBatchKey &);

} // namespace mtrt::host
