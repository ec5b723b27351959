// A one-block GPT-2 written as a bundle by hand: its loss against a float64
// reference, its gradients against finite differences.
#include "ExecutorTestSupport.h"

using namespace mtrt;
using namespace mtrt::host;
using namespace mtrt::test;

namespace {

constexpr int64_t V = 11, H = 8, NH = 2, HD = 4, F = 16, B = 2, S = 5;

enum Param {
  WTE,
  WPE,
  LN1_W,
  LN1_B,
  W_QKV,
  B_QKV,
  W_O,
  B_O,
  LN2_W,
  LN2_B,
  W_FC,
  B_FC,
  W_PROJ,
  B_PROJ,
  LNF_W,
  LNF_B,
  NUM_PARAMS
};

Json gptParameters() {
  struct P {
    const char *name;
    std::vector<int64_t> shape;
  } ps[] = {{"transformer.wte.weight", {V, H}},
            {"transformer.wpe.weight", {S, H}},
            {"transformer.h.0.ln_1.weight", {H}},
            {"transformer.h.0.ln_1.bias", {H}},
            {"transformer.h.0.attn.c_attn.weight", {H, 3 * H}},
            {"transformer.h.0.attn.c_attn.bias", {3 * H}},
            {"transformer.h.0.attn.c_proj.weight", {H, H}},
            {"transformer.h.0.attn.c_proj.bias", {H}},
            {"transformer.h.0.ln_2.weight", {H}},
            {"transformer.h.0.ln_2.bias", {H}},
            {"transformer.h.0.mlp.c_fc.weight", {H, F}},
            {"transformer.h.0.mlp.c_fc.bias", {F}},
            {"transformer.h.0.mlp.c_proj.weight", {F, H}},
            {"transformer.h.0.mlp.c_proj.bias", {H}},
            {"transformer.ln_f.weight", {H}},
            {"transformer.ln_f.bias", {H}}};
  Json out = Json::array();
  for (const P &p : ps)
    out.push_back(parameterJson(p.name, p.shape));
  return out;
}

/// train_step of GPT-2 with one block (learned positions, pre-norm, tanh
/// GELU, tied output layer), backward written as autodiff would emit it.
Json gptManifest() {
  FunctionBuilder f("train_step");
  int64_t tokens = f.input({B, S});
  int64_t labels = f.input({B, S});
  std::vector<int64_t> p(NUM_PARAMS);
  Json params = gptParameters();
  for (int i = 0; i < NUM_PARAMS; ++i)
    p[i] = f.op("get_parameter", {},
                params[i]["shape"].get<std::vector<int64_t>>(),
                {{"parameter", i}});
  Json eps = {{"epsilon", 1e-5}};
  Json tw = {{"transpose_weight", true}};
  Json tanh = {{"approximate", "tanh"}};
  Json causal = {{"causal", true}};
  Json ce = {{"reduction", "mean"}};
  const std::vector<int64_t> bsh = {B, S, H}, heads = {B, S, NH, HD};

  int64_t pos = f.op("position_ids", {}, {B, S}, {}, "i32");
  int64_t te = f.op("embedding", {p[WTE], tokens}, bsh);
  int64_t pe = f.op("embedding", {p[WPE], pos}, bsh);
  int64_t x0 = f.op("add", {te, pe}, bsh);
  int64_t h1 = f.op("layer_norm", {x0, p[LN1_W], p[LN1_B]}, bsh, eps);
  int64_t qkv = f.op("linear", {h1, p[W_QKV], p[B_QKV]}, {B, S, 3 * H});
  int64_t q = f.value(bsh), k = f.value(bsh), v = f.value(bsh);
  f.inst("split", {qkv}, {q, k, v}, {{"axis", -1}});
  int64_t q4 = f.op("reshape", {q}, heads), k4 = f.op("reshape", {k}, heads),
          v4 = f.op("reshape", {v}, heads);
  int64_t o4 = f.op("attention", {q4, k4, v4}, heads, causal);
  int64_t o = f.op("reshape", {o4}, bsh);
  int64_t a = f.op("linear", {o, p[W_O], p[B_O]}, bsh);
  int64_t x1 = f.op("add", {x0, a}, bsh);
  int64_t h2 = f.op("layer_norm", {x1, p[LN2_W], p[LN2_B]}, bsh, eps);
  int64_t f1 = f.op("linear", {h2, p[W_FC], p[B_FC]}, {B, S, F});
  int64_t g = f.op("gelu", {f1}, {B, S, F}, tanh);
  int64_t f2 = f.op("linear", {g, p[W_PROJ], p[B_PROJ]}, bsh);
  int64_t x2 = f.op("add", {x1, f2}, bsh);
  int64_t hf = f.op("layer_norm", {x2, p[LNF_W], p[LNF_B]}, bsh, eps);
  int64_t logits = f.op("linear", {hf, p[WTE]}, {B, S, V}, tw);
  int64_t loss = f.op("cross_entropy", {logits, labels}, {}, ce);
  f.output(loss);

  int64_t one = f.op("fill", {}, {}, {{"value", 1.0}});
  int64_t dlogits =
      f.op("cross_entropy_grad", {one, logits, labels}, {B, S, V}, ce);
  int64_t dhf = f.op("linear", {dlogits, p[WTE]}, bsh);
  int64_t dwte1 = f.op("linear_weight_grad", {hf, dlogits}, {V, H}, tw);
  auto normGrad = [&](int64_t dy, int64_t x, int64_t w) {
    int64_t dx = f.value(bsh), dw = f.value({H}), db = f.value({H});
    f.inst("layer_norm_grad", {dy, x, w}, {dx, dw, db}, eps);
    return std::vector<int64_t>{dx, dw, db};
  };
  auto lnf = normGrad(dhf, x2, p[LNF_W]);
  int64_t dx2 = lnf[0];
  int64_t dg = f.op("linear", {dx2, p[W_PROJ]}, {B, S, F}, tw);
  int64_t dwproj = f.op("linear_weight_grad", {g, dx2}, {F, H});
  int64_t dbproj = f.op("bias_grad", {dx2}, {H});
  int64_t df1 = f.op("gelu_grad", {dg, f1}, {B, S, F}, tanh);
  int64_t dh2 = f.op("linear", {df1, p[W_FC]}, bsh, tw);
  int64_t dwfc = f.op("linear_weight_grad", {h2, df1}, {H, F});
  int64_t dbfc = f.op("bias_grad", {df1}, {F});
  auto ln2 = normGrad(dh2, x1, p[LN2_W]);
  int64_t dx1 = f.op("add", {dx2, ln2[0]}, bsh);
  int64_t dout = f.op("linear", {dx1, p[W_O]}, bsh, tw);
  int64_t dwo = f.op("linear_weight_grad", {o, dx1}, {H, H});
  int64_t dbo = f.op("bias_grad", {dx1}, {H});
  int64_t do4 = f.op("reshape", {dout}, heads);
  int64_t dq4 = f.value(heads), dk4 = f.value(heads), dv4 = f.value(heads);
  f.inst("attention_grad", {do4, q4, k4, v4}, {dq4, dk4, dv4}, causal);
  int64_t dq = f.op("reshape", {dq4}, bsh), dk = f.op("reshape", {dk4}, bsh),
          dv = f.op("reshape", {dv4}, bsh);
  int64_t dqkv = f.op("concat", {dq, dk, dv}, {B, S, 3 * H}, {{"axis", 2}});
  int64_t dh1 = f.op("linear", {dqkv, p[W_QKV]}, bsh, tw);
  int64_t dwqkv = f.op("linear_weight_grad", {h1, dqkv}, {H, 3 * H});
  int64_t dbqkv = f.op("bias_grad", {dqkv}, {3 * H});
  auto ln1 = normGrad(dh1, x0, p[LN1_W]);
  int64_t dx0 = f.op("add", {dx1, ln1[0]}, bsh);
  int64_t dwte2 = f.op("embedding_grad", {dx0, tokens}, {V, H});
  int64_t dwpe = f.op("embedding_grad", {dx0, pos}, {S, H});

  std::pair<int, int64_t> accumulate[] = {
      {WTE, dwte1},    {WTE, dwte2},     {WPE, dwpe},      {LN1_W, ln1[1]},
      {LN1_B, ln1[2]}, {W_QKV, dwqkv},   {B_QKV, dbqkv},   {W_O, dwo},
      {B_O, dbo},      {LN2_W, ln2[1]},  {LN2_B, ln2[2]},  {W_FC, dwfc},
      {B_FC, dbfc},    {W_PROJ, dwproj}, {B_PROJ, dbproj}, {LNF_W, lnf[1]},
      {LNF_B, lnf[2]}};
  for (auto [param, grad] : accumulate)
    f.inst("accumulate_gradient", {grad}, {}, {{"parameter", param}});
  return manifestJson(modelJson(V, H, S, B, B), params,
                      Json::array({f.build()}));
}

//===----------------------------------------------------------------------===//
// The reference: GPT-2's forward in double, written from its definition.
//===----------------------------------------------------------------------===//

using Mat = std::vector<double>; // row-major [rows, cols]

Mat linear(const Mat &x, int64_t rows, int64_t in, int64_t out, const double *w,
           const double *bias, bool transposed) {
  Mat y(rows * out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < out; ++j) {
      double sum = bias ? bias[j] : 0;
      for (int64_t i = 0; i < in; ++i)
        sum += x[r * in + i] * (transposed ? w[j * in + i] : w[i * out + j]);
      y[r * out + j] = sum;
    }
  return y;
}

Mat layerNorm(const Mat &x, int64_t rows, const double *w, const double *b) {
  Mat y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < H; ++i)
      mean += x[r * H + i] / H;
    for (int64_t i = 0; i < H; ++i)
      var += (x[r * H + i] - mean) * (x[r * H + i] - mean) / H;
    for (int64_t i = 0; i < H; ++i)
      y[r * H + i] =
          (x[r * H + i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i];
  }
  return y;
}

double referenceLoss(ParameterStore &store, const std::vector<int32_t> &tokens,
                     const std::vector<int32_t> &labels) {
  auto P = [&](int i) { return store.value(i).data<double>(); };
  const int64_t R = B * S;
  Mat x(R * H);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < H; ++i)
      x[r * H + i] = P(WTE)[tokens[r] * H + i] + P(WPE)[(r % S) * H + i];
  Mat h = layerNorm(x, R, P(LN1_W), P(LN1_B));
  Mat qkv = linear(h, R, H, 3 * H, P(W_QKV), P(B_QKV), false);
  Mat att(R * H, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < NH; ++n)
      for (int64_t i = 0; i < S; ++i) {
        auto qAt = [&](int64_t t, int64_t part, int64_t d) {
          return qkv[(b * S + t) * 3 * H + part * H + n * HD + d];
        };
        std::vector<double> score(i + 1);
        double max = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < HD; ++d)
            dot += qAt(i, 0, d) * qAt(j, 1, d);
          score[j] = dot / std::sqrt(double(HD));
          max = std::max(max, score[j]);
        }
        for (int64_t j = 0; j <= i; ++j)
          sum += std::exp(score[j] - max);
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t d = 0; d < HD; ++d)
            att[(b * S + i) * H + n * HD + d] +=
                std::exp(score[j] - max) / sum * qAt(j, 2, d);
      }
  Mat a = linear(att, R, H, H, P(W_O), P(B_O), false);
  for (int64_t i = 0; i < R * H; ++i)
    x[i] += a[i];
  Mat f1 = linear(layerNorm(x, R, P(LN2_W), P(LN2_B)), R, H, F, P(W_FC),
                  P(B_FC), false);
  for (double &v : f1)
    v = 0.5 * v *
        (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  Mat f2 = linear(f1, R, F, H, P(W_PROJ), P(B_PROJ), false);
  for (int64_t i = 0; i < R * H; ++i)
    x[i] += f2[i];
  Mat logits = linear(layerNorm(x, R, P(LNF_W), P(LNF_B)), R, H, V, P(WTE),
                      nullptr, true);
  double loss = 0;
  for (int64_t r = 0; r < R; ++r) {
    double max = -1e300, sum = 0;
    for (int64_t v = 0; v < V; ++v)
      max = std::max(max, logits[r * V + v]);
    for (int64_t v = 0; v < V; ++v)
      sum += std::exp(logits[r * V + v] - max);
    loss += (max + std::log(sum) - logits[r * V + labels[r]]) / R;
  }
  return loss;
}

std::vector<int32_t> tokens() { return {3, 1, 4, 1, 5, 9, 2, 6, 5, 3}; }
std::vector<int32_t> labels() { return {1, 4, 1, 5, 9, 2, 6, 5, 3, 5}; }

TEST(ExecutorGptTest, ForwardLossMatchesAFloat64Reference) {
  Bundle bundle = Bundle::parseManifest("gpt", gptManifest().dump());
  ThreadPool pool(2);
  ParameterStore store(bundle, DType::F64);
  setGenericValues(store, 0.5);
  Executor executor(bundle, "train_step", store, pool);
  std::vector<int32_t> t = tokens(), l = labels();
  double loss = lossOf(executor, t, l, B, S);
  double expected = referenceLoss(store, t, l);
  EXPECT_NEAR(loss, expected, 1e-9 * expected);
  EXPECT_GT(expected, 0.5); // not a degenerate model
}

TEST(ExecutorGptTest, GradientsMatchCentralDifferences) {
  checkGradients(gptManifest(), "train_step", B, S, tokens(), labels(), 0.5);
}

TEST(ExecutorGptTest, Float32MatchesFloat64) {
  Bundle bundle = Bundle::parseManifest("gpt", gptManifest().dump());
  ThreadPool pool(2);
  ParameterStore wide(bundle, DType::F64), narrow(bundle, DType::F32);
  setGenericValues(wide, 0.5);
  for (size_t p = 0; p < wide.size(); ++p)
    for (int64_t i = 0; i < wide.value(p).numElements(); ++i)
      narrow.value(p).data<float>()[i] =
          static_cast<float>(wide.value(p).data<double>()[i]);
  std::vector<int32_t> t = tokens(), l = labels();
  Executor e64(bundle, "train_step", wide, pool);
  Executor e32(bundle, "train_step", narrow, pool);
  double loss64 = lossOf(e64, t, l, B, S);
  double loss32 =
      e32.run({{DType::I32, {B, S}, t.data()}, {DType::I32, {B, S}, l.data()}},
              {3, 3})[0]
          .data<float>()[0];
  EXPECT_NEAR(loss32, loss64, 1e-5 * loss64);
}

} // namespace
