// cuDNN's fused flash attention through the backend graph API: the graphs,
// the plan cache and the launches (CudnnAttention.h says why and when).
#include "cuda/CudnnAttention.h"

#include "core/Error.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#if MTRT_HAVE_CUDNN
#include <cudnn.h>
#endif

namespace mtrt::cuda {

namespace {

constexpr size_t kAlign = 256;

size_t alignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

std::string shapeText(const AttentionParams &p) {
  return "batch " + std::to_string(p.batch) + ", heads " +
         std::to_string(p.headsQ) + "/" + std::to_string(p.headsKv) +
         ", sequence " + std::to_string(p.seqQ) + "/" + std::to_string(p.seqK) +
         ", head dimension " + std::to_string(p.headDim) +
         (p.causal ? ", causal" : "");
}

/// A FlashLayout's strides with their defaults filled in: {position, head}.
std::array<int64_t, 2> strides(FlashLayout layout, int64_t heads,
                               int64_t headDim) {
  return {layout.position ? layout.position : heads * headDim,
          layout.head ? layout.head : headDim};
}

/// The softmax scale: AttentionParams::scale, 0 meaning 1 / sqrt(headDim)
/// (as the own kernels and the host take it).
float softmaxScale(const AttentionParams &p) {
  return static_cast<float>(
      p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.headDim)));
}

} // namespace

size_t CudnnAttention::backwardScratchBytes(const AttentionParams &p,
                                            size_t workspaceBytes) {
  size_t rows = static_cast<size_t>(p.batch * p.headsQ * p.seqQ);
  return alignUp(4 * rows) + alignUp(4 * rows * size_t(p.headDim)) +
         alignUp(workspaceBytes);
}

std::string cudnnAttentionUnsupportedReason(const AttentionParams &p,
                                            const FlashTensors &io) {
  if (p.dropoutP > 0)
    return "dropout (the own kernels keep the host's keep mask)";
  if (!io.inputsBf16 || !io.outputsBf16)
    return "fp32 tensors (cuDNN's fused attention takes bf16)";
  if (io.deterministic)
    return "the deterministic backward was asked for (cuDNN's sums dq with "
           "atomics)";
  if (p.headDim != p.headDimV)
    return "query/key and value head dimensions differ (" +
           std::to_string(p.headDim) + " and " + std::to_string(p.headDimV) +
           ")";
  if (p.headDim % 8 != 0 || p.headDim > 128)
    return "head dimension " + std::to_string(p.headDim) +
           " (cuDNN is used at multiples of 8 up to 128)";
  if (p.causal && p.seqQ != p.seqK)
    return "causal with " + std::to_string(p.seqQ) + " queries and " +
           std::to_string(p.seqK) + " keys";
  if (p.headsKv <= 0 || p.headsQ % p.headsKv != 0)
    return "query heads not a multiple of key/value heads";
  return std::string();
}

#if !MTRT_HAVE_CUDNN

std::string cudnnAttentionUnavailableReason() {
  return "this runtime was built without cuDNN (no cudnn.h or libcudnn when "
         "it was configured)";
}

struct CudnnAttention::Plan {};

CudnnAttention::CudnnAttention() {
  throw Error(MTRT_STATUS_UNAVAILABLE, cudnnAttentionUnavailableReason());
}
CudnnAttention::~CudnnAttention() = default;
size_t CudnnAttention::libraryVersion() { return 0; }
std::string CudnnAttention::prepare(const AttentionParams &,
                                    const FlashTensors &, bool, size_t *) {
  return cudnnAttentionUnavailableReason();
}
void CudnnAttention::forward(cudaStream_t, const AttentionParams &,
                             const FlashTensors &, __nv_bfloat16 *, float *,
                             void *, size_t) {
  throw Error(MTRT_STATUS_UNAVAILABLE, cudnnAttentionUnavailableReason());
}
void CudnnAttention::backward(cudaStream_t, const AttentionParams &,
                              const FlashTensors &, const __nv_bfloat16 *,
                              const float *, void *, size_t) {
  throw Error(MTRT_STATUS_UNAVAILABLE, cudnnAttentionUnavailableReason());
}

#else

namespace {

/// Throws Error (INTERNAL) for a failed cuDNN call, with cuDNN's own last
/// message.
void check(cudnnStatus_t status, const char *call, const std::string &what) {
  if (status == CUDNN_STATUS_SUCCESS)
    return;
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  throw Error(MTRT_STATUS_INTERNAL,
              "cuDNN attention (" + what + "): " + call +
                  " failed: " + cudnnGetErrorString(status) + " (" +
                  std::to_string(static_cast<int>(status)) + ")" +
                  (detail[0] ? std::string(": ") + detail : std::string()));
}

#define MTRT_CUDNN_CHECK(call, what) check((call), #call, (what))

/// A backend descriptor, destroyed with its last owner.
using Desc = std::shared_ptr<void>;

Desc make(cudnnBackendDescriptorType_t type, const std::string &what) {
  cudnnBackendDescriptor_t d = nullptr;
  MTRT_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d), what);
  return Desc(d, [](void *p) { cudnnBackendDestroyDescriptor(p); });
}

/// Builds one graph's descriptors; every call names the graph in errors.
class GraphBuilder {
public:
  GraphBuilder(cudnnHandle_t handle, std::string what)
      : handle_(handle), what_(std::move(what)) {}

  template <typename T>
  void set(const Desc &d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const T *values) {
    MTRT_CUDNN_CHECK(
        cudnnBackendSetAttribute(d.get(), name, type, count, values), what_);
  }
  void setDesc(const Desc &d, cudnnBackendAttributeName_t name,
               const Desc &value) {
    void *raw = value.get();
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }
  void finalize(const Desc &d) {
    MTRT_CUDNN_CHECK(cudnnBackendFinalize(d.get()), what_);
  }

  /// A tensor: non-virtual ones get `uid` (the variant pack's key).
  Desc tensor(cudnnDataType_t type, std::vector<int64_t> dims,
              std::vector<int64_t> strides, bool isVirtual, int64_t uid = 0,
              bool byValue = false) {
    Desc d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what_);
    if (uid == 0)
      uid = nextVirtual_++;
    int64_t alignment = 16;
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64,
        static_cast<int64_t>(dims.size()), dims.data());
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64,
        static_cast<int64_t>(strides.size()), strides.data());
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    bool flag = isVirtual;
    set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &flag);
    if (byValue) {
      flag = true;
      set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &flag);
    }
    finalize(d);
    return d;
  }

  /// A virtual tensor of `dims`, packed.
  Desc scratch(cudnnDataType_t type, const std::vector<int64_t> &dims) {
    std::vector<int64_t> strides(dims.size(), 1);
    for (size_t i = dims.size() - 1; i > 0; --i)
      strides[i - 1] = strides[i] * dims[i];
    return tensor(type, dims, strides, true);
  }

  /// A pointwise operation y = mode(x[, b[, t]]).
  void pointwise(cudnnPointwiseMode_t mode, const Desc &x, const Desc &b,
                 const Desc &t, const Desc &y,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    Desc pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what_);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1,
        &precision);
    if (axis >= 0)
      set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw);
    Desc op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what_);
    setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b)
      setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t)
      setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    finalize(op);
    ops_.push_back(op);
  }

  void matmul(const Desc &a, const Desc &b, const Desc &c) {
    Desc mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, what_);
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    finalize(mm);
    Desc op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what_);
    setDesc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    setDesc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    setDesc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    setDesc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    finalize(op);
    ops_.push_back(op);
  }

  void reduction(cudnnReduceTensorOp_t mode, const Desc &x, const Desc &y) {
    Desc r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what_);
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1,
        &mode);
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    finalize(r);
    Desc op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what_);
    setDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    setDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    setDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    finalize(op);
    ops_.push_back(op);
  }

  /// y: the same elements as x under other dimensions and strides (a
  /// transpose).
  void reshape(const Desc &x, const Desc &y) {
    Desc op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what_);
    setDesc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    setDesc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    finalize(op);
    ops_.push_back(op);
  }

  /// scores = scale * a b^T, causally masked when `causal` (key position
  /// over query position: the lowest float, as good as -inf to exp).
  Desc scaledScores(const Desc &a, const Desc &bT, const Desc &scale,
                    const Desc &lowest, const std::vector<int64_t> &dims,
                    bool causal, const Desc *minus = nullptr) {
    Desc s = scratch(CUDNN_DATA_FLOAT, dims);
    matmul(a, bT, s);
    Desc scaled = scratch(CUDNN_DATA_FLOAT, dims);
    pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, scaled);
    if (minus) { // the backward: scores - logsumexp before the mask
      Desc shifted = scratch(CUDNN_DATA_FLOAT, dims);
      pointwise(CUDNN_POINTWISE_SUB, scaled, *minus, nullptr, shifted);
      scaled = shifted;
    }
    if (!causal)
      return scaled;
    Desc row = scratch(CUDNN_DATA_INT32, dims);
    Desc column = scratch(CUDNN_DATA_INT32, dims);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, nullptr, row,
              CUDNN_DATA_INT32, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, nullptr, column,
              CUDNN_DATA_INT32, 3);
    Desc keep = scratch(CUDNN_DATA_BOOLEAN, dims);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, column, nullptr, keep,
              CUDNN_DATA_BOOLEAN);
    Desc masked = scratch(CUDNN_DATA_FLOAT, dims);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, lowest, keep, masked);
    return masked;
  }

  /// The operation graph, the heuristics' configurations in order, and the
  /// first plan that finalizes; null with *why set when none does.
  Desc plan(std::string *why) {
    Desc graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what_);
    std::vector<void *> raw;
    for (const Desc &op : ops_)
      raw.push_back(op.get());
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1,
        &handle_);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(raw.size()), raw.data());
    cudnnStatus_t status = cudnnBackendFinalize(graph.get());
    if (status != CUDNN_STATUS_SUCCESS) {
      *why = lastError("the operation graph", status);
      return nullptr;
    }
    std::string tried;
    for (cudnnBackendHeurMode_t mode :
         {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Desc heuristics = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what_);
      setDesc(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
      set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
          &mode);
      status = cudnnBackendFinalize(heuristics.get());
      std::string modeName =
          mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "fallback heuristics";
      if (status != CUDNN_STATUS_SUCCESS) {
        tried +=
            (tried.empty() ? "" : "; ") + lastError(modeName.c_str(), status);
        continue;
      }
      int64_t count = 0;
      MTRT_CUDNN_CHECK(cudnnBackendGetAttribute(
                           heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                       what_);
      std::vector<Desc> configs;
      std::vector<void *> rawConfigs;
      for (int64_t i = 0; i < count; ++i) {
        configs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what_));
        rawConfigs.push_back(configs.back().get());
      }
      int64_t got = 0;
      if (count > 0)
        MTRT_CUDNN_CHECK(cudnnBackendGetAttribute(
                             heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                             rawConfigs.data()),
                         what_);
      if (got == 0)
        tried += (tried.empty() ? "" : "; ") + modeName + ": no engine";
      for (int64_t i = 0; i < got; ++i) {
        Desc plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, what_);
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
            &handle_);
        setDesc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i]);
        status = cudnnBackendFinalize(plan.get());
        if (status == CUDNN_STATUS_SUCCESS)
          return plan;
        if (i == 0)
          tried += (tried.empty() ? "" : "; ") +
                   lastError((modeName + "'s first engine").c_str(), status);
      }
    }
    *why = "no cuDNN engine runs this graph" +
           (tried.empty() ? std::string() : " (" + tried + ")");
    return nullptr;
  }

private:
  static std::string lastError(const char *what, cudnnStatus_t status) {
    char detail[512] = {0};
    cudnnGetLastErrorString(detail, sizeof(detail));
    return std::string(what) + ": " + cudnnGetErrorString(status) +
           (detail[0] ? std::string(": ") + detail : std::string());
  }

  cudnnHandle_t handle_;
  std::string what_;
  std::vector<Desc> ops_;
  int64_t nextVirtual_ = 1000;
};

// The variant pack's keys.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kLowest,
  kOne,
  kDout,
  kDq,
  kDk,
  kDv,
  kSoftmaxSum,
  kDqAccumulator,
};

} // namespace

struct CudnnAttention::Plan {
  Desc plan;
  std::string declined; // why cuDNN declined, when plan is null
  size_t workspaceBytes = 0;
};

std::string cudnnAttentionUnavailableReason() {
  size_t version = cudnnGetVersion();
  if (version / 10000 != CUDNN_MAJOR)
    return "the loaded libcudnn is version " + std::to_string(version) +
           ", this runtime was built with cuDNN " +
           std::to_string(CUDNN_VERSION) + " (major version " +
           std::to_string(CUDNN_MAJOR) + " needed)";
  return std::string();
}

size_t CudnnAttention::libraryVersion() { return cudnnGetVersion(); }

CudnnAttention::CudnnAttention() {
  std::string reason = cudnnAttentionUnavailableReason();
  if (!reason.empty())
    throw Error(MTRT_STATUS_UNAVAILABLE, "cuDNN attention: " + reason);
  cudnnHandle_t handle = nullptr;
  MTRT_CUDNN_CHECK(cudnnCreate(&handle), "creating the handle");
  handle_ = handle;
}

CudnnAttention::~CudnnAttention() {
  plans_.clear();
  if (handle_)
    cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

const CudnnAttention::Plan &CudnnAttention::plan(const AttentionParams &p,
                                                 const FlashTensors &io,
                                                 bool backward) {
  auto q = strides(io.qLayout, p.headsQ, p.headDim);
  auto k = strides(io.kLayout, p.headsKv, p.headDim);
  auto v = strides(io.vLayout, p.headsKv, p.headDim);
  auto o = strides(io.outLayout, p.headsQ, p.headDim);
  auto dout = strides(io.doutLayout, p.headsQ, p.headDim);
  auto dq = strides(io.dqLayout, p.headsQ, p.headDim);
  auto dk = strides(io.dkLayout, p.headsKv, p.headDim);
  auto dv = strides(io.dvLayout, p.headsKv, p.headDim);
  float scale = softmaxScale(p);
  uint32_t scaleBits;
  std::memcpy(&scaleBits, &scale, 4);
  std::vector<int64_t> key = {backward,  p.batch,   p.seqQ,    p.seqK,
                              p.headsQ,  p.headsKv, p.headDim, p.causal,
                              scaleBits, q[0],      q[1],      k[0],
                              k[1],      v[0],      v[1]};
  if (backward)
    key.insert(key.end(),
               {dout[0], dout[1], dq[0], dq[1], dk[0], dk[1], dv[0], dv[1]});
  else
    key.insert(key.end(), {o[0], o[1]});
  auto found = plans_.find(key);
  if (found != plans_.end())
    return *found->second;

  const int64_t b = p.batch, hq = p.headsQ, hk = p.headsKv, sq = p.seqQ,
                sk = p.seqK, d = p.headDim;
  std::string what =
      std::string(backward ? "backward" : "forward") + ", " + shapeText(p);
  auto made = std::make_unique<Plan>();
  // The graph in bf16 where a product reads it (the forward's P: cuDNN's
  // fused engines take matrix products of one input type); the backward's
  // dS is tried in fp32 first (as cuDNN's own frontend builds it), then in
  // bf16.
  for (bool dsInBf16 : {false, true}) {
    GraphBuilder g(static_cast<cudnnHandle_t>(handle_), what);
    // [batch, heads, positions, head dimension] over a FlashLayout, and its
    // transpose [batch, heads, head dimension, positions].
    auto bhsd = [&](int64_t uid, int64_t heads, int64_t seq,
                    std::array<int64_t, 2> s) {
      return g.tensor(CUDNN_DATA_BFLOAT16, {b, heads, seq, d},
                      {seq * s[0], s[1], s[0], 1}, false, uid);
    };
    auto bhds = [&](int64_t uid, int64_t heads, int64_t seq,
                    std::array<int64_t, 2> s) {
      return g.tensor(CUDNN_DATA_BFLOAT16, {b, heads, d, seq},
                      {seq * s[0], s[1], 1, s[0]}, false, uid);
    };
    auto scalar = [&](int64_t uid) {
      return g.tensor(CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, uid,
                      true);
    };
    Desc scaleT = scalar(kScale), lowest = scalar(kLowest);
    Desc stats = g.tensor(CUDNN_DATA_FLOAT, {b, hq, sq, 1}, {hq * sq, sq, 1, 1},
                          false, kStats);
    std::vector<int64_t> scores = {b, hq, sq, sk}, rowDims = {b, hq, sq, 1};

    if (!backward) {
      Desc qT = bhsd(kQ, hq, sq, q), kT = bhds(kK, hk, sk, k),
           vT = bhsd(kV, hk, sk, v);
      Desc oT = bhsd(kO, hq, sq, o);
      Desc s = g.scaledScores(qT, kT, scaleT, lowest, scores, p.causal);
      // The softmax with its statistics: logsumexp = max + log(sum exp).
      Desc max = g.scratch(CUDNN_DATA_FLOAT, rowDims);
      g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, max);
      Desc shifted = g.scratch(CUDNN_DATA_FLOAT, scores);
      g.pointwise(CUDNN_POINTWISE_SUB, s, max, nullptr, shifted);
      Desc e = g.scratch(CUDNN_DATA_FLOAT, scores);
      g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, e);
      Desc sum = g.scratch(CUDNN_DATA_FLOAT, rowDims);
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
      Desc log = g.scratch(CUDNN_DATA_FLOAT, rowDims);
      g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, log);
      g.pointwise(CUDNN_POINTWISE_ADD, max, log, nullptr, stats);
      Desc probabilities = g.scratch(CUDNN_DATA_BFLOAT16, scores);
      g.pointwise(CUDNN_POINTWISE_DIV, e, sum, nullptr, probabilities);
      g.matmul(probabilities, vT, oT);
    } else {
      Desc qT = bhsd(kQ, hq, sq, q), kT = bhds(kK, hk, sk, k),
           vT = bhds(kV, hk, sk, v);
      Desc oT = bhsd(kO, hq, sq, strides({}, hq, d)); // the packed copy
      Desc doT = bhsd(kDout, hq, sq, dout);
      Desc dqT = bhsd(kDq, hq, sq, dq), dkT = bhsd(kDk, hk, sk, dk),
           dvT = bhsd(kDv, hk, sk, dv);
      Desc one = scalar(kOne);
      // The softmax sums: rowsum(dO * O), into the scratch.
      Desc product = g.scratch(CUDNN_DATA_FLOAT, {b, hq, sq, d});
      g.pointwise(CUDNN_POINTWISE_MUL, doT, oT, nullptr, product);
      Desc rowSum = g.scratch(CUDNN_DATA_FLOAT, rowDims);
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, product, rowSum);
      Desc softmaxSum = g.tensor(CUDNN_DATA_FLOAT, rowDims, {hq * sq, sq, 1, 1},
                                 false, kSoftmaxSum);
      g.pointwise(CUDNN_POINTWISE_MUL, rowSum, one, nullptr, softmaxSum);
      // P = exp(scale q k^T - logsumexp), masked.
      Desc masked =
          g.scaledScores(qT, kT, scaleT, lowest, scores, p.causal, &stats);
      Desc probabilities = g.scratch(CUDNN_DATA_FLOAT, scores);
      g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, nullptr, probabilities);
      // dV = P^T dO (summed over a key/value head's query heads).
      std::vector<int64_t> transposed = {hq * sq * sk, sq * sk, 1, sk};
      Desc pT =
          g.tensor(CUDNN_DATA_BFLOAT16, {b, hq, sk, sq}, transposed, true);
      g.reshape(probabilities, pT);
      auto perKvHead = [&](const Desc &a, const Desc &bOperand,
                           const Desc &result) {
        if (hq == hk) {
          g.matmul(a, bOperand, result);
          return;
        }
        Desc full = g.scratch(CUDNN_DATA_BFLOAT16, {b, hq, sk, d});
        g.matmul(a, bOperand, full);
        g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, result);
      };
      perKvHead(pT, doT, dvT);
      // dS = scale * P * (dO V^T - softmax sums).
      Desc dp = g.scratch(CUDNN_DATA_FLOAT, scores);
      g.matmul(doT, vT, dp);
      Desc centered = g.scratch(CUDNN_DATA_FLOAT, scores);
      g.pointwise(CUDNN_POINTWISE_SUB, dp, softmaxSum, nullptr, centered);
      Desc weighted = g.scratch(CUDNN_DATA_FLOAT, scores);
      g.pointwise(CUDNN_POINTWISE_MUL, centered, probabilities, nullptr,
                  weighted);
      Desc ds =
          g.scratch(dsInBf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT, scores);
      g.pointwise(CUDNN_POINTWISE_MUL, weighted, scaleT, nullptr, ds);
      // dK = dS^T Q.
      Desc dsT =
          g.tensor(CUDNN_DATA_BFLOAT16, {b, hq, sk, sq}, transposed, true);
      g.reshape(ds, dsT);
      perKvHead(dsT, qT, dkT);
      // dQ = dS K, accumulated in fp32, then rounded into dq.
      Desc kN = g.tensor(CUDNN_DATA_BFLOAT16, {b, hk, sk, d},
                         {sk * k[0], k[1], k[0], 1}, true);
      g.reshape(kT, kN);
      Desc accumulator =
          g.tensor(CUDNN_DATA_FLOAT, {b, hq, sq, d},
                   {hq * sq * d, sq * d, d, 1}, false, kDqAccumulator);
      g.matmul(ds, kN, accumulator);
      g.pointwise(CUDNN_POINTWISE_IDENTITY, accumulator, nullptr, nullptr, dqT);
    }

    std::string why;
    made->plan = g.plan(&why);
    if (!made->declined.empty())
      made->declined += "; ";
    made->declined += why;
    if (made->plan || !backward)
      break;
  }
  if (made->plan) {
    int64_t bytes = 0;
    MTRT_CUDNN_CHECK(
        cudnnBackendGetAttribute(made->plan.get(),
                                 CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                 CUDNN_TYPE_INT64, 1, nullptr, &bytes),
        what);
    made->workspaceBytes = static_cast<size_t>(std::max<int64_t>(bytes, 0));
  }
  return *plans_.emplace(key, std::move(made)).first->second;
}

std::string CudnnAttention::prepare(const AttentionParams &p,
                                    const FlashTensors &io, bool backward,
                                    size_t *workspaceBytes) {
  std::string reason = cudnnAttentionUnsupportedReason(p, io);
  if (!reason.empty())
    return reason;
  const Plan &made = plan(p, io, backward);
  if (!made.plan)
    return made.declined;
  if (workspaceBytes)
    *workspaceBytes = made.workspaceBytes;
  return std::string();
}

namespace {

/// Runs `plan` on `stream` with these tensors.
void execute(cudnnHandle_t handle, cudaStream_t stream, const Desc &plan,
             const std::vector<int64_t> &uids, const std::vector<void *> &data,
             void *workspace, const std::string &what) {
  MTRT_CUDNN_CHECK(cudnnSetStream(handle, stream), what);
  Desc pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, what);
  MTRT_CUDNN_CHECK(
      cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                               CUDNN_TYPE_INT64,
                               static_cast<int64_t>(uids.size()), uids.data()),
      what);
  MTRT_CUDNN_CHECK(cudnnBackendSetAttribute(
                       pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                       CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(data.size()),
                       data.data()),
                   what);
  MTRT_CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(),
                                            CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                            CUDNN_TYPE_VOID_PTR, 1, &workspace),
                   what);
  MTRT_CUDNN_CHECK(cudnnBackendFinalize(pack.get()), what);
  MTRT_CUDNN_CHECK(cudnnBackendExecute(handle, plan.get(), pack.get()), what);
}

} // namespace

void CudnnAttention::forward(cudaStream_t stream, const AttentionParams &p,
                             const FlashTensors &io, __nv_bfloat16 *outCopy,
                             float *logsumexp, void *workspace,
                             size_t workspaceBytes) {
  std::string what = "forward, " + shapeText(p);
  std::string reason = cudnnAttentionUnsupportedReason(p, io);
  if (!reason.empty())
    throw Error(MTRT_STATUS_INTERNAL,
                "cuDNN attention (" + what + ") called for " + reason);
  if (!io.out && !outCopy)
    throw Error(MTRT_STATUS_INTERNAL,
                "cuDNN attention (" + what + "): no output to write");
  // cuDNN writes one output: into io.out, or the packed copy when there is
  // no io.out; with both, the copy is taken after.
  FlashTensors call = io;
  if (!io.out) {
    call.out = outCopy;
    call.outLayout = FlashLayout{};
  }
  const Plan &made = plan(p, call, false);
  if (!made.plan)
    throw Error(MTRT_STATUS_INTERNAL,
                "cuDNN attention (" + what + "): " + made.declined);
  if (workspaceBytes < made.workspaceBytes)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "cuDNN attention (" + what + "): its plan needs " +
                    std::to_string(made.workspaceBytes) +
                    " bytes of workspace, the memory plan gives " +
                    std::to_string(workspaceBytes) +
                    " (core/OpScratch.h's kCudnnAttentionWorkspaceBytes)");
  float scale = softmaxScale(p);
  float lowest = std::numeric_limits<float>::lowest();
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void *> data = {const_cast<void *>(io.q),
                              const_cast<void *>(io.k),
                              const_cast<void *>(io.v),
                              call.out,
                              logsumexp,
                              &scale};
  if (p.causal) { // the mask's fill, a tensor of the graph only then
    uids.push_back(kLowest);
    data.push_back(&lowest);
  }
  execute(static_cast<cudnnHandle_t>(handle_), stream, made.plan, uids, data,
          workspace, what);
  if (io.out && outCopy) {
    // The packed copy: rows of headDim elements, either heads at one
    // stride throughout or whole positions of contiguous heads.
    auto o = strides(io.outLayout, p.headsQ, p.headDim);
    size_t head = static_cast<size_t>(p.headDim) * sizeof(__nv_bfloat16);
    cudaError_t error = cudaErrorInvalidValue;
    if (o[0] == p.headsQ * o[1])
      error = cudaMemcpy2DAsync(outCopy, head, io.out, size_t(o[1]) * 2, head,
                                size_t(p.batch * p.seqQ * p.headsQ),
                                cudaMemcpyDeviceToDevice, stream);
    else if (o[1] == p.headDim)
      error = cudaMemcpy2DAsync(
          outCopy, head * p.headsQ, io.out, size_t(o[0]) * 2, head * p.headsQ,
          size_t(p.batch * p.seqQ), cudaMemcpyDeviceToDevice, stream);
    if (error != cudaSuccess)
      throw Error(MTRT_STATUS_INTERNAL,
                  "cuDNN attention (" + what +
                      "): copying the output for the gradient: " +
                      cudaGetErrorString(error));
  }
}

void CudnnAttention::backward(cudaStream_t stream, const AttentionParams &p,
                              const FlashTensors &io, const __nv_bfloat16 *out,
                              const float *logsumexp, void *scratch,
                              size_t scratchBytes) {
  std::string what = "backward, " + shapeText(p);
  std::string reason = cudnnAttentionUnsupportedReason(p, io);
  if (!reason.empty())
    throw Error(MTRT_STATUS_INTERNAL,
                "cuDNN attention (" + what + ") called for " + reason);
  if (!io.dq || !io.dk || !io.dv)
    throw Error(MTRT_STATUS_INTERNAL,
                "cuDNN attention (" + what + "): dq, dk and dv are required");
  const Plan &made = plan(p, io, true);
  if (!made.plan)
    throw Error(MTRT_STATUS_INTERNAL,
                "cuDNN attention (" + what + "): " + made.declined);
  size_t needed = backwardScratchBytes(p, made.workspaceBytes);
  if (scratchBytes < needed)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "cuDNN attention (" + what + "): it needs " +
                    std::to_string(needed) +
                    " bytes of scratch (softmax sums, the dq accumulator and "
                    "the plan's " +
                    std::to_string(made.workspaceBytes) +
                    " bytes of workspace), the memory plan gives " +
                    std::to_string(scratchBytes) +
                    " (core/OpScratch.h's kCudnnAttentionWorkspaceBytes)");
  size_t rows = static_cast<size_t>(p.batch * p.headsQ * p.seqQ);
  char *base = static_cast<char *>(scratch);
  void *softmaxSum = base;
  void *accumulator = base + alignUp(4 * rows);
  void *workspace =
      base + alignUp(4 * rows) + alignUp(4 * rows * size_t(p.headDim));
  // Before cuDNN 9.6 the dq accumulator had to start at zero.
  if (cudnnGetVersion() < 90600) {
    cudaError_t error =
        cudaMemsetAsync(accumulator, 0, 4 * rows * size_t(p.headDim), stream);
    if (error != cudaSuccess)
      throw Error(MTRT_STATUS_INTERNAL,
                  "cuDNN attention (" + what +
                      "): clearing dq's sums: " + cudaGetErrorString(error));
  }
  float scale = softmaxScale(p);
  float lowest = std::numeric_limits<float>::lowest();
  float one = 1.0f;
  std::vector<int64_t> uids = {
      kQ,   kK,  kV,  kO,  kDout,       kStats,        kScale,
      kOne, kDq, kDk, kDv, kSoftmaxSum, kDqAccumulator};
  std::vector<void *> data = {const_cast<void *>(io.q),
                              const_cast<void *>(io.k),
                              const_cast<void *>(io.v),
                              const_cast<__nv_bfloat16 *>(out),
                              const_cast<void *>(io.dout),
                              const_cast<float *>(logsumexp),
                              &scale,
                              &one,
                              io.dq,
                              io.dk,
                              io.dv,
                              softmaxSum,
                              accumulator};
  if (p.causal) {
    uids.push_back(kLowest);
    data.push_back(&lowest);
  }
  execute(static_cast<cudnnHandle_t>(handle_), stream, made.plan, uids, data,
          workspace, what);
}

#endif // MTRT_HAVE_CUDNN

} // namespace mtrt::cuda
