// The cuda backend's conformance with the host backend, op by op: each test
// runs a one- or two-instruction function on both executors from the same
// inputs and compares every output (and parameter gradient).
#include "BundleTestBuilder.h"
#include "CudaTestSupport.h"

#include "cuda/CudaCheck.h"
#include "cuda/Executor.h"
#include "cuda/ParameterStore.h"
#include "cuda/kernels/Kernels.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/ExactSquareSum.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>

using namespace mtrt;
using namespace mtrt::test;

namespace {

/// One function, its inputs and the comparison of both backends.
class OpCase {
public:
  FunctionBuilder f{"op"};

  int64_t input(std::vector<int64_t> shape, double scale = 1.0) {
    int64_t v = f.input(shape, "f32");
    inputs_.push_back(randomTensor(shape, ++seed_, scale));
    return v;
  }
  int64_t ids(std::vector<int64_t> shape, int64_t limit,
              DType dtype = DType::I32) {
    int64_t v = f.input(shape, dtype == DType::I64 ? "i64" : "i32");
    inputs_.push_back(randomIds(shape, limit, ++seed_, dtype));
    return v;
  }
  /// The bundle's model.precision: "bf16" runs the cuda side in mixed
  /// precision (the host stays the fp32 reference).
  std::string precision = "fp32";
  /// When set, the cuda executor must hold this many values in bf16
  /// (Executor::bf16ValueCount); unset: every value in fp32.
  int64_t bf16Values = -1;
  /// When set, the cuda executor must elide this many splits and concats
  /// (Executor::elidedCopyCount: flash attention in place).
  int64_t elidedCopies = -1;
  /// ContextOptions::deterministicAttention for the cuda side.
  bool deterministicAttention = false;

  /// The host tensor of the input defined by the last ids() or input().
  host::Tensor &lastInput() { return inputs_.back(); }
  void parameter(Json p) { parameters_.push_back(std::move(p)); }

  /// Runs the function on both backends (parameters seeded identically),
  /// its micro-batch starting at sample `firstSample` (dropout's key), and
  /// compares outputs and gradients within
  /// `tolerance` (0: bit for bit). Without a GPU, runs the host side only
  /// (so the case itself is checked) and skips.
  void check(double tolerance, uint64_t firstSample = 11) {
    Json model = modelJson(256, 8, 4, 2, 2);
    model["precision"] = precision;
    Json manifest =
        manifestJson(model, parameters_, Json::array({f.build()}));
    Bundle bundle = Bundle::parseManifest("op-test", manifest.dump());
    host::ThreadPool pool(2);
    host::ParameterStore hostStore(bundle, DType::F32);
    hostStore.initialize(pool, 5);
    host::ParameterStore initial(bundle, DType::F32);
    initial.initialize(pool, 5);
    std::vector<host::TensorView> views;
    for (const host::Tensor &t : inputs_)
      views.push_back(viewOf(t));
    host::Executor hostExecutor(bundle, "op", hostStore, pool);
    std::vector<host::Tensor> expected =
        hostExecutor.run(views, {0, firstSample});
    MTRT_REQUIRE_GPU();

    cuda::ContextOptions options;
    options.bf16Values = bf16Values >= 0;
    options.deterministicAttention = deterministicAttention;
    cuda::Context context(options);
    cuda::ParameterStore deviceStore(bundle, context);
    deviceStore.upload(initial);
    cuda::Executor deviceExecutor(bundle, "op", deviceStore);
    std::vector<host::Tensor> actual =
        deviceExecutor.run(views, {0, firstSample});
    for (const std::string &line : context.gemm().epiloguesByKernel())
      std::printf("[ epilogue by kernels ] %s\n", line.c_str());
    for (const std::string &line : context.gemm().tuningChoices())
      std::printf("[ GEMM tuned ] %s\n", line.c_str());
    if (bf16Values >= 0) {
      EXPECT_EQ(deviceExecutor.bf16ValueCount(),
                static_cast<size_t>(bf16Values));
    }
    if (elidedCopies >= 0) {
      EXPECT_EQ(deviceExecutor.elidedCopyCount(),
                static_cast<size_t>(elidedCopies));
    }
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i) {
      std::string what = "outputs[" + std::to_string(i) + "]";
      if (isFloatingPoint(expected[i].dtype)) {
        expectClose(actual[i], expected[i], tolerance, what);
      } else {
        ASSERT_EQ(actual[i].buffer.size(), expected[i].buffer.size());
        EXPECT_EQ(std::memcmp(actual[i].buffer.data(),
                              expected[i].buffer.data(),
                              actual[i].buffer.size()),
                  0)
            << what;
      }
    }
    for (size_t p = 0; p < hostStore.size(); ++p)
      expectClose(deviceStore.gradientToHost(p), hostStore.gradient(p),
                  tolerance, "gradient of " + hostStore.info(p).name);
  }

private:
  std::vector<host::Tensor> inputs_;
  Json parameters_ = Json::array();
  uint64_t seed_ = 100;
};

// Elementwise ops use the host's float formulas without FMA contraction;
// their only differences are the device's expf/erff/tanhf (a few ulps).
constexpr double kElementwise = 2e-6;
// GEMMs and reductions sum in another order.
constexpr double kReduction = 1e-5;
// Attention's gradients go through two passes of such sums.
constexpr double kAttention = 5e-5;

class CudaOpsTest : public ::testing::Test {
protected:
  OpCase c;
};

TEST_F(CudaOpsTest, GeluErfAndTanhForwardAndBackward) {
  std::vector<int64_t> shape = {3, 5, 70};
  int64_t x = c.input(shape, 2.0), dy = c.input(shape);
  for (const char *approximate : {"erf", "tanh"}) {
    Json attrs = {{"approximate", approximate}};
    c.f.output(c.f.op("gelu", {x}, shape, attrs));
    c.f.output(c.f.op("gelu_grad", {dy, x}, shape, attrs));
  }
  c.check(kElementwise);
}

TEST_F(CudaOpsTest, SiluAndSwigluForwardAndBackward) {
  std::vector<int64_t> shape = {4, 333};
  int64_t gate = c.input(shape, 3.0), up = c.input(shape),
          dy = c.input(shape);
  c.f.output(c.f.op("silu", {gate}, shape));
  c.f.output(c.f.op("silu_grad", {dy, gate}, shape));
  c.f.output(c.f.op("swiglu", {gate, up}, shape));
  int64_t dgate = c.f.value(shape), dup = c.f.value(shape);
  c.f.inst("swiglu_grad", {dy, gate, up}, {dgate, dup});
  c.f.output(dgate);
  c.f.output(dup);
  c.check(kElementwise);
}

TEST_F(CudaOpsTest, AddMulAndFill) {
  std::vector<int64_t> shape = {2, 3, 257};
  int64_t a = c.input(shape), b = c.input(shape);
  c.f.output(c.f.op("add", {a, b}, shape));
  c.f.output(c.f.op("mul", {a, b}, shape));
  c.f.output(c.f.op("fill", {}, shape, {{"value", 0.375}}));
  c.f.output(c.f.op("fill", {}, {}, {{"value", -2.5}}));
  c.check(0);
}

// Same seed, samples and positions: the same elements are dropped and the
// kept ones scaled by the same float, so the results are identical.
TEST_F(CudaOpsTest, DropoutMasksEqualTheHostsBitForBit) {
  std::vector<int64_t> shape = {3, 7, 129};
  int64_t x = c.input(shape);
  c.f.output(c.f.op("dropout", {x}, shape, {{"p", 0.3}, {"seed", 9}}));
  c.f.output(c.f.op("dropout", {x}, shape, {{"p", 0.0}, {"seed", 9}}));
  c.check(0, 12345);
}

TEST_F(CudaOpsTest, SoftmaxAlongTheLastAndAnInnerAxis) {
  std::vector<int64_t> shape = {3, 6, 50};
  int64_t x = c.input(shape, 3.0), dy = c.input(shape);
  for (int64_t axis : {-1, 1}) {
    int64_t y = c.f.op("softmax", {x}, shape, {{"axis", axis}});
    c.f.output(y);
    c.f.output(c.f.op("softmax_grad", {dy, y}, shape, {{"axis", axis}}));
  }
  c.check(kReduction);
}

TEST_F(CudaOpsTest, LayerNormWithAndWithoutBiasForwardAndBackward) {
  std::vector<int64_t> shape = {4, 6, 96}, hidden = {96};
  int64_t x = c.input(shape, 2.0), w = c.input(hidden), b = c.input(hidden),
          dy = c.input(shape);
  Json eps = {{"epsilon", 1e-5}};
  c.f.output(c.f.op("layer_norm", {x, w, b}, shape, eps));
  c.f.output(c.f.op("layer_norm", {x, w}, shape, eps));
  int64_t dx = c.f.value(shape), dw = c.f.value(hidden), db = c.f.value(hidden);
  c.f.inst("layer_norm_grad", {dy, x, w}, {dx, dw, db}, eps);
  int64_t dx2 = c.f.value(shape), dw2 = c.f.value(hidden);
  c.f.inst("layer_norm_grad", {dy, x, w}, {dx2, dw2}, eps);
  for (int64_t v : {dx, dw, db, dx2, dw2})
    c.f.output(v);
  c.check(kReduction);
}

TEST_F(CudaOpsTest, RmsNormForwardAndBackward) {
  std::vector<int64_t> shape = {5, 3, 300}, hidden = {300};
  int64_t x = c.input(shape, 2.0), w = c.input(hidden), dy = c.input(shape);
  Json eps = {{"epsilon", 1e-6}};
  c.f.output(c.f.op("rms_norm", {x, w}, shape, eps));
  int64_t dx = c.f.value(shape), dw = c.f.value(hidden);
  c.f.inst("rms_norm_grad", {dy, x, w}, {dx, dw}, eps);
  c.f.output(dx);
  c.f.output(dw);
  c.check(kReduction);
}

TEST_F(CudaOpsTest, LinearWithBiasAndTransposedWeight) {
  int64_t x = c.input({2, 7, 33}), w = c.input({33, 45}),
          wt = c.input({45, 33}), b = c.input({45});
  c.f.output(c.f.op("linear", {x, w, b}, {2, 7, 45}));
  c.f.output(c.f.op("linear", {x, w}, {2, 7, 45}));
  c.f.output(
      c.f.op("linear", {x, wt, b}, {2, 7, 45}, {{"transpose_weight", true}}));
  c.check(kReduction);
}

TEST_F(CudaOpsTest, LinearWeightGradAndBiasGrad) {
  int64_t x = c.input({2, 70, 33}), dy = c.input({2, 70, 45});
  c.f.output(c.f.op("linear_weight_grad", {x, dy}, {33, 45}));
  c.f.output(c.f.op("linear_weight_grad", {x, dy}, {45, 33},
                    {{"transpose_weight", true}}));
  c.f.output(c.f.op("bias_grad", {dy}, {45}));
  c.check(kReduction);
}

TEST_F(CudaOpsTest, BatchedMatmulWithEveryTransposition) {
  int64_t l = c.input({3, 5, 6}), r = c.input({3, 6, 4}),
          lt = c.input({3, 6, 5}), rt = c.input({3, 4, 6});
  c.f.output(c.f.op("matmul", {l, r}, {3, 5, 4}));
  c.f.output(c.f.op("matmul", {lt, r}, {3, 5, 4}, {{"transpose_lhs", true}}));
  c.f.output(c.f.op("matmul", {l, rt}, {3, 5, 4}, {{"transpose_rhs", true}}));
  c.f.output(c.f.op("matmul", {lt, rt}, {3, 5, 4},
                    {{"transpose_lhs", true}, {"transpose_rhs", true}}));
  c.check(kReduction);
}

/// attention and attention_grad on q [b, s, hq, d], k [b, sk, hkv, d],
/// v [b, sk, hkv, dv].
void attentionCase(OpCase &c, std::vector<int64_t> q, std::vector<int64_t> k,
                   std::vector<int64_t> v, Json attrs) {
  std::vector<int64_t> o = {q[0], q[1], q[2], v[3]};
  int64_t qv = c.input(q), kv = c.input(k), vv = c.input(v),
          dy = c.input(o);
  c.f.output(c.f.op("attention", {qv, kv, vv}, o, attrs));
  int64_t dq = c.f.value(q), dk = c.f.value(k), dvv = c.f.value(v);
  c.f.inst("attention_grad", {dy, qv, kv, vv}, {dq, dk, dvv}, attrs);
  c.f.output(dq);
  c.f.output(dk);
  c.f.output(dvv);
}

TEST_F(CudaOpsTest, CausalGroupedQueryAttentionWithDropout) {
  attentionCase(c, {2, 9, 4, 16}, {2, 9, 2, 16}, {2, 9, 2, 16},
                {{"causal", true}, {"dropout_p", 0.2}, {"seed", 3}});
  c.check(kAttention);
}

TEST_F(CudaOpsTest, NonCausalAttentionWithScaleAndOtherValueWidth) {
  attentionCase(c, {2, 5, 2, 8}, {2, 7, 2, 8}, {2, 7, 2, 12},
                {{"scale", 0.3}, {"dropout_p", 0.0}, {"seed", 0}});
  c.check(kAttention);
}

// Mixed precision (bf16 operands, fp32 accumulation): products round each
// operand to 8 bits of mantissa, so results agree to about 1e-2 of the
// largest magnitude.
constexpr double kBf16 = 2e-2;

// The flash-attention kernels (bf16 bundles) against the host's fp32
// attention, at every head dimension they take, with ragged tiles.
TEST_F(CudaOpsTest, FlashAttentionCausalGroupedQueryWithDropoutInBf16) {
  c.precision = "bf16";
  attentionCase(c, {2, 9, 4, 16}, {2, 9, 2, 16}, {2, 9, 2, 16},
                {{"causal", true}, {"dropout_p", 0.2}, {"seed", 3}});
  c.check(kBf16);
}

TEST_F(CudaOpsTest, FlashAttentionHeadDim32AcrossKeyBlocksInBf16) {
  c.precision = "bf16";
  attentionCase(c, {2, 150, 4, 32}, {2, 150, 4, 32}, {2, 150, 4, 32},
                {{"causal", true}, {"dropout_p", 0.1}, {"seed", 5}});
  c.check(kBf16, 3);
}

TEST_F(CudaOpsTest, FlashAttentionHeadDim64NonCausalOtherKeyCountInBf16) {
  c.precision = "bf16";
  attentionCase(c, {1, 70, 2, 64}, {1, 200, 1, 64}, {1, 200, 1, 64},
                {{"scale", 0.1}, {"dropout_p", 0.0}, {"seed", 0}});
  c.check(kBf16);
}

TEST_F(CudaOpsTest, FlashAttentionHeadDim128InBf16) {
  c.precision = "bf16";
  attentionCase(c, {1, 256, 2, 128}, {1, 256, 2, 128}, {1, 256, 2, 128},
                {{"causal", true}, {"dropout_p", 0.1}, {"seed", 8}});
  c.check(kBf16, 9);
}

// Head dimension 128 (8 warps over 128 rows a block, two stages of walked
// tiles): grouped-query heads, not causal, a key count whose last 128-key
// block holds one 64-key mask word (260 keys: 5 words a row), dropout
// without paired draws.
TEST_F(CudaOpsTest, FlashAttentionHeadDim128GroupedQueryNonCausalInBf16) {
  c.precision = "bf16";
  attentionCase(c, {1, 70, 4, 128}, {1, 260, 2, 128}, {1, 260, 2, 128},
                {{"causal", false}, {"dropout_p", 0.1}, {"seed", 12}});
  c.check(kBf16, 4);
}

// GPT-2's head dimension with whole tiles: tiles below the causal diagonal
// (no mask), key counts divisible by 4 (the lanes of a pair share their
// dropout draws) and grouped-query heads, against the host's masks.
TEST_F(CudaOpsTest, FlashAttentionHeadDim64WholeTilesWithDropoutInBf16) {
  c.precision = "bf16";
  attentionCase(c, {2, 192, 4, 64}, {2, 192, 2, 64}, {2, 192, 2, 64},
                {{"causal", true}, {"dropout_p", 0.1}, {"seed", 6}});
  c.check(kBf16, 5);
}

/// Which of attentionLayerCase's values are function outputs too (outputs
/// stay fp32, and so does every value that must share their type).
struct LayerOutputs {
  bool query = false;    // q: flash attention's inputs (q, k, v, dout) fp32
  bool attention = false; // the forward's output fp32
  bool queryGrad = false; // dq: the gradient's outputs (dq, dk, dv) fp32
};

/// A GPT layer's attention path as the bundles hold it: the qkv linear ->
/// reshape -> split into q, k, v -> attention -> reshape -> the projection
/// linear; and its gradient: the projection's data gradient -> reshape ->
/// attention_grad -> concat -> reshape -> the qkv data and weight
/// gradients. Every value between the GEMMs may be held in bf16: 14 when
/// none is an output. The split and concat are on the heads (axis 2: q, k,
/// v heads one after the other, [batch, seq, headsQ + 2 headsKv, headDim])
/// or, as the GPT bundles, on the last axis (axis 3: [batch, seq, heads,
/// 3 headDim], q, k, v of a head side by side; headsQ == headsKv).
void attentionLayerCase(OpCase &c, int64_t batch, int64_t seq,
                        int64_t headsQ, int64_t headsKv, int64_t headDim,
                        Json attrs, LayerOutputs outputs = {},
                        int64_t axis = 2) {
  int64_t hidden = headsQ * headDim, heads = headsQ + 2 * headsKv;
  int64_t width = heads * headDim;
  std::vector<int64_t> packed = {batch, seq, heads, headDim};
  if (axis == 3)
    packed = {batch, seq, headsQ, 3 * headDim};
  // Weights of scale 1/sqrt(hidden): scores of about unit variance.
  double scale = 1.0 / std::sqrt(static_cast<double>(hidden));
  int64_t x = c.input({batch, seq, hidden}),
          wqkv = c.input({hidden, width}, scale),
          wo = c.input({hidden, hidden}, scale),
          dy = c.input({batch, seq, hidden});
  std::vector<int64_t> qShape = {batch, seq, headsQ, headDim},
                       kShape = {batch, seq, headsKv, headDim};
  int64_t qkv = c.f.op("linear", {x, wqkv}, {batch, seq, width});
  int64_t split = c.f.op("reshape", {qkv}, packed);
  int64_t q = c.f.value(qShape), k = c.f.value(kShape), v = c.f.value(kShape);
  c.f.inst("split", {split}, {q, k, v}, {{"axis", axis}});
  int64_t o = c.f.op("attention", {q, k, v}, qShape, attrs);
  int64_t merged = c.f.op("reshape", {o}, {batch, seq, hidden});
  c.f.output(c.f.op("linear", {merged, wo}, {batch, seq, hidden}));
  int64_t dmerged = c.f.op("linear", {dy, wo}, {batch, seq, hidden},
                           {{"transpose_weight", true}});
  int64_t dout = c.f.op("reshape", {dmerged}, qShape);
  int64_t dq = c.f.value(qShape), dk = c.f.value(kShape),
          dv = c.f.value(kShape);
  c.f.inst("attention_grad", {dout, q, k, v}, {dq, dk, dv}, attrs);
  int64_t dsplit = c.f.op("concat", {dq, dk, dv}, packed, {{"axis", axis}});
  int64_t dqkv = c.f.op("reshape", {dsplit}, {batch, seq, width});
  c.f.output(c.f.op("linear", {dqkv, wqkv}, {batch, seq, hidden},
                    {{"transpose_weight", true}}));
  c.f.output(c.f.op("linear_weight_grad", {x, dqkv}, {hidden, width}));
  c.f.output(c.f.op("linear_weight_grad", {merged, dy}, {hidden, hidden}));
  if (outputs.query)
    c.f.output(q);
  if (outputs.attention)
    c.f.output(o);
  if (outputs.queryGrad)
    c.f.output(dq);
}

// Flash attention reading and writing bf16 between the layer's GEMMs: all
// 14 values from the qkv linear's result to the concat's reshape are held
// in bf16 (no rounding pass); grouped-query heads, dropout, whole tiles.
TEST_F(CudaOpsTest, FlashAttentionInBf16BetweenGemmsGroupedQueryDropout) {
  c.precision = "bf16";
  attentionLayerCase(c, 2, 192, 4, 2, 64,
                     {{"causal", true}, {"dropout_p", 0.1}, {"seed", 6}});
  c.bf16Values = 14;
  c.elidedCopies = 2; // q, k, v and dq, dk, dv in place
  c.check(kBf16, 5);
}

// Head dimension 128, a ragged last tile, dropout.
TEST_F(CudaOpsTest, FlashAttentionInBf16BetweenGemmsHeadDim128) {
  c.precision = "bf16";
  attentionLayerCase(c, 1, 130, 2, 2, 128,
                     {{"causal", true}, {"dropout_p", 0.1}, {"seed", 9}});
  c.bf16Values = 14;
  c.elidedCopies = 2;
  c.check(kBf16, 2);
}

// Head dimension 128 with bf16 values (the tiles copied by cp.async):
// grouped-query heads, dropout with paired draws, causal over three
// 128-query blocks (320 positions: the last one half full), two batches.
TEST_F(CudaOpsTest, FlashAttentionInBf16BetweenGemmsHeadDim128GroupedQuery) {
  c.precision = "bf16";
  attentionLayerCase(c, 2, 320, 4, 2, 128,
                     {{"causal", true}, {"dropout_p", 0.1}, {"seed", 10}});
  c.bf16Values = 14;
  c.elidedCopies = 2;
  c.check(kBf16, 3);
}

// The fused backward at head dimension 128 (dq summed by fp32 reductions
// from the dk/dv kernel): grouped-query heads, not causal (every key block
// adds to every query tile), 198 positions (a ragged last 128-key block and
// 64-query tile, dropout draws not paired).
TEST_F(CudaOpsTest, FlashAttentionInBf16BetweenGemmsHeadDim128NonCausal) {
  c.precision = "bf16";
  attentionLayerCase(c, 2, 198, 4, 2, 128,
                     {{"causal", false}, {"dropout_p", 0.1}, {"seed", 13}});
  c.bf16Values = 14;
  c.elidedCopies = 2;
  c.check(kBf16, 4);
}

// The same shape as ...HeadDim128GroupedQuery with a deterministic dq
// (ContextOptions::deterministicAttention: the separate dq kernel).
TEST_F(CudaOpsTest, FlashAttentionInBf16BetweenGemmsHeadDim128Deterministic) {
  c.precision = "bf16";
  c.deterministicAttention = true;
  attentionLayerCase(c, 2, 320, 4, 2, 128,
                     {{"causal", true}, {"dropout_p", 0.1}, {"seed", 10}});
  c.bf16Values = 14;
  c.elidedCopies = 2;
  c.check(kBf16, 3);
}

// fp32 inputs (q is an output: q, k, v, dout and the split stay fp32) with
// bf16 outputs: the attention output and its reshape, dq, dk, dv, the
// concat and its reshape (7).
TEST_F(CudaOpsTest, FlashAttentionFp32InputsBf16Outputs) {
  c.precision = "bf16";
  LayerOutputs outputs;
  outputs.query = true;
  attentionLayerCase(c, 2, 70, 2, 1, 32,
                     {{"causal", false}, {"dropout_p", 0.1}, {"seed", 2}},
                     outputs);
  c.bf16Values = 7;
  c.elidedCopies = 1; // the concat (q is an output: the split copies)
  c.check(kBf16, 4);
}

// bf16 inputs with fp32 outputs (the attention output and dq are outputs):
// the qkv linear's result, its reshape, q, k, v, the projection's data
// gradient and its reshape (7).
TEST_F(CudaOpsTest, FlashAttentionBf16InputsFp32Outputs) {
  c.precision = "bf16";
  LayerOutputs outputs;
  outputs.attention = true;
  outputs.queryGrad = true;
  attentionLayerCase(c, 1, 100, 4, 4, 16,
                     {{"causal", true}, {"dropout_p", 0.2}, {"seed", 4}},
                     outputs);
  c.bf16Values = 7;
  c.elidedCopies = 1; // the split (dq is an output: the concat copies)
  c.check(kBf16, 6);
}

// The GPT bundles' packing: q, k, v of a head side by side ([batch, seq,
// heads, 3 headDim], split and concat on the last axis), read and written
// in place at a row pitch of 3 headDim: no split or concat copies; bf16
// values, dropout, ragged tiles.
TEST_F(CudaOpsTest, FlashAttentionInPlaceInTheGptPackingInBf16) {
  c.precision = "bf16";
  attentionLayerCase(c, 2, 100, 4, 4, 32,
                     {{"causal", true}, {"dropout_p", 0.1}, {"seed", 7}}, {},
                     3);
  c.bf16Values = 14;
  c.elidedCopies = 2;
  c.check(kBf16, 3);
}

// The same at head dimension 64 and 128 with values in fp32 (bf16 values
// off): the kernels read fp32 q, k, v at a pitch of 3 headDim and write
// fp32 dq, dk, dv into the concat's result.
TEST_F(CudaOpsTest, FlashAttentionInPlaceInTheGptPackingFp32Values) {
  c.precision = "bf16";
  attentionLayerCase(c, 1, 192, 2, 2, 64,
                     {{"causal", true}, {"dropout_p", 0.1}, {"seed", 3}}, {},
                     3);
  c.elidedCopies = 2;
  c.check(kBf16, 8);
}

TEST_F(CudaOpsTest, FlashAttentionInPlaceHeadDim128Fp32ValuesNoDropout) {
  c.precision = "bf16";
  attentionLayerCase(c, 1, 130, 2, 2, 128,
                     {{"causal", true}, {"dropout_p", 0.0}, {"seed", 0}}, {},
                     3);
  c.elidedCopies = 2;
  c.check(kBf16, 1);
}

// Grouped-query heads packed on the heads axis, fp32 values: views with
// pieces of different head counts (4 query heads, 2 key/value heads).
TEST_F(CudaOpsTest, FlashAttentionInPlaceGroupedQueryFp32Values) {
  c.precision = "bf16";
  attentionLayerCase(c, 2, 70, 4, 2, 16,
                     {{"causal", true}, {"dropout_p", 0.2}, {"seed", 4}});
  c.elidedCopies = 2;
  c.check(kBf16, 6);
}

// fp32 bundles run the exact attention kernels on packed tensors: the
// split and concat copy.
TEST_F(CudaOpsTest, ExactAttentionKeepsTheSplitAndConcatCopies) {
  attentionLayerCase(c, 1, 20, 2, 1, 16,
                     {{"causal", true}, {"dropout_p", 0.0}, {"seed", 0}});
  c.elidedCopies = 0;
  c.check(2 * kAttention); // the GEMMs' sums besides attention's
}

// Linear forward (with the bias epilogue) and both gradients with bf16
// operands.
TEST_F(CudaOpsTest, LinearAndItsGradientsInBf16) {
  c.precision = "bf16";
  int64_t x = c.input({48, 40}), w = c.input({40, 24}), b = c.input({24}),
          dy = c.input({48, 24});
  c.f.output(c.f.op("linear", {x, w, b}, {48, 24}));
  c.f.output(c.f.op("linear", {dy, w}, {48, 40}, {{"transpose_weight", true}}));
  c.f.output(c.f.op("linear_weight_grad", {x, dy}, {40, 24}));
  c.check(kBf16);
}

/// The GEMMs fused with their epilogues (mt-fuse-gemm-epilogues) against the
/// host's unfused sequence: linear_gelu with and without a bias and with a
/// transposed weight, linear_gelu_grad with and without the bias gradient,
/// linear_weight_bias_grad in both weight layouts; an erf GeLU (kernels
/// after the product) and an output size of 45 (cuBLASLt may have no
/// epilogue algorithm for its alignment: kernels again) beside the sizes
/// cuBLASLt takes. `batch` x `rows` / `batch` rows: 3 x 67 are seven chunks
/// of linear_gelu_grad's column sums, the last of 9 rows.
void fusedGemmCase(OpCase &c, int64_t out, const char *approximate,
                   int64_t batch = 2, int64_t rows = 48) {
  int64_t in = 40;
  std::vector<int64_t> act = {batch, rows / batch, out};
  int64_t x = c.input({batch, rows / batch, in}), w = c.input({in, out}),
          wt = c.input({out, in}), b = c.input({out}),
          dz = c.input({batch, rows / batch, in}), h = c.input(act),
          dy = c.input(act);
  Json gelu = {{"approximate", approximate}};
  Json geluT = {{"approximate", approximate}, {"transpose_weight", true}};
  auto results = [&](const char *op, std::vector<int64_t> operands,
                     std::vector<std::vector<int64_t>> shapes, Json attrs) {
    std::vector<int64_t> values;
    for (auto &shape : shapes)
      values.push_back(c.f.value(shape));
    c.f.inst(op, operands, values, attrs);
    for (int64_t v : values)
      c.f.output(v);
  };
  results("linear_gelu", {x, w, b}, {act, act}, gelu);
  results("linear_gelu", {x, wt}, {act, act}, geluT);
  // The gradient's GEMM is linear(dz, weight): [.., in] to [.., out].
  results("linear_gelu_grad", {dz, w, h}, {act, {out}},
          {{"approximate", approximate}});
  results("linear_gelu_grad", {dz, wt, h}, {act}, geluT);
  results("linear_weight_bias_grad", {x, dy}, {{in, out}, {out}},
          Json::object());
  results("linear_weight_bias_grad", {x, dy}, {{out, in}, {out}},
          {{"transpose_weight", true}});
}

TEST_F(CudaOpsTest, FusedGemmEpiloguesTanh) {
  fusedGemmCase(c, 48, "tanh");
  c.check(kReduction);
}

TEST_F(CudaOpsTest, FusedGemmEpiloguesErfAndUnalignedOutput) {
  fusedGemmCase(c, 45, "erf");
  c.check(kReduction);
}

TEST_F(CudaOpsTest, FusedGemmEpiloguesTanhInBf16) {
  c.precision = "bf16";
  fusedGemmCase(c, 48, "tanh");
  c.check(kBf16);
}

TEST_F(CudaOpsTest, FusedGemmEpiloguesManyRowsInBf16) {
  c.precision = "bf16";
  fusedGemmCase(c, 64, "tanh", 3, 201);
  c.check(kBf16);
}

TEST_F(CudaOpsTest, FusedGemmEpiloguesManyRowsErf) {
  fusedGemmCase(c, 64, "erf", 3, 201);
  c.check(kReduction);
}

TEST_F(CudaOpsTest, FusedGemmEpiloguesUnalignedOutputInBf16) {
  c.precision = "bf16";
  fusedGemmCase(c, 45, "tanh");
  c.check(kBf16);
}

/// linear_add (an add of a linear's result, fused by mt-fuse-gemm-epilogues)
/// against the host's linear and add: the addend as cuBLASLt's C, with and
/// without a bias, with a transposed weight and an output size of 45.
void linearAddCase(OpCase &c, int64_t out) {
  int64_t in = 40;
  std::vector<int64_t> act = {2, 24, out};
  int64_t x = c.input({2, 24, in}), w = c.input({in, out}),
          wt = c.input({out, in}), b = c.input({out}), r = c.input(act);
  c.f.output(c.f.op("linear_add", {x, w, r, b}, act));
  c.f.output(
      c.f.op("linear_add", {x, wt, r}, act, {{"transpose_weight", true}}));
}

TEST_F(CudaOpsTest, LinearAdd) {
  linearAddCase(c, 48);
  c.check(kReduction);
}

TEST_F(CudaOpsTest, LinearAddUnalignedOutputInBf16) {
  c.precision = "bf16";
  linearAddCase(c, 45);
  c.check(kBf16);
}

/// A residual stream in bf16 between GEMMs: r (a linear's result) is
/// linear_add's addend, and its result is read by one more linear, so both
/// are held in bf16 (cuBLASLt's C and D of one type).
TEST_F(CudaOpsTest, LinearAddOfBf16Values) {
  c.precision = "bf16";
  int64_t in = 40, out = 32;
  std::vector<int64_t> act = {2, 24, out};
  int64_t x = c.input({2, 24, in}), w1 = c.input({in, out}),
          w2 = c.input({in, out}), b2 = c.input({out}), w3 = c.input({out, in});
  int64_t r = c.f.op("linear", {x, w1}, act);
  int64_t y = c.f.op("linear_add", {x, w2, r, b2}, act);
  c.f.output(c.f.op("linear", {y, w3}, {2, 24, in}));
  c.bf16Values = 2; // r and y
  c.check(kBf16);
}

/// A GeLU MLP and its gradients in bf16, its intermediate values read only
/// by GEMMs: linear_gelu writes the activation and the pre-activation in
/// bf16, linear_gelu_grad its result, and their readers take them as their
/// bf16 operands (no rounding pass); the outputs stay fp32.
TEST_F(CudaOpsTest, GemmOnlyIntermediatesAsBf16Results) {
  c.precision = "bf16";
  int64_t rows = 64, in = 40, hidden = 96, out = 32;
  int64_t x = c.input({2, rows / 2, in}), w1 = c.input({in, hidden}),
          b1 = c.input({hidden}), w2 = c.input({hidden, out}),
          b2 = c.input({out}), dy = c.input({2, rows / 2, out});
  std::vector<int64_t> act = {2, rows / 2, hidden};
  int64_t g = c.f.value(act), pre = c.f.value(act);
  c.f.inst("linear_gelu", {x, w1, b1}, {g, pre}, {{"approximate", "tanh"}});
  c.f.output(c.f.op("linear", {g, w2, b2}, {2, rows / 2, out}));
  int64_t dpre = c.f.value(act), db1 = c.f.value({hidden});
  c.f.inst("linear_gelu_grad", {dy, w2, pre}, {dpre, db1},
           {{"approximate", "tanh"}, {"transpose_weight", true}});
  c.f.output(db1);
  c.f.output(c.f.op("linear_weight_grad", {g, dy}, {hidden, out}));
  c.f.output(c.f.op("linear", {dpre, w1}, {2, rows / 2, in},
                    {{"transpose_weight", true}}));
  c.f.output(c.f.op("linear_weight_grad", {x, dpre}, {in, hidden}));
  c.bf16Values = 3; // g, pre, dpre
  c.check(kBf16);
}

/// A norm between GEMMs, as in a transformer layer: its y feeds a linear,
/// its dy is a linear's dx, and its dx is an output. With `bf16Chain`, x is
/// itself a linear's result and dx feeds one more linear, so that under bf16
/// the plan holds x, y, dy and dx in bf16 (else only y and dy). x has an
/// offset of 3 (the mean); `rows` (even) are not a multiple of the
/// backward's blocks.
void normBetweenGemms(OpCase &c, bool rms, int64_t hidden, bool bf16Chain,
                      bool bias = true, int64_t rows = 100) {
  const int64_t out = 32, in = 64;
  std::vector<int64_t> shape = {2, rows / 2, hidden};
  int64_t x;
  if (bf16Chain) {
    int64_t x0 = c.input({2, rows / 2, in}), wx = c.input({in, hidden});
    x = c.f.op("linear", {x0, wx}, shape);
  } else {
    x = c.input(shape, 2.0);
    host::Tensor &values = c.lastInput();
    for (int64_t i = 0; i < values.numElements(); ++i)
      values.data<float>()[i] += 3.0f;
  }
  int64_t w = c.input({hidden}), b = c.input({hidden}), w2 = c.input({hidden, out}),
          dout = c.input({2, rows / 2, out});
  Json eps = {{"epsilon", rms ? 1e-6 : 1e-5}};
  std::vector<int64_t> operands = {x, w};
  if (!rms && bias)
    operands.push_back(b);
  int64_t y = c.f.op(rms ? "rms_norm" : "layer_norm", operands, shape, eps);
  c.f.output(c.f.op("linear", {y, w2}, {2, rows / 2, out}));
  int64_t dy = c.f.op("linear", {dout, w2}, shape, {{"transpose_weight", true}});
  std::vector<int64_t> grads = {c.f.value(shape), c.f.value({hidden})};
  if (!rms && bias)
    grads.push_back(c.f.value({hidden}));
  c.f.inst(rms ? "rms_norm_grad" : "layer_norm_grad", {dy, x, w}, grads, eps);
  if (bf16Chain)
    c.f.output(c.f.op("linear", {grads[0], w2}, {2, rows / 2, out}));
  else
    c.f.output(grads[0]);
  for (size_t i = 1; i < grads.size(); ++i)
    c.f.output(grads[i]);
  if (c.precision == "bf16")
    c.bf16Values = bf16Chain ? 4 : 2;
}

TEST_F(CudaOpsTest, LayerNormBetweenGemmsHidden768InBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, false, 768, false);
  c.check(kBf16);
}

TEST_F(CudaOpsTest, LayerNormBetweenGemmsHidden1000InBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, false, 1000, true);
  c.check(kBf16);
}

TEST_F(CudaOpsTest, LayerNormWithoutBiasBetweenGemmsHidden2048InBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, false, 2048, true, false);
  c.check(kBf16);
}

TEST_F(CudaOpsTest, LayerNormBetweenGemmsHidden4096InBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, false, 4096, false);
  c.check(kBf16);
}

TEST_F(CudaOpsTest, RmsNormBetweenGemmsHidden768InBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, true, 768, true);
  c.check(kBf16);
}

TEST_F(CudaOpsTest, RmsNormBetweenGemmsHidden1000InBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, true, 1000, false);
  c.check(kBf16);
}

TEST_F(CudaOpsTest, RmsNormBetweenGemmsHidden2048InBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, true, 2048, false);
  c.check(kBf16);
}

TEST_F(CudaOpsTest, RmsNormBetweenGemmsHidden4096InBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, true, 4096, true);
  c.check(kBf16);
}

// The warp-a-row norm backward (normBackwardWarpKernel: bf16 x and dy at the
// models' hidden sizes, column sums in shared memory) against the formulas
// in double on the host: dx within 5e-3 of the largest (it is rounded to
// bf16 and its terms cancel), dweight and dbias within 1e-5 of the largest.
// Layer norm with a bias and RMS norm, 1000 rows.
TEST_F(CudaOpsTest, NormBackwardWarpKernelAgainstDoubles) {
  MTRT_REQUIRE_GPU();
  const int64_t rows = 1000;
  for (int64_t hidden : {768, 1024, 2048})
    for (bool layer : {true, false}) {
      SCOPED_TRACE((layer ? "layer norm, hidden " : "RMS norm, hidden ") +
                   std::to_string(hidden));
      size_t n = static_cast<size_t>(rows * hidden);
      size_t h = static_cast<size_t>(hidden);
      std::mt19937 gen(static_cast<unsigned>(hidden) + layer);
      std::uniform_real_distribution<float> uniform(-2.f, 2.f);
      std::vector<__nv_bfloat16> x(n), dy(n);
      for (size_t i = 0; i < n; ++i) {
        x[i] = __float2bfloat16(uniform(gen) + 1.f);
        dy[i] = __float2bfloat16(uniform(gen));
      }
      std::vector<float> weight(h);
      for (float &w : weight)
        w = uniform(gen);
      const double eps = layer ? 1e-5 : 1e-6;

      // The reference, row by row.
      std::vector<double> dxRef(n), dweightRef(h, 0.0), dbiasRef(h, 0.0);
      for (size_t r = 0; r < static_cast<size_t>(rows); ++r) {
        const __nv_bfloat16 *xr = x.data() + r * h, *dyr = dy.data() + r * h;
        double mean = 0, square = 0;
        for (size_t j = 0; j < h; ++j) {
          double v = __bfloat162float(xr[j]);
          mean += v;
          square += v * v;
        }
        mean = layer ? mean / hidden : 0.0;
        double variance = square / hidden - mean * mean;
        double rstd = 1.0 / std::sqrt(variance + eps);
        double meanG = 0, meanGx = 0;
        for (size_t j = 0; j < h; ++j) {
          double xhat = (__bfloat162float(xr[j]) - mean) * rstd;
          double g = double(__bfloat162float(dyr[j])) * weight[j];
          meanG += g;
          meanGx += g * xhat;
        }
        meanG = layer ? meanG / hidden : 0.0;
        meanGx /= hidden;
        for (size_t j = 0; j < h; ++j) {
          double xhat = (__bfloat162float(xr[j]) - mean) * rstd;
          double d = __bfloat162float(dyr[j]);
          double g = d * weight[j];
          dxRef[r * h + j] = rstd * (g - meanG - xhat * meanGx);
          dweightRef[j] += d * xhat;
          dbiasRef[j] += d;
        }
      }

      void *xd = nullptr, *dyd = nullptr, *wd = nullptr, *dxd = nullptr,
           *grads = nullptr, *scratch = nullptr;
      size_t scratchBytes = 2 * cuda::normBackwardScratchBytes(rows, hidden);
      ASSERT_EQ(cudaMalloc(&xd, 2 * n), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dyd, 2 * n), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&wd, 4 * h), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dxd, 2 * n), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&grads, 8 * h), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&scratch, scratchBytes), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(xd, x.data(), 2 * n, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dyd, dy.data(), 2 * n, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(wd, weight.data(), 4 * h, cudaMemcpyHostToDevice),
                cudaSuccess);
      auto *dweight = static_cast<float *>(grads);
      float *dbias = layer ? dweight + hidden : nullptr;
      if (layer)
        cuda::layerNormBackward(nullptr, rows, hidden, {xd, true},
                                static_cast<float *>(wd), {dyd, true}, eps,
                                {dxd, true}, dweight, dbias, scratch);
      else
        cuda::rmsNormBackward(nullptr, rows, hidden, {xd, true},
                              static_cast<float *>(wd), {dyd, true}, eps,
                              {dxd, true}, dweight, scratch);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<__nv_bfloat16> dx(n);
      std::vector<float> got((layer ? 2 : 1) * h);
      ASSERT_EQ(cudaMemcpy(dx.data(), dxd, 2 * n, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(
          cudaMemcpy(got.data(), grads, 4 * got.size(), cudaMemcpyDeviceToHost),
          cudaSuccess);
      for (void *buffer : {xd, dyd, wd, dxd, grads, scratch})
        cudaFree(buffer);

      // Largest absolute difference against the largest reference value.
      auto worst = [](auto value, const std::vector<double> &ref,
                      size_t count) {
        double largest = 0, diff = 0;
        for (size_t i = 0; i < count; ++i) {
          largest = std::max(largest, std::abs(ref[i]));
          diff = std::max(diff, std::abs(double(value(i)) - ref[i]));
        }
        EXPECT_GT(largest, 0.0);
        return diff / largest;
      };
      EXPECT_LE(
          worst([&](size_t i) { return __bfloat162float(dx[i]); }, dxRef, n),
          5e-3)
          << "dx";
      EXPECT_LE(worst([&](size_t i) { return got[i]; }, dweightRef, h), 1e-5)
          << "dweight";
      if (layer) {
        EXPECT_LE(worst([&](size_t i) { return got[h + i]; }, dbiasRef, h),
                  1e-5)
            << "dbias";
      }
    }
}

// gpt-1.3b's norms (hidden 2048, x fp32 from the residual stream, y and dy
// bf16) over more rows than the staged kernels have blocks, so that each
// block cycles through its shared-memory stages several times.
TEST_F(CudaOpsTest, LayerNormBetweenGemmsHidden2048OverManyRowsInBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, false, 2048, false, true, 9002);
  c.check(kBf16);
}

// The same with x and dx in bf16 too (staged rows of two sizes).
TEST_F(CudaOpsTest, RmsNormBetweenGemmsHidden2048OverManyRowsInBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, true, 2048, true, true, 4002);
  c.check(kBf16);
}

// Staged rows of 16 elements a thread, the last warp's vectors partly past
// the row's end.
TEST_F(CudaOpsTest, LayerNormBetweenGemmsHidden3000InBf16) {
  c.precision = "bf16";
  normBetweenGemms(c, false, 3000, true, true, 602);
  c.check(kBf16);
}

TEST_F(CudaOpsTest, NormsBetweenGemmsHidden768And4096InFp32) {
  normBetweenGemms(c, false, 768, true);
  normBetweenGemms(c, true, 4096, false);
  c.check(kReduction);
}

/// A layer norm (with and without bias) and an RMS norm, forward and
/// backward, of `rows` rows of `hidden` in fp32.
void normsInFp32(OpCase &c, int64_t rows, int64_t hidden) {
  std::vector<int64_t> shape = {rows, hidden};
  int64_t x = c.input(shape, 2.0), w = c.input({hidden}),
          b = c.input({hidden}), dy = c.input(shape);
  Json eps = {{"epsilon", 1e-5}};
  c.f.output(c.f.op("layer_norm", {x, w, b}, shape, eps));
  c.f.output(c.f.op("rms_norm", {x, w}, shape, eps));
  std::vector<int64_t> withBias = {c.f.value(shape), c.f.value({hidden}),
                                   c.f.value({hidden})};
  c.f.inst("layer_norm_grad", {dy, x, w}, withBias, eps);
  std::vector<int64_t> rmsGrads = {c.f.value(shape), c.f.value({hidden})};
  c.f.inst("rms_norm_grad", {dy, x, w}, rmsGrads, eps);
  for (int64_t v : withBias)
    c.f.output(v);
  for (int64_t v : rmsGrads)
    c.f.output(v);
}

// Rows of odd length (one element per vector), and rows of 16 and 32
// elements per thread (16384: the widest the kernels take).
TEST_F(CudaOpsTest, NormsOfOddAndWideRowsInFp32) {
  normsInFp32(c, 7, 1001);
  normsInFp32(c, 5, 8192);
  normsInFp32(c, 3, 16384);
  c.check(kReduction);
}

// More rows than the backward has blocks: blocks of 8 and 9 rows.
TEST_F(CudaOpsTest, NormsOverManyRowsInFp32) {
  normsInFp32(c, 9001, 96);
  c.check(kReduction);
}

// Hidden 2048 in fp32 over many rows: the backward's stages (x and dy in
// fp32) fill the staged kernels' shared memory exactly; hidden 3000: a
// staged forward, a backward in registers.
TEST_F(CudaOpsTest, NormsOverManyRowsHidden2048And3000InFp32) {
  normsInFp32(c, 3001, 2048);
  normsInFp32(c, 101, 3000);
  c.check(kReduction);
}

// Wider rows than the kernels keep in registers: refused when the executor
// is made, naming the limit.
TEST_F(CudaOpsTest, NormsWiderThanTheKernelsTakeAreRefused) {
  MTRT_REQUIRE_GPU();
  FunctionBuilder f{"op"};
  int64_t x = f.input({2, 16388}, "f32"), w = f.input({16388}, "f32");
  f.output(f.op("layer_norm", {x, w}, {2, 16388}, {{"epsilon", 1e-5}}));
  Json manifest = manifestJson(modelJson(256, 8, 4, 2, 2), Json::array(),
                               Json::array({f.build()}));
  Bundle bundle = Bundle::parseManifest("wide-norm", manifest.dump());
  cuda::Context context;
  cuda::ParameterStore store(bundle, context);
  expectError([&] { cuda::Executor(bundle, "op", store); },
              MTRT_STATUS_UNIMPLEMENTED,
              {"layer_norm", "hidden size of up to 16384, found 16388"});
}

// Sizes of GPT-2's heads, over several warps and key blocks.
TEST_F(CudaOpsTest, CausalAttentionWithHeadDim64AndLongRows) {
  attentionCase(c, {1, 130, 2, 64}, {1, 130, 1, 64}, {1, 130, 1, 64},
                {{"causal", true}, {"dropout_p", 0.1}, {"seed", 4}});
  c.check(kAttention, 7);
}

TEST_F(CudaOpsTest, RopeForwardAndInverseWithPartialRotation) {
  std::vector<int64_t> shape = {2, 6, 3, 8};
  int64_t x = c.input(shape);
  for (bool inverse : {false, true}) {
    Json attrs = {{"base", 10000.0}, {"rotary_dim", 6}};
    if (inverse)
      attrs["inverse"] = true;
    c.f.output(c.f.op("rope", {x}, shape, attrs));
  }
  c.f.output(c.f.op("rope", {x}, shape, {{"base", 500.0}}));
  c.check(kElementwise);
}

/// Rope between GEMMs in bf16, its input and results held in bf16 (the
/// kernel in groups of eight): a partial rotation (16 of 32, half a
/// group) with features passing through, and a whole one.
TEST_F(CudaOpsTest, RopeBetweenGemmsInBf16) {
  c.precision = "bf16";
  std::vector<int64_t> flat = {2, 6, 96}, heads = {2, 6, 3, 32};
  int64_t x = c.input({2, 6, 16}), w = c.input({16, 96}), w2 = c.input({96, 8});
  int64_t q = c.f.op("reshape", {c.f.op("linear", {x, w}, flat)}, heads);
  for (int64_t rotary : {16, 32}) {
    int64_t r =
        c.f.op("rope", {q}, heads, {{"base", 10000.0}, {"rotary_dim", rotary}});
    c.f.output(c.f.op("linear", {c.f.op("reshape", {r}, flat), w2}, {2, 6, 8}));
  }
  c.bf16Values = 6; // the linear's result, the reshapes, the ropes
  c.check(kBf16);
}

// Hugging Face's linear and llama3 scalings, as the host computes them: with
// base 100, head_dim 8 and original 64 the wavelengths (6.3, 20, 63, 199)
// take all three llama3 branches.
TEST_F(CudaOpsTest, RopeWithLinearAndLlama3Scaling) {
  std::vector<int64_t> shape = {2, 6, 3, 8};
  int64_t x = c.input(shape);
  c.f.output(c.f.op("rope", {x}, shape,
                    {{"base", 10000.0}, {"scaling_factor", 4.0}}));
  Json llama3 = {{"base", 100.0},
                 {"scaling_factor", 8.0},
                 {"low_freq_factor", 1.0},
                 {"high_freq_factor", 4.0},
                 {"original_max_positions", 64}};
  c.f.output(c.f.op("rope", {x}, shape, llama3));
  llama3["inverse"] = true;
  c.f.output(c.f.op("rope", {x}, shape, llama3));
  c.check(kElementwise);
}

// YaRN's ramp (base 100, head_dim 8, original 64: the ramp from beta_fast 4
// to beta_slow 0.5 covers pairs 1 to 3) and its attention factor, forward
// and inverse, untruncated too, as the host computes them.
TEST_F(CudaOpsTest, RopeWithYarnScaling) {
  std::vector<int64_t> shape = {2, 6, 3, 8};
  int64_t x = c.input(shape);
  Json yarn = {{"base", 100.0},          {"scaling_factor", 4.0},
               {"original_max_positions", 64}, {"beta_fast", 4.0},
               {"beta_slow", 0.5},       {"attention_factor", 1.1386}};
  c.f.output(c.f.op("rope", {x}, shape, yarn));
  yarn["inverse"] = true;
  c.f.output(c.f.op("rope", {x}, shape, yarn));
  yarn["truncate"] = false;
  c.f.output(c.f.op("rope", {x}, shape, yarn));
  c.check(kElementwise);
}

TEST_F(CudaOpsTest, EmbeddingAndItsGradientWithRepeatedIds) {
  for (DType dtype : {DType::I32, DType::I64}) {
    int64_t table = c.input({50, 12});
    int64_t ids = c.ids({3, 7}, 5, dtype); // few distinct ids: many repeats
    int64_t dy = c.input({3, 7, 12});
    c.f.output(c.f.op("embedding", {table, ids}, {3, 7, 12}));
    c.f.output(c.f.op("embedding_grad", {dy, ids}, {50, 12}));
  }
  c.check(kReduction);
}

// Over a thousand ids: the backward's id tiles and several table blocks.
TEST_F(CudaOpsTest, EmbeddingGradientOverManyIdsAndRows) {
  int64_t ids = c.ids({4, 300}, 200);
  int64_t dy = c.input({4, 300, 40});
  c.f.output(c.f.op("embedding_grad", {dy, ids}, {200, 40}));
  c.check(kReduction);
}

TEST_F(CudaOpsTest, PositionIds) {
  c.f.output(c.f.op("position_ids", {}, {3, 7}, Json::object(), "i32"));
  c.f.output(c.f.op("position_ids", {}, {2, 5}, Json::object(), "i64"));
  c.check(0);
}

TEST_F(CudaOpsTest, CrossEntropyEveryReductionWithIgnoredLabels) {
  std::vector<int64_t> logitsShape = {3, 5, 40}, rows = {3, 5};
  int64_t logits = c.input(logitsShape, 3.0);
  int64_t labels = c.ids(rows, 40);
  c.lastInput().data<int32_t>()[2] = -100;
  c.lastInput().data<int32_t>()[9] = -100;
  int64_t dScalar = c.input({});
  int64_t dRows = c.input(rows);
  for (const char *reduction : {"mean", "sum", "none"}) {
    Json attrs = {{"reduction", reduction}};
    bool none = std::string(reduction) == "none";
    c.f.output(c.f.op("cross_entropy", {logits, labels},
                      none ? rows : std::vector<int64_t>{}, attrs));
    c.f.output(c.f.op("cross_entropy_grad",
                      {none ? dRows : dScalar, logits, labels}, logitsShape,
                      attrs));
  }
  c.check(kReduction);
}

// The cross-entropy on logits held in bf16 (a linear's result, read in bf16
// by the loss and its gradients) and gradients written in bf16 where only
// GEMMs read them: every reduction, ignored rows, the gradient paired with
// its forward (the saved logsumexps) and alone (recomputed), and one
// gradient written in fp32 from the bf16 logits (a function output).
TEST_F(CudaOpsTest, CrossEntropyOnBf16LogitsWithBf16Gradients) {
  c.precision = "bf16";
  std::vector<int64_t> rows = {2, 9}, act = {2, 9, 48},
                       logitsShape = {2, 9, 264};
  int64_t x = c.input(act), w = c.input({48, 264}, 0.3);
  int64_t labels = c.ids(rows, 264);
  c.lastInput().data<int32_t>()[3] = -100;
  c.lastInput().data<int32_t>()[10] = -100;
  int64_t dScalar = c.input({}), dRows = c.input(rows);
  int64_t logits = c.f.op("linear", {x, w}, logitsShape);
  auto intoGemms = [&](int64_t dlogits) {
    c.f.output(
        c.f.op("linear", {dlogits, w}, act, {{"transpose_weight", true}}));
    c.f.output(c.f.op("linear_weight_grad", {x, dlogits}, {48, 264}));
  };
  Json mean = {{"reduction", "mean"}}, sum = {{"reduction", "sum"}},
       none = {{"reduction", "none"}};
  c.f.output(c.f.op("cross_entropy", {logits, labels}, {}, mean));
  intoGemms(c.f.op("cross_entropy_grad", {dScalar, logits, labels}, logitsShape,
                   mean));
  c.f.output(c.f.op("cross_entropy", {logits, labels}, {}, sum));
  c.f.output(c.f.op("cross_entropy_grad", {dScalar, logits, labels},
                    logitsShape, sum));
  // The gradient before its forward: no pair, the logsumexps recomputed.
  intoGemms(
      c.f.op("cross_entropy_grad", {dRows, logits, labels}, logitsShape, none));
  c.f.output(c.f.op("cross_entropy", {logits, labels}, rows, none));
  c.bf16Values = 3; // the logits and the gradients of mean and none
  c.check(kBf16);
}

// fp32 logits (a function input) of a vocabulary of 251 (rows start off
// the 16-byte grid) with bf16 gradients read by GEMMs.
TEST_F(CudaOpsTest, CrossEntropyOddVocabularyWithBf16Gradients) {
  c.precision = "bf16";
  std::vector<int64_t> rows = {3, 5}, logitsShape = {3, 5, 251};
  int64_t logits = c.input(logitsShape, 3.0), x = c.input({3, 5, 40}),
          w = c.input({40, 251});
  int64_t labels = c.ids(rows, 251);
  c.lastInput().data<int32_t>()[7] = -100;
  int64_t dScalar = c.input({}), dRows = c.input(rows);
  for (const char *reduction : {"mean", "none"}) {
    Json attrs = {{"reduction", reduction}};
    bool perRow = std::string(reduction) == "none";
    c.f.output(c.f.op("cross_entropy", {logits, labels},
                      perRow ? rows : std::vector<int64_t>{}, attrs));
    int64_t dlogits =
        c.f.op("cross_entropy_grad", {perRow ? dRows : dScalar, logits, labels},
               logitsShape, attrs);
    c.f.output(c.f.op("linear", {dlogits, w}, {3, 5, 40},
                      {{"transpose_weight", true}}));
    c.f.output(c.f.op("linear_weight_grad", {x, dlogits}, {40, 251}));
  }
  c.bf16Values = 2;
  c.check(kBf16);
}

/// Rounds to bf16 (nearest even) and back, on the host.
float roundedToBf16(float value, uint16_t *bits) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  *bits = static_cast<uint16_t>(u >> 16);
  u = static_cast<uint32_t>(*bits) << 16;
  std::memcpy(&value, &u, sizeof(value));
  return value;
}

/// A device array of `count` T, freed at scope exit.
template <typename T> class DeviceArray {
public:
  explicit DeviceArray(size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void **>(&data_),
                         sizeof(T) * std::max<size_t>(count, 1)),
              cudaSuccess);
  }
  DeviceArray(const DeviceArray &) = delete;
  ~DeviceArray() { cudaFree(data_); }
  T *get() const { return data_; }
  template <typename U> void upload(const std::vector<U> &from) {
    static_assert(sizeof(U) == sizeof(T), "same element size");
    ASSERT_EQ(from.size(), count_);
    ASSERT_EQ(cudaMemcpy(data_, from.data(), sizeof(T) * count_,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  template <typename U> std::vector<U> download() const {
    static_assert(sizeof(U) == sizeof(T), "same element size");
    std::vector<U> to(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(to.data(), data_, sizeof(T) * count_,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return to;
  }

private:
  T *data_ = nullptr;
  size_t count_;
};

/// The largest |a - b| over the largest |b|.
double largestRelativeDifference(const std::vector<float> &a,
                                 const std::vector<float> &b) {
  double largestDifference = 0, largest = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    largestDifference =
        std::max(largestDifference, std::abs(static_cast<double>(a[i]) - b[i]));
    largest = std::max(largest, std::abs(static_cast<double>(b[i])));
  }
  return largest > 0 ? largestDifference / largest : largestDifference;
}

using host::LossReduction;

class CudaLossKernelTest : public CudaTest {
protected:
  /// Runs the cross-entropy launchers on bf16 logits of `rows` x `vocab`
  /// (the host's float kernels on the same values as the reference), with
  /// the gradient in G, paired (saved logsumexps) or not. Label `badRow`
  /// (if >= 0) is outside the vocabulary: the fault word gets the tag and
  /// that row gives zeros, as an ignored row does.
  template <typename G>
  void check(int64_t rows, int64_t vocab, LossReduction reduction, bool paired,
             int64_t badRow = -1) {
    SCOPED_TRACE("vocab " + std::to_string(vocab) + ", reduction " +
                 std::to_string(static_cast<int>(reduction)) +
                 (paired ? ", paired" : ", unpaired") +
                 (sizeof(G) == 2 ? ", bf16 gradient" : ", fp32 gradient"));
    size_t n = static_cast<size_t>(rows * vocab);
    host::Tensor random = randomTensor({rows, vocab}, 7 + vocab, 4.0);
    std::vector<float> logits(n);
    std::vector<uint16_t> logitsBf16(n);
    for (size_t i = 0; i < n; ++i)
      logits[i] = roundedToBf16(random.data<float>()[i], &logitsBf16[i]);
    host::Tensor labelTensor = randomIds({rows}, vocab, 3 + vocab);
    std::vector<int32_t> labels(labelTensor.data<int32_t>(),
                                labelTensor.data<int32_t>() + rows);
    labels[1] = -100;
    bool perRow = reduction == LossReduction::None;
    host::Tensor dlossTensor = randomTensor({perRow ? rows : 1}, 11);
    std::vector<float> dloss(dlossTensor.data<float>(),
                             dlossTensor.data<float>() +
                                 dlossTensor.numElements());
    size_t lossCount = perRow ? static_cast<size_t>(rows) : 1;
    std::vector<float> expectedLoss(lossCount), expectedGrad(n);
    host::ThreadPool pool(2);
    ASSERT_TRUE(host::crossEntropyForward(pool, rows, vocab, logits.data(),
                                          labels.data(), -100, reduction,
                                          expectedLoss.data())
                    .ok());
    ASSERT_TRUE(host::crossEntropyBackward(pool, rows, vocab, logits.data(),
                                           labels.data(), -100, reduction,
                                           dloss.data(), expectedGrad.data())
                    .ok());
    if (badRow >= 0)
      labels[static_cast<size_t>(badRow)] = static_cast<int32_t>(vocab + 3);

    DeviceArray<__nv_bfloat16> deviceLogits(n);
    DeviceArray<int32_t> deviceLabels(labels.size());
    DeviceArray<float> deviceDloss(dloss.size()), deviceLoss(lossCount);
    DeviceArray<G> deviceGrad(n);
    DeviceArray<char> scratch(cuda::crossEntropyScratchBytes(rows));
    DeviceArray<double> saved(static_cast<size_t>(rows));
    deviceLogits.upload(logitsBf16);
    deviceLabels.upload(labels);
    deviceDloss.upload(dloss);
    cudaStream_t stream = context->stream();
    unsigned *fault = context->fault();
    context->resetFault();
    cuda::crossEntropyForward(stream, rows, vocab, deviceLogits.get(),
                              deviceLabels.get(), -100, reduction,
                              deviceLoss.get(), scratch.get(),
                              paired ? saved.get() : nullptr, fault, 7u);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(context->readFault(), badRow >= 0 ? 7u : 0u);
    context->resetFault();
    cuda::crossEntropyBackward(
        stream, rows, vocab, deviceLogits.get(), deviceLabels.get(), -100,
        reduction, deviceDloss.get(), deviceGrad.get(), scratch.get(),
        paired ? saved.get() : nullptr, fault, 9u);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(context->readFault(), badRow >= 0 ? 9u : 0u);

    std::vector<float> loss = deviceLoss.download<float>(), grad(n);
    if constexpr (sizeof(G) == 2) {
      std::vector<uint16_t> bits = deviceGrad.template download<uint16_t>();
      for (size_t i = 0; i < n; ++i) {
        uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
        std::memcpy(&grad[i], &u, sizeof(u));
      }
    } else {
      grad = deviceGrad.template download<float>();
    }
    if (badRow >= 0) { // that row: zero loss and gradient
      for (int64_t v = 0; v < vocab; ++v)
        ASSERT_EQ(grad[static_cast<size_t>(badRow * vocab + v)], 0.0f) << v;
      if (perRow) {
        EXPECT_EQ(loss[static_cast<size_t>(badRow)], 0.0f);
      }
      return;
    }
    EXPECT_LE(largestRelativeDifference(loss, expectedLoss), 1e-6);
    // One rounding to bf16 (2^-9 of the element) over float's arithmetic.
    EXPECT_LE(largestRelativeDifference(grad, expectedGrad),
              sizeof(G) == 2 ? 4e-3 : 1e-5);
  }
};

// Widths below and over a chunk, rows starting anywhere on the 16-byte
// grid; every reduction; both gradient types, paired and not.
TEST_F(CudaLossKernelTest, CrossEntropyOnBf16LogitsOfOddWidths) {
  for (int64_t vocab : {5, 37, 1001, 8 * 515}) {
    for (LossReduction reduction :
         {LossReduction::Mean, LossReduction::Sum, LossReduction::None}) {
      check<__nv_bfloat16>(6, vocab, reduction, true);
      check<float>(6, vocab, reduction, reduction != LossReduction::Sum);
    }
    check<__nv_bfloat16>(5, vocab, LossReduction::Mean, false);
  }
}

// A label outside the vocabulary that reached the device (a bound device
// batch) sets the fault word to the launch's tag, in the forward and the
// backward, and its row gives zeros.
TEST_F(CudaLossKernelTest, CrossEntropyLabelOutsideTheVocabularySetsTheFault) {
  check<__nv_bfloat16>(6, 1001, LossReduction::None, true, 4);
  check<float>(6, 37, LossReduction::Mean, false, 2);
}

TEST_F(CudaOpsTest, TransposeSplitConcatAndReshape) {
  int64_t x = c.input({2, 3, 4, 5});
  c.f.output(c.f.op("transpose", {x}, {2, 4, 3, 5},
                    {{"permutation", {0, 2, 1, 3}}}));
  c.f.output(c.f.op("transpose", {x}, {5, 3, 2, 4},
                    {{"permutation", {3, 1, 0, 2}}}));
  int64_t y = c.input({2, 9, 4});
  int64_t p0 = c.f.value({2, 3, 4}), p1 = c.f.value({2, 5, 4}),
          p2 = c.f.value({2, 1, 4});
  c.f.inst("split", {y}, {p0, p1, p2}, {{"axis", 1}});
  c.f.output(p0);
  c.f.output(p1);
  c.f.output(p2);
  c.f.output(c.f.op("concat", {p2, p0, p1}, {2, 9, 4}, {{"axis", 1}}));
  c.f.output(c.f.op("concat", {y, y}, {2, 9, 8}, {{"axis", -1}}));
  c.f.output(c.f.op("reshape", {y}, {18, 4}));
  c.check(0);
}

// Elementwise ops, softmax, transpose, rope and embedding with bf16 values
// (Elementwise.cu, Rope.cu, Shape.cu, Embedding.cu): chains whose
// intermediate values every writer and reader takes in bf16, so that the
// plan holds them in bf16; inputs and outputs stay fp32, so each kernel
// meets fp32 and bf16 operands and results. Shapes of 1005 elements: groups
// of eight and a tail.
TEST_F(CudaOpsTest, ElementwiseAndSoftmaxWithBf16Values) {
  c.precision = "bf16";
  std::vector<int64_t> shape = {3, 5, 67};
  int64_t x = c.input(shape), y = c.input(shape), dy = c.input(shape),
          z = c.input(shape, 0.05);
  Json tanh = {{"approximate", "tanh"}}, erf = {{"approximate", "erf"}};
  int64_t g = c.f.op("gelu", {x}, shape, tanh);
  int64_t e = c.f.op("gelu", {y}, shape, erf);
  int64_t s = c.f.op("silu", {y}, shape);
  int64_t w = c.f.op("swiglu", {g, s}, shape);
  int64_t d = c.f.op("dropout", {w}, shape, {{"p", 0.2}, {"seed", 3}});
  int64_t a = c.f.op("add", {d, g}, shape);
  int64_t m = c.f.op("mul", {a, z}, shape); // |m| about 1 for the softmax
  int64_t sm = c.f.op("softmax", {m}, shape, {{"axis", -1}});
  c.f.output(c.f.op("transpose", {sm}, {67, 3, 5},
                    {{"permutation", {2, 0, 1}}}));
  int64_t gsm = c.f.op("softmax_grad", {dy, sm}, shape, {{"axis", -1}});
  c.f.output(c.f.op("gelu_grad", {gsm, x}, shape, erf));
  c.f.output(c.f.op("gelu_grad", {d, x}, shape, tanh));
  c.f.output(c.f.op("mul", {e, x}, shape));
  int64_t sg = c.f.op("silu_grad", {dy, s}, shape);
  int64_t dgate = c.f.value(shape), dup = c.f.value(shape);
  c.f.inst("swiglu_grad", {dy, g, s}, {dgate, dup});
  int64_t t = c.f.op("add", {dgate, dup}, shape);
  c.f.output(c.f.op("add", {t, sg}, shape));
  // g, e, s, w, d, a, m, sm, gsm, sg, dgate, dup, t
  c.bf16Values = 13;
  c.check(kBf16);
}

TEST_F(CudaOpsTest, RopeTransposeAndEmbeddingWithBf16Values) {
  c.precision = "bf16";
  std::vector<int64_t> shape = {2, 6, 3, 8};
  int64_t x = c.input(shape);
  Json attrs = {{"base", 10000.0}, {"rotary_dim", 6}};
  int64_t r = c.f.op("rope", {x}, shape, attrs);
  attrs["inverse"] = true;
  c.f.output(c.f.op("rope", {r}, shape, attrs));
  int64_t tr = c.f.op("transpose", {x}, {2, 3, 6, 8},
                      {{"permutation", {0, 2, 1, 3}}});
  c.f.output(c.f.op("transpose", {tr}, shape, {{"permutation", {0, 2, 1, 3}}}));
  int64_t table = c.input({50, 12});
  int64_t ids = c.ids({3, 7}, 50);
  int64_t dy = c.input({3, 7, 12});
  int64_t h = c.f.op("embedding", {table, ids}, {3, 7, 12});
  c.f.output(c.f.op("add", {h, dy}, {3, 7, 12}));
  int64_t q = c.f.op("dropout", {dy}, {3, 7, 12}, {{"p", 0.0}, {"seed", 1}});
  c.f.output(c.f.op("embedding_grad", {q, ids}, {50, 12}));
  c.bf16Values = 4; // r, tr, h, q
  c.check(kBf16);
}

// A fill read by an add, both in bf16 (0.375 is exact in bf16).
TEST_F(CudaOpsTest, FillWithABf16Value) {
  c.precision = "bf16";
  int64_t a = c.input({5, 7});
  int64_t f = c.f.op("fill", {}, {5, 7}, {{"value", 0.375}});
  c.f.output(c.f.op("add", {f, a}, {5, 7}));
  c.bf16Values = 1;
  c.check(kBf16);
}

// Runs of hundreds of equal ids (frequent tokens): the run's end found by
// the block together, its rows summed in batches; a row wider than a block
// (1100 columns: two passes of 1024 threads).
TEST_F(CudaOpsTest, EmbeddingGradientOverLongRunsOfEqualIds) {
  int64_t ids = c.ids({2, 600}, 3);
  int64_t dy = c.input({2, 600, 1100});
  c.f.output(c.f.op("embedding_grad", {dy, ids}, {3, 1100}));
  c.check(kReduction);
}

// get_parameter binds the store's value; accumulate_gradient adds into its
// gradient (twice here).
TEST_F(CudaOpsTest, ParametersAndGradientAccumulation) {
  c.parameter(parameterJson("w", {33, 45}));
  c.parameter(parameterJson("b", {45}, "zeros", 0, false));
  int64_t x = c.input({2, 7, 33}), dy = c.input({2, 7, 45});
  int64_t w = c.f.op("get_parameter", {}, {33, 45}, {{"parameter", 0}});
  int64_t b = c.f.op("get_parameter", {}, {45}, {{"parameter", 1}});
  c.f.output(c.f.op("linear", {x, w, b}, {2, 7, 45}));
  int64_t dw = c.f.op("linear_weight_grad", {x, dy}, {33, 45});
  int64_t db = c.f.op("bias_grad", {dy}, {45});
  c.f.inst("accumulate_gradient", {dw}, {}, {{"parameter", 0}});
  c.f.inst("accumulate_gradient", {dw}, {}, {{"parameter", 0}});
  c.f.inst("accumulate_gradient", {db}, {}, {{"parameter", 1}});
  c.check(kReduction);
}

class CudaExecutorTest : public CudaTest {};

// The bigram model of the host tests, forward and backward, on both
// backends.
TEST_F(CudaExecutorTest, BigramTrainStepMatchesTheHost) {
  constexpr int64_t V = 64, H = 16, B = 3, S = 5;
  Bundle bundle =
      Bundle::parseManifest("bigram", bigramManifest(V, H, B, S).dump());
  host::ThreadPool pool(2);
  host::ParameterStore hostStore(bundle, DType::F32);
  hostStore.initialize(pool, 7);
  hostStore.zeroGradients(pool);
  cuda::ParameterStore deviceStore(bundle, *context);
  deviceStore.upload(hostStore);
  host::Tensor tokens = randomIds({B, S}, V, 1), labels = randomIds({B, S}, V, 2);
  std::vector<host::TensorView> inputs = {viewOf(tokens), viewOf(labels)};
  host::Executor hostExecutor(bundle, "train_step", hostStore, pool);
  cuda::Executor deviceExecutor(bundle, "train_step", deviceStore);
  host::Tensor expected = std::move(hostExecutor.run(inputs, {})[0]);
  host::Tensor actual = std::move(deviceExecutor.run(inputs, {})[0]);
  expectClose(actual, expected, 1e-6, "loss");
  for (size_t p = 0; p < hostStore.size(); ++p)
    expectClose(deviceStore.gradientToHost(p), hostStore.gradient(p), 1e-5,
                hostStore.info(p).name);
  EXPECT_GT(deviceExecutor.arenaBytes(), 0u);
}

// Bad token ids are caught on the host before upload, with the host
// executor's message.
TEST_F(CudaExecutorTest, TokenIdsOutsideTheVocabularyFailLikeTheHost) {
  constexpr int64_t V = 8, H = 4, B = 2, S = 3;
  Bundle bundle =
      Bundle::parseManifest("bigram", bigramManifest(V, H, B, S).dump());
  host::ThreadPool pool(1);
  host::ParameterStore hostStore(bundle, DType::F32);
  cuda::ParameterStore deviceStore(bundle, *context);
  std::vector<int32_t> tokens = {1, 5, 7, 0, 9, 2}, labels = {5, 7, 0, 3, 2, 2};
  std::vector<host::TensorView> inputs = {{DType::I32, {B, S}, tokens.data()},
                                          {DType::I32, {B, S}, labels.data()}};
  std::string hostMessage, deviceMessage;
  try {
    host::Executor(bundle, "train_step", hostStore, pool).run(inputs, {});
  } catch (const Error &e) {
    hostMessage = e.what();
  }
  cuda::Executor deviceExecutor(bundle, "train_step", deviceStore);
  expectError([&] { deviceExecutor.run(inputs, {}); }, MTRT_STATUS_OUT_OF_RANGE,
              {"id 9 at element 4", "outside [0, 8)"});
  try {
    deviceExecutor.run(inputs, {});
  } catch (const Error &e) {
    deviceMessage = e.what();
  }
  EXPECT_FALSE(hostMessage.empty());
  EXPECT_EQ(deviceMessage, hostMessage);
}

TEST_F(CudaExecutorTest, RejectsAStoreOfAnotherBundle) {
  Bundle a = Bundle::parseManifest("a", bigramManifest(8, 4, 2, 3).dump());
  Bundle b = Bundle::parseManifest("b", bigramManifest(8, 4, 2, 3).dump());
  cuda::ParameterStore store(a, *context);
  expectError([&] { cuda::Executor(b, "train_step", store); },
              MTRT_STATUS_INVALID_ARGUMENT, {"another bundle"});
  expectError([&] { cuda::Executor(a, "no_such_step", store); },
              MTRT_STATUS_NOT_FOUND, {"no function 'no_such_step'"});
}

// The distributed optimizer's norm on the device (squareHistogram): the
// squared mantissas of float(x * scale) by exponent, turned into the exact
// sum on the host, equal the host's exact sum of the same products, bit
// for bit, over many tiles, wide exponents and subnormals; an inf makes it
// nan.
TEST_F(CudaTest, SquareHistogramGivesTheHostsExactSum) {
  int64_t n = (int64_t(1) << 16) * 37 + 12345;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-60, 30);
  std::vector<float> x(static_cast<size_t>(n));
  for (float &v : x)
    v = std::ldexp(mantissa(rng), exponent(rng));
  x[7] = std::numeric_limits<float>::denorm_min();
  x[8] = 0.0f;
  float scale = 0.125f * 3.0f;
  std::vector<float> scaled(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    scaled[i] = x[i] * scale;
  train::ExactSquareSum host(false);
  host.addSquares(scaled.data(), n);

  cudaStream_t stream = context->stream();
  cuda::DeviceBuffer device(sizeof(float) * x.size(), "x");
  size_t bins = 2 * sizeof(uint64_t) * cuda::kSquareHistogramBins;
  cuda::DeviceBuffer histogram(bins, "the histogram");
  auto deviceSum = [&]() {
    MTRT_CUDA_CHECK(cudaMemcpyAsync(device.data(), x.data(), device.size(),
                                    cudaMemcpyHostToDevice, stream),
                    "uploading x");
    MTRT_CUDA_CHECK(cudaMemsetAsync(histogram.data(), 0, bins, stream),
                    "zeroing the histogram");
    // In two calls, as the optimizer adds piece by piece.
    MTRT_CUDA_CHECK_LAUNCH(cuda::squareHistogram(stream, n / 3,
                                                 device.as<float>(), scale,
                                                 histogram.as<uint64_t>()),
                           "squareHistogram");
    MTRT_CUDA_CHECK_LAUNCH(
        cuda::squareHistogram(stream, n - n / 3, device.as<float>() + n / 3,
                              scale, histogram.as<uint64_t>()),
        "squareHistogram");
    std::vector<uint64_t> words(bins / sizeof(uint64_t));
    MTRT_CUDA_CHECK(cudaMemcpyAsync(words.data(), histogram.data(), bins,
                                    cudaMemcpyDeviceToHost, stream),
                    "downloading the histogram");
    context->synchronize("the histogram");
    train::ExactSquareSum sum(false);
    sum.addFloatHistogram(words.data());
    return sum.value();
  };
  EXPECT_EQ(deviceSum(), host.value());
  x[n - 1] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(deviceSum()));
}

// Expert parallelism's blocks (Moe.cu's dispatch kernels): the rows sent
// to each expert-parallel rank, each row's expert on its destination, and
// the blocks combined back, from a routing with dropped slots (-1) and
// experts that no slot takes; 8 experts over 4 ranks, rows of 64 (the
// 4-element path) and 70 elements. Copies only: bit for bit.
TEST_F(CudaOpsTest, ExpertParallelBlocksEqualTheHostsBitForBit) {
  const int64_t tokens = 37, topk = 2, experts = 8, ranks = 4;
  const int64_t slots = tokens * topk;
  int64_t routing = c.ids({tokens, topk}, experts);
  int32_t *ids = c.lastInput().data<int32_t>();
  for (int64_t s = 0; s < slots; ++s)
    if (s % 7 == 3 || ids[s] == 5) // dropped slots; expert 5 takes none
      ids[s] = -1;
  Json attrs = {{"num_experts", experts}, {"expert_ranks", ranks}};
  c.f.output(c.f.op("moe_dispatch_experts", {routing}, {ranks * slots, 1},
                    attrs, "i32"));
  for (int64_t hidden : {64, 70}) {
    int64_t rows = c.input({slots, hidden});
    int64_t blocks = c.f.op("moe_dispatch_rows", {rows, routing},
                            {ranks * slots, hidden}, attrs);
    c.f.output(blocks);
    c.f.output(
        c.f.op("moe_combine_rows", {blocks, routing}, {slots, hidden}, attrs));
    int64_t received = c.input({ranks * slots, hidden});
    c.f.output(c.f.op("moe_combine_rows", {received, routing}, {slots, hidden},
                      attrs));
  }
  c.check(0);
}

} // namespace
