// The CUDA executor's multi-rank instructions, run through the host: the
// collectives over the rank's communicators and all_slice
// (host/RankCollective.h), bias_add, and the vocabulary-
// parallel embedding and cross-entropy, on the host kernels. Operands are
// copied to the host and results back, with a synchronization each: the
// first correct version, for the in-process tensor-parallel checks on one
// GPU; device kernels and NCCL on device buffers are the fast path to come.
#include "cuda/Executor.h"

#include "comm/RankContext.h"
#include "core/ExecutorChecks.h"
#include "core/OpShapes.h"
#include "cuda/CudaCheck.h"
#include "host/RankCollective.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include <cstring>

namespace mtrt::cuda {

bool Executor::runsOnHost(const Instruction &inst) const {
  switch (inst.op) {
#define MTRT_HOST_RUN_CASE(name) case Op::name:
    MTRT_CUDA_HOST_RUN_OPS(MTRT_HOST_RUN_CASE)
#undef MTRT_HOST_RUN_CASE
    return true;
  case Op::Embedding:
  case Op::EmbeddingGrad:
    return !inst.attrs.vocabShardAxes.empty();
  default:
    return false;
  }
}

void Executor::checkRankInstructions() const {
  const Function &fn = *function_;
  if (bundle_.rankCount() <= 1)
    return;
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    double p = inst.op == Op::Dropout ? inst.attrs.p
               : inst.op == Op::Attention || inst.op == Op::AttentionGrad
                   ? inst.attrs.dropoutP
                   : 0;
    if (p > 0 && !inst.attrs.splitAxes.empty())
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  where(position) + ": " + opName(inst.op) +
                      " with dropout over a tensor split across ranks is not "
                      "run by the cuda backend yet (its masks need the "
                      "global tile); compile with --hidden-dropout 0 "
                      "--attention-dropout 0, or use the host backend");
  }
}

void Executor::executeOnHost(size_t position, const Instruction &inst,
                             uint64_t step) {
  using namespace host;
  const Function &fn = *function_;
  const Attributes &a = inst.attrs;
  cudaStream_t stream = context_.stream();
  if (!hostPool_)
    hostPool_ = std::make_unique<ThreadPool>(1);
  ThreadPool &pool = *hostPool_;

  auto bytesOf = [&](int64_t v) {
    return static_cast<size_t>(fn.values[v].numElements) *
           dtypeSize(storageType(v));
  };
  std::vector<std::vector<unsigned char>> operands(inst.operands.size());
  for (size_t i = 0; i < inst.operands.size(); ++i) {
    int64_t v = inst.operands[i];
    operands[i].resize(bytesOf(v));
    if (!operands[i].empty())
      MTRT_CUDA_CHECK(cudaMemcpyAsync(operands[i].data(), slot(v),
                                      operands[i].size(),
                                      cudaMemcpyDeviceToHost, stream),
                      where(position) + ": copying operand " +
                          std::to_string(i) + " to the host");
  }
  std::vector<std::vector<unsigned char>> results(inst.results.size());
  for (size_t i = 0; i < inst.results.size(); ++i)
    results[i].resize(bytesOf(inst.results[i]));
  context_.synchronize(where(position) + ": reading its operands");

  auto in = [&](size_t i) {
    return reinterpret_cast<const float *>(operands[i].data());
  };
  auto out = [&](size_t i) {
    return reinterpret_cast<float *>(results[i].data());
  };
  auto count = [&](int64_t v) { return fn.values[v].numElements; };
  auto operandShape = [&](size_t i) -> const std::vector<int64_t> & {
    return fn.values[inst.operands[i]].shape;
  };
  auto withIds = [&](size_t operand, auto &&body) {
    const void *data = operands[operand].data();
    if (fn.values[inst.operands[operand]].dtype == DType::I64)
      body(static_cast<const int64_t *>(data));
    else
      body(static_cast<const int32_t *>(data));
  };
  auto vocabBlock = [&] {
    return vocabularyBlock(bundle_.gridShape(), rank_, a.vocabShardAxes,
                           where(position));
  };

  switch (inst.op) {
  case Op::AllReduce:
  case Op::AllGather:
  case Op::ReduceScatter:
  case Op::AllSlice: {
    std::vector<float> staging(static_cast<size_t>(
        rankCollectiveStaging(fn, inst, bundle_.gridShape())));
    runRankCollective<float>(pool, fn, inst, bundle_.gridShape(), rank_,
                             comm::CallInfo{where(position),
                                            static_cast<int64_t>(step)},
                             in(0), out(0), staging.data());
    break;
  }
  case Op::BiasAdd: {
    int64_t n = operandShape(0).back();
    int64_t total = count(inst.operands[0]);
    biasAddForward<float>(pool, n ? total / n : 0, n, in(0), in(1), out(0));
    break;
  }
  case Op::VocabMax: {
    int64_t vocab = operandShape(0).back();
    vocabMax<float>(pool, count(inst.operands[0]) / vocab, vocab, in(0),
                    out(0));
    break;
  }
  case Op::VocabPartials:
  case Op::VocabCrossEntropyGrad: {
    bool grad = inst.op == Op::VocabCrossEntropyGrad;
    size_t logitsAt = grad ? 1 : 0, labelsAt = logitsAt + 1;
    int64_t vocab = operandShape(logitsAt).back();
    int64_t rows = count(inst.operands[logitsAt]) / vocab;
    auto [block, blocks] = vocabBlock();
    withIds(labelsAt, [&](auto *labels) {
      checkIds(where(position), "label", labelsAt, inst.operands[labelsAt],
               labels, rows, vocab * blocks,
               "the vocabulary size (all ranks' blocks)",
               grad ? &a.ignoreIndex : nullptr);
      if (grad)
        vocabCrossEntropyGrad<float>(pool, rows, vocab, block * vocab, in(1),
                                     labels, a.ignoreIndex,
                                     toKernel(a.reduction), in(0), in(3), in(4),
                                     out(0));
      else
        vocabPartials<float>(pool, rows, vocab, block * vocab, in(0), labels,
                             in(2), out(0));
    });
    break;
  }
  case Op::VocabCrossEntropy: {
    int64_t rows = count(inst.operands[1]);
    withIds(1, [&](auto *labels) {
      vocabCrossEntropy<float>(rows, in(0), labels, a.ignoreIndex,
                               toKernel(a.reduction), out(0));
    });
    break;
  }
  case Op::Embedding:
  case Op::EmbeddingGrad: {
    EmbeddingDims d = embeddingDims(fn, inst);
    auto [block, blocks] = vocabBlock();
    withIds(1, [&](auto *ids) {
      checkIds(where(position), "id", 1, inst.operands[1], ids, d.count,
               d.vocab * blocks, "the vocabulary size (all ranks' blocks)",
               nullptr);
      if (inst.op == Op::Embedding)
        vocabEmbeddingForward<float>(pool, d.count, d.vocab, d.hidden,
                                     block * d.vocab, in(0), ids, out(0));
      else
        vocabEmbeddingBackward<float>(pool, d.count, d.vocab, d.hidden,
                                      block * d.vocab, ids, in(0), out(0));
    });
    break;
  }
  default:
    throw Error(MTRT_STATUS_INTERNAL,
                where(position) + ": " + opName(inst.op) +
                    " does not run through the host");
  }

  for (size_t i = 0; i < inst.results.size(); ++i)
    if (!results[i].empty())
      MTRT_CUDA_CHECK(cudaMemcpyAsync(slot(inst.results[i]), results[i].data(),
                                      results[i].size(),
                                      cudaMemcpyHostToDevice, stream),
                      where(position) + ": copying result " +
                          std::to_string(i) + " to the device");
  context_.synchronize(where(position) + ": writing its results");
}

} // namespace mtrt::cuda
