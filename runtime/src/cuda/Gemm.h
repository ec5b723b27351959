// Row-major float GEMMs through cuBLASLt: descriptors and the heuristic's
// algorithm chosen once per shape and cached.
#ifndef MTRT_SRC_CUDA_GEMM_H
#define MTRT_SRC_CUDA_GEMM_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "host/kernels/Kernels.h"

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace mtrt::cuda {

using host::GeluApproximation;

/// The operands of a bf16 product (Gemm::run), already rounded to bf16 by
/// the caller (batch * m * k and batch * k * n elements, the layouts of the
/// fp32 operands); both null for an fp32 product.
struct Bf16Operands {
  const __nv_bfloat16 *a = nullptr, *b = nullptr;
  /// C (and a GeLU epilogue's auxiliary matrix, written by GeluAux and read
  /// by GeluGrad) is bf16, not fp32: for results that only GEMMs read, which
  /// then take C as their bf16 operand with no rounding pass. cuBLASLt
  /// takes the bias vector in D's type, so the fp32 bias is rounded into,
  /// and a bias gradient written in bf16 to, a bf16 vector, then widened
  /// into the fp32 bias gradient: GemmEpilogue::bf16Vector, or, where the
  /// plan keeps C's fp32 size (m * n floats), the buffer's unused second
  /// half.
  bool result = false;
  bool enabled() const { return a && b; }
};

/// What a product does after the multiply (Gemm::run), besides the bias:
/// cuBLASLt's epilogues, or kernels after a plain product when cuBLASLt has
/// no algorithm with the epilogue for the shape, for an erf GeLU (its GELU
/// epilogues are the tanh approximation) and for any GeLU of a full-fp32
/// product (its fast tanh is not within the 1e-5 that fp32 bundles keep to
/// the host; bf16 and TF32 products use the epilogue). Batch 1 only; the
/// bias gradients (BiasGradA, BiasGradB) also with an accumulating product
/// (C accumulates, the bias gradient is written).
struct GemmEpilogue {
  enum class Kind : uint8_t {
    None,
    /// aux = A B (+ bias); C = gelu(aux) (GELU_AUX, GELU_AUX_BIAS).
    GeluAux,
    /// C = gelu'(aux) * (A B); with `biasGrad`, also biasGrad = the sum of
    /// C's rows (DGELU, DGELU_BGRAD).
    GeluGrad,
    /// biasGrad [m] = the sum of op(A)'s columns (A stored [k, m], transA);
    /// cuBLASLt's BGRADB in its column-major view.
    BiasGradA,
    /// biasGrad [n] = the sum of B's rows (B stored [k, n], not transB);
    /// cuBLASLt's BGRADA.
    BiasGradB,
  };
  Kind kind = Kind::None;
  GeluApproximation approximation = GeluApproximation::Tanh;
  /// [m, n], like C: written by GeluAux, read by GeluGrad.
  float *aux = nullptr;
  float *biasGrad = nullptr;
  /// For the kernels' bias gradient when cuBLASLt cannot:
  /// columnSumScratchBytes(rows, length) bytes (kernels/Kernels.h).
  void *scratch = nullptr;
  /// cuBLASLt's workspace: scratch::kGemmWorkspaceBytes (core/OpScratch.h)
  /// in the instruction's kernel block of the memory plan. Without it (a
  /// plan written before issue 21, benches) the Gemm's own, allocated at
  /// its first such run.
  void *workspace = nullptr;
  /// Where a bf16 result's bias vector (n bf16) goes: the instruction's
  /// kernel block (scratch::gemmBf16VectorBytes, core/OpScratch.h). Null
  /// for bundles whose plan keeps every value's fp32 size: then past the
  /// bf16 C in C's buffer (Bf16Operands::result).
  void *bf16Vector = nullptr;
  /// An accumulating product (C += A B) times its algorithm candidates
  /// without accumulating, into these m * n floats (C's layout), so that C
  /// is added to once; without it, an accumulating product keeps the
  /// heuristic's first.
  float *tuningScratch = nullptr;
  /// A product whose shapes change from run to run (an expert's rows):
  /// keeps the heuristic's first algorithm, as tuning each would cost more
  /// than it saves.
  bool untuned = false;
  /// linear_add's addend, m * n elements in C's type: cuBLASLt's C with
  /// beta = 1, so that C = A B (+ bias) + addend, rounded once (a single
  /// product without another epilogue; not accumulating). Where cuBLASLt
  /// refuses it, the plain product and then an add kernel.
  const void *addend = nullptr;
};

/// C[b] = op(A[b]) @ op(B[b]) (+ bias) (+ C[b] when accumulating, or
/// + GemmEpilogue::addend) over
/// `batch` consecutive row-major matrices: op(A) [m, k] (A stored [m, k], or
/// [k, m] with transA), op(B) [k, n] (B stored [k, n], or [n, k] with
/// transB), C [m, n]; bias [n] is added to every row. Products accumulate in
/// fp32; with `tf32` the inputs are rounded to TF32 on the tensor cores
/// (CUBLAS_COMPUTE_32F_FAST_TF32), otherwise every multiply is a full fp32
/// one (CUBLAS_COMPUTE_32F), comparable with the host's GEMM.
///
/// Mixed precision (bundles compiled with precision bf16): the operands come
/// rounded to bf16 (Bf16Operands) and are multiplied on the tensor cores
/// with fp32 accumulation
/// (CUBLAS_COMPUTE_32F over CUDA_R_16BF inputs); C, the bias and the
/// accumulation stay fp32, as Megatron-LM's fp32 main gradients do.
///
/// Algorithms: at the first product of a (shape, layout, alignment,
/// epilogue, types) key, cuBLASLt's heuristic proposes up to
/// kTuningCandidates algorithms; with `tuning`, each is timed on the call's
/// own buffers (CUDA events, a few runs each; every candidate writes the
/// same results) and the fastest is kept for the key. An accumulating
/// product is timed with beta = 0 into GemmEpilogue::tuningScratch (C is
/// not touched), or keeps the first without one.
/// Without it, or while the stream is being captured into a CUDA graph, the
/// heuristic's first is kept (deterministic).
///
/// Row chunks (`algorithmRows`, --tp-comm-overlap's GEMM chunks:
/// Attributes::wholeRows): a product of m rows cut out of one of
/// `algorithmRows` rows runs with the whole shape's algorithm (its key's:
/// the heuristic's first, or the tuned one where the whole ran here first),
/// checked for the chunk by cublasLtMatmulAlgoCheck. The same kernel, tile
/// and split-K sum each row of a chunk as they sum it in the whole, so
/// with the heuristic's choices (no tuning) the chunks give the whole's
/// bits; the chunk's own choice could differ (another tile or split-K for
/// fewer rows). Where cuBLASLt refuses the whole's algorithm for the chunk,
/// the chunk's own is used and algorithmsNotShared() says so.
///
/// Thread-safety: one caller at a time (the cache is not locked).
class Gemm {
public:
  /// The best of 8 was often the 8th (bench/NOTES.md, session 17).
  static constexpr int kTuningCandidates = 32;

  /// Creates the cuBLASLt handle on the current device.
  /// Throws Error naming the failed call.
  Gemm(cudaStream_t stream, bool tf32, bool tuning = true);
  ~Gemm();
  Gemm(const Gemm &) = delete;
  Gemm &operator=(const Gemm &) = delete;

  /// Enqueues the product on the stream. Throws Error (UNIMPLEMENTED when
  /// cuBLASLt has no algorithm for the shape, INTERNAL for a failed call),
  /// naming the call and the shape; the caller adds where it was.
  void run(int64_t batch, int64_t m, int64_t n, int64_t k, const float *a,
           bool transA, const float *b, bool transB, float *c,
           const float *bias, bool accumulate, Bf16Operands bf16 = {},
           const GemmEpilogue &epilogue = {}, int64_t algorithmRows = 0);

  bool tf32() const { return tf32_; }

  /// Whether run() with bf16 operands and a bf16 result (operands.result)
  /// has a cuBLASLt algorithm with the epilogue for this shape at 256-byte
  /// aligned pointers (the arena's); when false such a run throws. `bias`
  /// and `biasGrad` say whether those pointers will be given;
  /// `vectorPastResult`, whether a bf16 bias vector goes past C in C's
  /// fp32-sized slot (plans before format 8, which give it no bytes of its
  /// own: GemmEpilogue::bf16Vector), so that it must fit there.
  bool hasBf16ResultAlgorithm(int64_t m, int64_t n, int64_t k, bool transA,
                              bool transB, GemmEpilogue::Kind kind, bool bias,
                              bool biasGrad, bool vectorPastResult);

  /// One line per tuned key: the shape, the epilogue, the chosen candidate
  /// and its time against the heuristic's first.
  /// Whether algorithms are timed (the constructor's `tuning`).
  bool tuning() const { return tuning_; }
  const std::vector<std::string> &tuningChoices() const {
    return tuningChoices_;
  }

  /// The epilogues cuBLASLt had no algorithm for, one line per shape
  /// ("GELU_AUX_BIAS for cuBLASLt matmul of ..."): they ran as kernels.
  const std::vector<std::string> &epiloguesByKernel() const {
    return epiloguesByKernel_;
  }

  /// The row chunks that could not take their whole's algorithm (run()'s
  /// `algorithmRows`), one line per shape: they ran with their own.
  const std::vector<std::string> &algorithmsNotShared() const {
    return algorithmsNotShared_;
  }

private:
  /// (batch, m, n, k, transA, transB, cuBLASLt epilogue, accumulate,
  /// alignment of A, B and C in bytes, bf16 operands, bf16 result, the rows
  /// whose algorithm it takes: 0 for its own).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int,
                         bool, int, int, int, bool, bool, int64_t>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    /// The heuristic's other proposals, until the first run times them.
    std::vector<cublasLtMatmulAlgo_t> candidates;
    /// cuBLASLt had no algorithm with the epilogue for this shape: the plan
    /// is the plain product and kernels do the epilogue's work after it.
    bool epilogueByKernel = false;
    /// An accumulating product with a bias-gradient epilogue that cuBLASLt
    /// refused to run with beta = 1: written into the scratch, then added.
    bool accumulateRefused = false;
    /// cuBLASLt refused an addend as C (GemmEpilogue::addend): the plain
    /// product, then an add kernel.
    bool addendRefused = false;
  };
  /// c[count] += addend[count], both bf16 or both fp32 (an addend
  /// cuBLASLt did not take as C).
  void addAddend(int64_t count, const void *addend, float *c, bool bf16,
                 const std::string &what);
  /// Builds the plan for `key` into `plan`; false when cuBLASLt has no
  /// algorithm for it. Throws Error for a failed call.
  bool tryPlan(const Key &key, Plan &plan);
  /// After a plain product: the bias and the epilogue's work by kernels.
  void finishByKernels(int64_t m, int64_t n, int64_t k, const float *a,
                       bool transA, const float *b, bool transB, float *c,
                       const float *bias, Bf16Operands operands,
                       const GemmEpilogue &epilogue, const std::string &what);
  Plan &plan(const Key &key);
  /// The plan of a row chunk (std::get<13>(key) rows in its whole): its
  /// descriptors with the whole shape's algorithm.
  Plan &chunkPlan(const Key &key);
  /// Times the plan's candidates through `launch` (one product with the
  /// given algorithm) and keeps the fastest as p.algo.
  template <typename Launch>
  void tune(Plan &p, const std::string &what, Launch &&launch);

  cudaStream_t stream_;
  bool tf32_;
  bool tuning_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::vector<std::string> tuningChoices_;
  cublasLtHandle_t handle_ = nullptr;
  /// The workspace for runs that bring none (GemmEpilogue::workspace).
  void *ownWorkspace();
  void *workspace_ = nullptr;
  size_t workspaceBytes_ = 0;
  std::map<Key, Plan> plans_;
  std::vector<std::string> epiloguesByKernel_;
  std::vector<std::string> algorithmsNotShared_;
  /// Why the last tryPlan found no algorithm (the heuristic's status).
  std::string lastRefusal_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_GEMM_H
