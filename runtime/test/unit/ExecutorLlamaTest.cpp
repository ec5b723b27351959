// A Llama-style block written as a bundle by hand (RMSNorm, RoPE, GQA, SwiGLU,
// explicit softmax attention, dropout): gradients against finite differences,
// dropout masks by step.
#include "ExecutorTestSupport.h"

#include "core/OpShapes.h"

using namespace mtrt;
using namespace mtrt::host;
using namespace mtrt::test;

namespace {

constexpr int64_t V = 9, H = 8, NH = 2, NKV = 1, HD = 4, F = 12, B = 2, S = 4;

enum Param { WTE, NORM1, WQ, WK, WV, NORM2, WG, WU, WD, WOUT, NUM_PARAMS };

/// "llama_step" (not an entry point, so any signature): inputs tokens and
/// labels, output a sum-reduced loss, every op of the Llama family and its
/// backward.
Json llamaManifest() {
  struct P {
    const char *name;
    std::vector<int64_t> shape;
  } ps[] = {{"model.embed_tokens.weight", {V, H}},
            {"model.layers.0.input_layernorm.weight", {H}},
            {"model.layers.0.self_attn.q_proj.weight", {H, H}},
            {"model.layers.0.self_attn.k_proj.weight", {NKV * HD, H}},
            {"model.layers.0.self_attn.v_proj.weight", {NKV * HD, H}},
            {"model.layers.0.post_attention_layernorm.weight", {H}},
            {"model.layers.0.mlp.gate_proj.weight", {F, H}},
            {"model.layers.0.mlp.up_proj.weight", {F, H}},
            {"model.layers.0.mlp.down_proj.weight", {H, F}},
            {"lm_head.weight", {V, H}}};
  Json params = Json::array();
  FunctionBuilder f("llama_step");
  int64_t tokens = f.input({B, S});
  int64_t labels = f.input({B, S});
  std::vector<int64_t> p;
  for (int i = 0; i < NUM_PARAMS; ++i) {
    params.push_back(parameterJson(ps[i].name, ps[i].shape));
    p.push_back(f.op("get_parameter", {}, ps[i].shape, {{"parameter", i}}));
  }
  Json eps = {{"epsilon", 1e-6}}, tw = {{"transpose_weight", true}};
  // The queries' rope with llama3 scaling: with head_dim 4 the wavelengths
  // are 2 pi (blended, between 8 / 2 and 8 / 1) and 200 pi (divided).
  Json rope = {{"base", 10000.0},
               {"scaling_factor", 4.0},
               {"low_freq_factor", 1.0},
               {"high_freq_factor", 2.0},
               {"original_max_positions", 8}};
  Json ropeK = {{"base", 10000.0}, {"rotary_dim", 2}};
  Json att = {{"causal", true}, {"scale", 0.3}};
  Json drop = {{"p", 0.25}, {"seed", 5}};
  Json swap = {{"permutation", {0, 2, 1, 3}}};
  const std::vector<int64_t> bsh = {B, S, H}, bsf = {B, S, F},
                             qh = {B, S, NH, HD}, kh = {B, S, NKV, HD},
                             th = {B, NH, S, HD}, ss = {B, NH, S, S};

  int64_t x0 = f.op("embedding", {p[WTE], tokens}, bsh);
  int64_t h = f.op("rms_norm", {x0, p[NORM1]}, bsh, eps);
  int64_t q = f.op("linear", {h, p[WQ]}, bsh, tw);
  int64_t k = f.op("linear", {h, p[WK]}, {B, S, NKV * HD}, tw);
  int64_t v = f.op("linear", {h, p[WV]}, {B, S, NKV * HD}, tw);
  int64_t qr = f.op("rope", {f.op("reshape", {q}, qh)}, qh, rope);
  int64_t kr = f.op("rope", {f.op("reshape", {k}, kh)}, kh, ropeK);
  int64_t v4 = f.op("reshape", {v}, kh);
  int64_t o4 = f.op("attention", {qr, kr, v4}, qh, att);
  // Self-attention of the queries by hand: matmul, softmax, matmul.
  int64_t qt = f.op("transpose", {qr}, th, swap);
  int64_t sc = f.op("matmul", {qt, qt}, ss, {{"transpose_rhs", true}});
  int64_t pr = f.op("softmax", {sc}, ss, {{"axis", -1}});
  int64_t ctx = f.op("matmul", {pr, qt}, th);
  int64_t ct = f.op("transpose", {ctx}, qh, swap);
  int64_t o = f.op("reshape", {f.op("add", {o4, ct}, qh)}, bsh);
  int64_t d = f.op("dropout", {o}, bsh, drop);
  int64_t x1 = f.op("add", {x0, d}, bsh);
  int64_t h2 = f.op("rms_norm", {x1, p[NORM2]}, bsh, eps);
  int64_t gate = f.op("linear", {h2, p[WG]}, bsf, tw);
  int64_t up = f.op("linear", {h2, p[WU]}, bsf, tw);
  int64_t y = f.op("swiglu", {gate, up}, bsf);
  int64_t sg = f.op("silu", {gate}, bsf);
  int64_t z = f.op("mul", {sg, up}, bsf);
  int64_t z2 = f.op("add", {y, z}, bsf);
  int64_t down = f.op("linear", {z2, p[WD]}, bsh, tw);
  int64_t x2 = f.op("add", {x1, down}, bsh);
  int64_t logits = f.op("linear", {x2, p[WOUT]}, {B, S, V}, tw);
  Json ce = {{"reduction", "sum"}, {"ignore_index", 7}};
  f.output(f.op("cross_entropy", {logits, labels}, {}, ce));

  int64_t one = f.op("fill", {}, {}, {{"value", 1.0}});
  int64_t dlogits =
      f.op("cross_entropy_grad", {one, logits, labels}, {B, S, V}, ce);
  int64_t dx2 = f.op("linear", {dlogits, p[WOUT]}, bsh);
  int64_t dwout = f.op("linear_weight_grad", {x2, dlogits}, {V, H}, tw);
  int64_t dz2 = f.op("linear", {dx2, p[WD]}, bsf);
  int64_t dwd = f.op("linear_weight_grad", {z2, dx2}, {H, F}, tw);
  int64_t dgate1 = f.value(bsf), dup1 = f.value(bsf);
  f.inst("swiglu_grad", {dz2, gate, up}, {dgate1, dup1});
  int64_t dsg = f.op("mul", {dz2, up}, bsf);
  int64_t dup2 = f.op("mul", {dz2, sg}, bsf);
  int64_t dgate2 = f.op("silu_grad", {dsg, gate}, bsf);
  int64_t dgate = f.op("add", {dgate1, dgate2}, bsf);
  int64_t dup = f.op("add", {dup1, dup2}, bsf);
  int64_t dh2 = f.op(
      "add",
      {f.op("linear", {dgate, p[WG]}, bsh), f.op("linear", {dup, p[WU]}, bsh)},
      bsh);
  int64_t dwg = f.op("linear_weight_grad", {h2, dgate}, {F, H}, tw);
  int64_t dwu = f.op("linear_weight_grad", {h2, dup}, {F, H}, tw);
  int64_t dx1b = f.value(bsh), dnorm2 = f.value({H});
  f.inst("rms_norm_grad", {dh2, x1, p[NORM2]}, {dx1b, dnorm2}, eps);
  int64_t dx1 = f.op("add", {dx2, dx1b}, bsh);
  int64_t dsum = f.op("reshape", {f.op("dropout", {dx1}, bsh, drop)}, qh);
  int64_t dctx = f.op("transpose", {dsum}, th, swap);
  int64_t dpr = f.op("matmul", {dctx, qt}, ss, {{"transpose_rhs", true}});
  int64_t dqt1 = f.op("matmul", {pr, dctx}, th, {{"transpose_lhs", true}});
  int64_t dsc = f.op("softmax_grad", {dpr, pr}, ss, {{"axis", 3}});
  int64_t dqt2 = f.op("matmul", {dsc, qt}, th);
  int64_t dqt3 = f.op("matmul", {dsc, qt}, th, {{"transpose_lhs", true}});
  int64_t dqt = f.op("add", {f.op("add", {dqt1, dqt2}, th), dqt3}, th);
  int64_t dqra = f.op("transpose", {dqt}, qh, swap);
  int64_t dqrb = f.value(qh), dkr = f.value(kh), dv4 = f.value(kh);
  f.inst("attention_grad", {dsum, qr, kr, v4}, {dqrb, dkr, dv4}, att);
  int64_t dqr = f.op("add", {dqra, dqrb}, qh);
  Json inverse = rope, inverseK = ropeK;
  inverse["inverse"] = inverseK["inverse"] = true;
  int64_t dq = f.op("reshape", {f.op("rope", {dqr}, qh, inverse)}, bsh);
  int64_t dk =
      f.op("reshape", {f.op("rope", {dkr}, kh, inverseK)}, {B, S, NKV * HD});
  int64_t dv = f.op("reshape", {dv4}, {B, S, NKV * HD});
  int64_t dh =
      f.op("add",
           {f.op("linear", {dq, p[WQ]}, bsh), f.op("linear", {dk, p[WK]}, bsh)},
           bsh);
  dh = f.op("add", {dh, f.op("linear", {dv, p[WV]}, bsh)}, bsh);
  int64_t dwq = f.op("linear_weight_grad", {h, dq}, {H, H}, tw);
  int64_t dwk = f.op("linear_weight_grad", {h, dk}, {NKV * HD, H}, tw);
  int64_t dwv = f.op("linear_weight_grad", {h, dv}, {NKV * HD, H}, tw);
  int64_t dx0b = f.value(bsh), dnorm1 = f.value({H});
  f.inst("rms_norm_grad", {dh, x0, p[NORM1]}, {dx0b, dnorm1}, eps);
  int64_t dx0 = f.op("add", {dx1, dx0b}, bsh);
  int64_t dwte = f.op("embedding_grad", {dx0, tokens}, {V, H});

  std::pair<int, int64_t> accumulate[] = {
      {WTE, dwte},     {NORM1, dnorm1}, {WQ, dwq}, {WK, dwk}, {WV, dwv},
      {NORM2, dnorm2}, {WG, dwg},       {WU, dwu}, {WD, dwd}, {WOUT, dwout}};
  for (auto [param, grad] : accumulate)
    f.inst("accumulate_gradient", {grad}, {}, {{"parameter", param}});
  return manifestJson(modelJson(V, H, S, B, B), params,
                      Json::array({f.build()}));
}

std::vector<int32_t> tokens() { return {2, 7, 1, 8, 2, 8, 1, 8}; }
// Label 7 is ignore_index: those rows contribute nothing.
std::vector<int32_t> labels() { return {7, 1, 8, 2, 8, 1, 8, 2}; }

TEST(ExecutorLlamaTest, GradientsMatchCentralDifferences) {
  checkGradients(llamaManifest(), "llama_step", B, S, tokens(), labels(), 0.4);
}

TEST(ExecutorLlamaTest, RopeScalingAttributesAreChecked) {
  auto withRope = [](Json attrs) {
    Json m = llamaManifest();
    for (Json &inst : m["functions"][0]["instructions"])
      if (inst["op"] == "rope")
        inst["attrs"] = attrs;
    return m;
  };
  auto expectRejected = [](const Json &m,
                           std::initializer_list<std::string> parts) {
    expectError([&] { Bundle::parseManifest("s.mtb", m.dump()); },
                MTRT_STATUS_INVALID_ARGUMENT, parts);
  };
  expectRejected(withRope({{"base", 10000.0}, {"low_freq_factor", 1.0}}),
                 {"attrs: found some of low_freq_factor, high_freq_factor and "
                  "original_max_positions",
                  "expected all three (llama3 scaling) or none"});
  expectRejected(withRope({{"base", 10000.0},
                           {"scaling_factor", 8.0},
                           {"low_freq_factor", 4.0},
                           {"high_freq_factor", 1.0},
                           {"original_max_positions", 8192}}),
                 {"attrs.high_freq_factor", "found 1.000000",
                  "expected a factor above low_freq_factor 4.000000"});
  expectRejected(withRope({{"base", 10000.0}, {"scaling_factor", 0.0}}),
                 {"attrs.scaling_factor", "expected a finite factor > 0"});

  // The manifest's queries' rope reaches the kernels as written.
  Bundle bundle = Bundle::parseManifest("llama", llamaManifest().dump());
  int ropes = 0;
  for (const Instruction &inst : bundle.functions()[0].instructions) {
    if (inst.op != Op::Rope || ropes++)
      continue;
    RopeFrequencies r = ropeFrequencies(inst.attrs);
    EXPECT_EQ(r.base, 10000.0);
    EXPECT_EQ(r.factor, 4.0);
    EXPECT_EQ(r.lowFreqFactor, 1.0);
    EXPECT_EQ(r.highFreqFactor, 2.0);
    EXPECT_EQ(r.originalMaxPositions, 8.0);
  }
  EXPECT_GT(ropes, 1);
}

TEST(ExecutorLlamaTest, DropoutMasksDependOnTheStepOnly) {
  Bundle bundle = Bundle::parseManifest("llama", llamaManifest().dump());
  ThreadPool pool(2);
  ParameterStore store(bundle, DType::F64);
  setGenericValues(store, 0.4);
  Executor executor(bundle, "llama_step", store, pool);
  std::vector<int32_t> t = tokens(), l = labels();
  auto loss = [&](uint64_t step) {
    return executor
        .run({{DType::I32, {B, S}, t.data()}, {DType::I32, {B, S}, l.data()}},
             {step, step})[0]
        .data<double>()[0];
  };
  double first = loss(0);
  EXPECT_EQ(loss(0), first);
  EXPECT_NE(loss(1), first);
  EXPECT_EQ(loss(1), loss(1));
  ThreadPool one(1);
  Executor serial(bundle, "llama_step", store, one);
  EXPECT_EQ(
      serial
          .run({{DType::I32, {B, S}, t.data()}, {DType::I32, {B, S}, l.data()}},
               {})[0]
          .data<double>()[0],
      first);
}

} // namespace
