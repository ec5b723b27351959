// One bundle instruction to host kernel calls: sizes from the values table,
// scratch, id checks.
#include "host/Executor.h"

#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

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

int64_t product(const std::vector<int64_t> &shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i)
    n *= shape[i];
  return n;
}

/// Checks that every id is in [0, limit) (or equals `ignore` when given), so
/// that the error names the instruction and the operand, not just the
/// kernel.
template <typename Id>
void checkIds(const std::string &where, const char *what, size_t operand,
              int64_t value, const Id *ids, int64_t count, int64_t limit,
              const char *limitName, const int64_t *ignore) {
  for (int64_t i = 0; i < count; ++i) {
    int64_t id = static_cast<int64_t>(ids[i]);
    if ((id >= 0 && id < limit) || (ignore && id == *ignore))
      continue;
    throw Error(
        MTRT_STATUS_OUT_OF_RANGE,
        where + ": operands[" + std::to_string(operand) + "] (value " +
            std::to_string(value) + ") holds " + what + " " +
            std::to_string(id) + " at element " + std::to_string(i) +
            ", outside [0, " + std::to_string(limit) + "): " + limitName +
            " is " + std::to_string(limit) +
            (ignore ? " (and ignore_index is " + std::to_string(*ignore) + ")"
                    : std::string()) +
            "; the data must be tokenized for this vocabulary");
  }
}

void check(const std::string &where, const KernelStatus &status) {
  if (!status.ok())
    throw Error(MTRT_STATUS_OUT_OF_RANGE, where + ": " + status.message());
}

LossReduction toKernel(Reduction reduction) {
  switch (reduction) {
  case Reduction::Mean:
    return LossReduction::Mean;
  case Reduction::Sum:
    return LossReduction::Sum;
  case Reduction::None:
    break;
  }
  return LossReduction::None;
}

GeluApproximation toKernel(GeluApproximate approximate) {
  return approximate == GeluApproximate::Tanh ? GeluApproximation::Tanh
                                              : GeluApproximation::None;
}

AttentionParams attentionParams(const std::vector<int64_t> &q,
                                const std::vector<int64_t> &k,
                                const std::vector<int64_t> &v,
                                const Attributes &a, uint64_t step) {
  AttentionParams p;
  p.batch = q[0];
  p.seqQ = q[1];
  p.headsQ = q[2];
  p.headDim = q[3];
  p.seqK = k[1];
  p.headsKv = k[2];
  p.headDimV = v[3];
  p.causal = a.causal;
  p.scale = a.scale.value_or(0.0);
  p.dropoutP = a.dropoutP;
  p.seed = static_cast<uint64_t>(a.seed);
  p.step = step;
  return p;
}

} // namespace

template <typename T>
void Executor::execute(size_t position, const Instruction &inst,
                       uint64_t step) {
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

  switch (inst.op) {
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
    fill<T>(pool, count(inst.results[0]), out(0), static_cast<T>(a.value));
    break;
  case Op::PositionIds: {
    int64_t v = inst.results[0];
    int64_t seq = shapeOf(v).back(), n = count(v);
    void *data = allocate(v);
    if (fn.values[v].dtype == DType::I64) {
      auto *ids = static_cast<int64_t *>(data);
      for (int64_t i = 0; i < n; ++i)
        ids[i] = i % seq;
    } else {
      auto *ids = static_cast<int32_t *>(data);
      for (int64_t i = 0; i < n; ++i)
        ids[i] = static_cast<int32_t>(i % seq);
    }
    break;
  }
  case Op::Embedding: {
    int64_t vocab = operandShape(0)[0], hidden = operandShape(0)[1];
    int64_t n = count(inst.operands[1]);
    T *y = out(0);
    withIds(1, [&](auto *ids) {
      checkIds(where(position), "id", 1, inst.operands[1], ids, n, vocab,
               "the embedding table's vocabulary size", nullptr);
      check(where(position),
            embeddingForward<T>(pool, n, vocab, hidden, in(0), ids, y));
    });
    break;
  }
  case Op::EmbeddingGrad: {
    const auto &table = shapeOf(inst.results[0]);
    int64_t n = count(inst.operands[1]);
    T *dtable = out(0);
    withIds(1, [&](auto *ids) {
      checkIds(where(position), "id", 1, inst.operands[1], ids, n, table[0],
               "the embedding table's vocabulary size", nullptr);
      check(where(position), embeddingBackward<T>(pool, n, table[0], table[1],
                                                  ids, in(0), dtable, false));
    });
    break;
  }
  case Op::LayerNorm:
  case Op::RmsNorm: {
    int64_t hidden = operandShape(0).back();
    int64_t rows = hidden ? count(inst.operands[0]) / hidden : 0;
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
    int64_t hidden = operandShape(1).back();
    int64_t rows = hidden ? n / hidden : 0;
    ScratchBuffer stats(*this, 2 * sizeof(T) * static_cast<size_t>(rows));
    ScratchBuffer y(*this, sizeof(T) * static_cast<size_t>(n));
    T *mean = stats.as<T>(), *rstd = mean + rows;
    T *dx = out(0), *dweight = out(1);
    if (inst.op == Op::LayerNormGrad) {
      layerNormForward<T>(pool, rows, hidden, in(1), in(2), nullptr, a.epsilon,
                          y.as<T>(), mean, rstd);
      layerNormBackward<T>(pool, rows, hidden, in(1), in(2), mean, rstd, in(0),
                           dx, dweight,
                           inst.results.size() == 3 ? out(2) : nullptr, false);
    } else {
      rmsNormForward<T>(pool, rows, hidden, in(1), in(2), a.epsilon, y.as<T>(),
                        rstd);
      rmsNormBackward<T>(pool, rows, hidden, in(1), in(2), rstd, in(0), dx,
                         dweight, false);
    }
    break;
  }
  case Op::Linear: {
    const auto &w = operandShape(1);
    int64_t inSize = a.transposeWeight ? w[1] : w[0];
    int64_t outSize = a.transposeWeight ? w[0] : w[1];
    int64_t rows =
        inSize ? count(inst.operands[0]) / inSize
               : product(operandShape(0), 0, operandShape(0).size() - 1);
    linearForward<T>(pool, rows, inSize, outSize, in(0), in(1),
                     a.transposeWeight,
                     inst.operands.size() == 3 ? in(2) : nullptr, out(0));
    break;
  }
  case Op::LinearWeightGrad: {
    const auto &x = operandShape(0);
    int64_t inSize = x.back(), outSize = operandShape(1).back();
    int64_t rows = product(x, 0, x.size() - 1);
    linearBackward<T>(pool, rows, inSize, outSize, in(0), nullptr,
                      a.transposeWeight, in(1), nullptr, out(0), nullptr,
                      false);
    break;
  }
  case Op::BiasGrad: {
    const auto &dy = operandShape(0);
    int64_t outSize = dy.back(), rows = product(dy, 0, dy.size() - 1);
    linearBackward<T>(pool, rows, 0, outSize, nullptr, nullptr, false, in(0),
                      nullptr, nullptr, out(0), false);
    break;
  }
  case Op::Matmul: {
    const auto &l = operandShape(0), &r = operandShape(1);
    size_t rank = l.size();
    int64_t batch = product(l, 0, rank - 2);
    int64_t m = a.transposeLhs ? l[rank - 1] : l[rank - 2];
    int64_t k = a.transposeLhs ? l[rank - 2] : l[rank - 1];
    int64_t n = a.transposeRhs ? r[rank - 2] : r[rank - 1];
    matmulForward<T>(pool, batch, m, n, k, in(0), a.transposeLhs, in(1),
                     a.transposeRhs, out(0));
    break;
  }
  case Op::Attention: {
    AttentionParams p = attentionParams(operandShape(0), operandShape(1),
                                        operandShape(2), a, step);
    ScratchBuffer lse(
        *this, sizeof(T) * static_cast<size_t>(p.batch * p.headsQ * p.seqQ));
    attentionForward<T>(pool, p, in(0), in(1), in(2), out(0), lse.as<T>());
    break;
  }
  case Op::AttentionGrad: {
    // Operands dy, q, k, v; the forward is rerun for its logsumexp.
    AttentionParams p = attentionParams(operandShape(1), operandShape(2),
                                        operandShape(3), a, step);
    ScratchBuffer lse(
        *this, sizeof(T) * static_cast<size_t>(p.batch * p.headsQ * p.seqQ));
    ScratchBuffer o(*this,
                    sizeof(T) * static_cast<size_t>(count(inst.operands[0])));
    attentionForward<T>(pool, p, in(1), in(2), in(3), o.as<T>(), lse.as<T>());
    attentionBackward<T>(pool, p, in(1), in(2), in(3), lse.as<T>(), in(0),
                         out(0), out(1), out(2));
    break;
  }
  case Op::Rope: {
    const auto &x = operandShape(0);
    int64_t rotary = a.rotaryDim.value_or(x[3]);
    if (a.inverse)
      ropeBackward<T>(pool, x[0], x[1], x[2], x[3], rotary, a.base, in(0),
                      out(0));
    else
      ropeForward<T>(pool, x[0], x[1], x[2], x[3], rotary, a.base, in(0),
                     out(0));
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
  case Op::Dropout:
    dropoutForward<T>(pool, count(inst.operands[0]), in(0), out(0), a.p,
                      static_cast<uint64_t>(a.seed), step);
    break;
  case Op::Add:
    addForward<T>(pool, count(inst.operands[0]), in(0), in(1), out(0));
    break;
  case Op::Mul:
    mulForward<T>(pool, count(inst.operands[0]), in(0), in(1), out(0));
    break;
  case Op::Softmax:
  case Op::SoftmaxGrad: {
    bool grad = inst.op == Op::SoftmaxGrad;
    const auto &x = operandShape(grad ? 1 : 0);
    size_t axis = static_cast<size_t>(a.axis);
    int64_t outer = product(x, 0, axis), inner = product(x, axis + 1, x.size());
    if (grad)
      softmaxBackward<T>(pool, outer, x[axis], inner, in(1), in(0), out(0));
    else
      softmaxForward<T>(pool, outer, x[axis], inner, in(0), out(0));
    break;
  }
  case Op::CrossEntropy:
  case Op::CrossEntropyGrad: {
    bool grad = inst.op == Op::CrossEntropyGrad;
    size_t logitsAt = grad ? 1 : 0, labelsAt = grad ? 2 : 1;
    int64_t vocab = operandShape(logitsAt).back();
    int64_t rows = count(inst.operands[labelsAt]);
    const T *logits = in(logitsAt);
    T *result = out(0);
    withIds(labelsAt, [&](auto *labels) {
      checkIds(where(position), "label", labelsAt, inst.operands[labelsAt],
               labels, rows, vocab, "the logits' vocabulary size",
               &a.ignoreIndex);
      if (grad)
        check(where(position),
              crossEntropyBackward<T>(pool, rows, vocab, logits, labels,
                                      a.ignoreIndex, toKernel(a.reduction),
                                      in(0), result));
      else
        check(where(position),
              crossEntropyForward<T>(pool, rows, vocab, logits, labels,
                                     a.ignoreIndex, toKernel(a.reduction),
                                     result));
    });
    break;
  }
  case Op::Reshape:
    std::memcpy(out(0), in(0),
                sizeof(T) * static_cast<size_t>(count(inst.operands[0])));
    break;
  case Op::Transpose: {
    const auto &x = operandShape(0);
    transposeForward<T>(pool, static_cast<int>(x.size()), x.data(),
                        a.permutation.data(), in(0), out(0));
    break;
  }
  case Op::Split:
  case Op::Concat: {
    bool split = inst.op == Op::Split;
    const auto &whole = shapeOf(split ? inst.operands[0] : inst.results[0]);
    size_t axis = static_cast<size_t>(a.axis);
    int64_t outer = product(whole, 0, axis);
    int64_t inner = product(whole, axis + 1, whole.size());
    const auto &pieces = split ? inst.results : inst.operands;
    std::vector<int64_t> sizes;
    for (int64_t v : pieces)
      sizes.push_back(shapeOf(v)[axis]);
    int piecesCount = static_cast<int>(pieces.size());
    if (split) {
      std::vector<T *> outputs;
      for (size_t i = 0; i < pieces.size(); ++i)
        outputs.push_back(out(i));
      splitForward<T>(pool, outer, inner, piecesCount, sizes.data(), in(0),
                      outputs.data());
    } else {
      std::vector<const T *> inputs;
      for (size_t i = 0; i < pieces.size(); ++i)
        inputs.push_back(in(i));
      concatForward<T>(pool, outer, inner, piecesCount, sizes.data(),
                       inputs.data(), out(0));
    }
    break;
  }
  }
}

template void Executor::execute<float>(size_t, const Instruction &, uint64_t);
template void Executor::execute<double>(size_t, const Instruction &, uint64_t);

} // namespace mtrt::host
