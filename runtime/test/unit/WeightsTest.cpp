// Tests of loading and saving Hugging Face-named safetensors weights
// (train/Weights.h): round trip, vocabulary padding, tied output layers,
// prefix-less names, buffers, and every rejection with its message.
#include "BundleTestBuilder.h"
#include "SafetensorsTestUtil.h"

#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/TrainFlags.h"
#include "train/Weights.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

using namespace mtrt;
using namespace mtrt::test;
using namespace mtrt::train;

namespace {

constexpr int64_t H = 4, S = 3, V = 6, VPad = 8;

/// A GPT-2-named bundle: vocabulary 6 padded to 8, hidden 4, 3 positions;
/// `untied` adds lm_head.weight. The function only reads the parameters:
/// these tests never run it.
Bundle gptBundle(bool untied = false, const std::string &name = "gpt.mtb") {
  Json parameters = {parameterJson("transformer.wte.weight", {VPad, H}),
                     parameterJson("transformer.wpe.weight", {S, H}),
                     parameterJson("transformer.ln_f.weight", {H}, "ones"),
                     parameterJson("transformer.ln_f.bias", {H}, "zeros")};
  if (untied)
    parameters.push_back(parameterJson("lm_head.weight", {VPad, H}));
  FunctionBuilder f("read_parameters");
  for (size_t i = 0; i < parameters.size(); ++i) {
    std::vector<int64_t> shape = parameters[i]["shape"];
    f.output(f.op("get_parameter", {}, shape, {{"parameter", i}}));
  }
  Json model = modelJson(V, H, S, 1, 1);
  model["padded_vocab_size"] = VPad;
  return Bundle::parseManifest(
      name, manifestJson(model, parameters, Json::array({f.build()})).dump());
}

/// A Llama-named bundle with an untied output layer.
Bundle llamaBundle() {
  Json parameters = {parameterJson("model.embed_tokens.weight", {VPad, H}),
                     parameterJson("model.norm.weight", {H}, "ones"),
                     parameterJson("lm_head.weight", {VPad, H})};
  FunctionBuilder f("read_parameters");
  for (size_t i = 0; i < parameters.size(); ++i) {
    std::vector<int64_t> shape = parameters[i]["shape"];
    f.output(f.op("get_parameter", {}, shape, {{"parameter", i}}));
  }
  Json model = modelJson(V, H, S, 1, 1);
  model["padded_vocab_size"] = VPad;
  return Bundle::parseManifest(
      "llama.mtb",
      manifestJson(model, parameters, Json::array({f.build()})).dump());
}

/// A tensor of a hand-made file: its dtype's name and its raw bytes.
struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

template <typename T> std::vector<uint8_t> bytesOf(const std::vector<T> &v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

RawTensor f32(std::string name, std::vector<int64_t> shape,
              const std::vector<float> &values) {
  return {std::move(name), "F32", std::move(shape), bytesOf(values)};
}

/// `n` distinct values: start, start + 0.125, ... (exact in every float
/// type used here).
std::vector<float> ramp(int64_t n, float start) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = start + 0.125f * static_cast<float>(i);
  return v;
}

SafetensorsFile fileWith(const std::vector<RawTensor> &tensors,
                         const std::string &name = "w.safetensors") {
  Json header = Json::object();
  std::vector<uint8_t> data;
  for (const RawTensor &t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype},
        {"shape", t.shape},
        {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  return SafetensorsFile::parse(name, fileOf(header.dump(), data));
}

/// Every parameter of gptBundle() with distinct values; the vocabulary
/// table with `rows` rows.
std::vector<RawTensor> gptTensors(int64_t rows = V,
                                  const std::string &prefix = "transformer.") {
  return {f32(prefix + "wte.weight", {rows, H}, ramp(rows * H, 1)),
          f32(prefix + "wpe.weight", {S, H}, ramp(S * H, -3)),
          f32(prefix + "ln_f.weight", {H}, ramp(H, 0.5)),
          f32(prefix + "ln_f.bias", {H}, ramp(H, -0.5))};
}

std::vector<double> valuesOf(const host::ParameterStore &store, size_t i) {
  const host::Tensor &t = store.value(i);
  std::vector<double> v;
  for (int64_t k = 0; k < t.numElements(); ++k)
    v.push_back(t.dtype == DType::F64 ? t.data<double>()[k]
                                      : t.data<float>()[k]);
  return v;
}

std::vector<double> asDouble(const std::vector<float> &v) {
  return std::vector<double>(v.begin(), v.end());
}

class WeightsTest : public ::testing::Test {
protected:
  host::ThreadPool pool{2};
};

TEST_F(WeightsTest, RoundTripThroughAFile) {
  for (DType type : {DType::F32, DType::F64}) {
    Bundle bundle = gptBundle(/*untied=*/true);
    host::ParameterStore saved(bundle, type), loaded(bundle, type);
    saved.initialize(pool, 1);
    loaded.initialize(pool, 2);
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    std::string path = dir.file("w.safetensors");
    saveWeights(path, bundle, saved);

    SafetensorsFile file = SafetensorsFile::open(path);
    EXPECT_EQ(file.metadata(),
              (std::map<std::string, std::string>{
                  {"format", "pt"}, {"producer", "megatron-train"}}));
    EXPECT_EQ(file.names(),
              (std::vector<std::string>{
                  "lm_head.weight", "transformer.ln_f.bias",
                  "transformer.ln_f.weight", "transformer.wpe.weight",
                  "transformer.wte.weight"}));
    for (const SafetensorsTensor &t : file.tensors())
      EXPECT_EQ(t.dtype, SafetensorsDType::F32) << t.name;
    // The vocabulary tables lose their padding rows; the rest keep shape.
    EXPECT_EQ(file.tensor("transformer.wte.weight").shape,
              (std::vector<int64_t>{V, H}));
    EXPECT_EQ(file.tensor("lm_head.weight").shape,
              (std::vector<int64_t>{V, H}));
    EXPECT_EQ(file.tensor("transformer.wpe.weight").shape,
              (std::vector<int64_t>{S, H}));

    std::vector<std::vector<double>> before;
    for (size_t i = 0; i < loaded.size(); ++i)
      before.push_back(valuesOf(loaded, i));
    WeightsLoadReport report = loadWeights(file, bundle, loaded);
    EXPECT_EQ(report.parameters, 5u);
    EXPECT_EQ(report.padded, 2u);
    EXPECT_EQ(report.ignored, 0u);
    for (size_t i = 0; i < saved.size(); ++i) {
      std::vector<double> want = valuesOf(saved, i), got = valuesOf(loaded, i);
      if (type == DType::F64) // saved as f32
        for (double &x : want)
          x = static_cast<float>(x);
      if (isVocabularyTable(saved.info(i).name)) {
        // Rows past vocab_size never went through the file.
        for (size_t k = 0; k < want.size(); ++k)
          EXPECT_EQ(got[k],
                    static_cast<int64_t>(k) < V * H ? want[k] : before[i][k])
              << saved.info(i).name << "[" << k << "]";
      } else {
        EXPECT_EQ(got, want) << saved.info(i).name;
      }
    }
  }
}

/// GPT-2's fused c_attn: Hugging Face's [q | k | v] columns are stored per
/// query group in the bundle and written back in Hugging Face's order. With
/// 4 heads in 2 groups and a head dimension of 1, file columns q0 q1 q2 q3
/// k0 k1 v0 v1 become q0 q1 k0 v0 q2 q3 k1 v1.
TEST_F(WeightsTest, FusedQkvIsStoredPerQueryGroup) {
  constexpr int64_t In = 2, Columns = 8;
  Json parameters = {
      parameterJson("transformer.h.0.attn.c_attn.weight", {In, Columns}),
      parameterJson("transformer.h.0.attn.c_attn.bias", {Columns}, "zeros")};
  FunctionBuilder f("read_parameters");
  f.output(f.op("get_parameter", {}, {In, Columns}, {{"parameter", 0}}));
  f.output(f.op("get_parameter", {}, {Columns}, {{"parameter", 1}}));
  Json model = modelJson(V, H, S, 1, 1);
  model["num_attention_heads"] = 4;
  model["num_query_groups"] = 2;
  Bundle bundle = Bundle::parseManifest(
      "qkv.mtb",
      manifestJson(model, parameters, Json::array({f.build()})).dump());
  std::vector<float> weight = ramp(In * Columns, 0), bias = ramp(Columns, 8);
  SafetensorsFile file =
      fileWith({f32("transformer.h.0.attn.c_attn.weight", {In, Columns}, weight),
                f32("transformer.h.0.attn.c_attn.bias", {Columns}, bias)});
  for (DType type : {DType::F32, DType::F64}) {
    host::ParameterStore store(bundle, type);
    store.initialize(pool, 1);
    loadWeights(file, bundle, store);
    const int64_t order[Columns] = {0, 1, 4, 6, 2, 3, 5, 7};
    std::vector<double> wantWeight, wantBias;
    for (int64_t row = 0; row < In; ++row)
      for (int64_t c : order)
        wantWeight.push_back(weight[row * Columns + c]);
    for (int64_t c : order)
      wantBias.push_back(bias[c]);
    EXPECT_EQ(valuesOf(store, 0), wantWeight);
    EXPECT_EQ(valuesOf(store, 1), wantBias);

    TempDir dir;
    ASSERT_TRUE(dir.ok());
    saveWeights(dir.file("w.safetensors"), bundle, store);
    SafetensorsFile saved = SafetensorsFile::open(dir.file("w.safetensors"));
    std::vector<double> savedWeight(In * Columns), savedBias(Columns);
    saved.convert(saved.tensor("transformer.h.0.attn.c_attn.weight"),
                  savedWeight.data());
    saved.convert(saved.tensor("transformer.h.0.attn.c_attn.bias"),
                  savedBias.data());
    EXPECT_EQ(savedWeight, asDouble(weight));
    EXPECT_EQ(savedBias, asDouble(bias));
  }
}

TEST_F(WeightsTest, WithoutAModelSectionEveryRowIsSaved) {
  Json parameters = {parameterJson("transformer.wte.weight", {VPad, H})};
  FunctionBuilder f("read_parameters");
  f.output(f.op("get_parameter", {}, {VPad, H}, {{"parameter", 0}}));
  Json manifest = manifestJson(Json(), parameters, Json::array({f.build()}));
  manifest.erase("model");
  Bundle bundle = Bundle::parseManifest("ir.mtb", manifest.dump());
  host::ParameterStore store(bundle);
  store.initialize(pool, 1);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  saveWeights(dir.file("w.safetensors"), bundle, store);
  EXPECT_EQ(SafetensorsFile::open(dir.file("w.safetensors"))
                .tensor("transformer.wte.weight")
                .shape,
            (std::vector<int64_t>{VPad, H}));
}

TEST_F(WeightsTest, PaddingRowsKeepTheirInitializedValues) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  store.initialize(pool, 7);
  std::vector<double> before = valuesOf(store, 0);
  WeightsLoadReport report =
      loadWeights(fileWith(gptTensors(V)), bundle, store);
  EXPECT_EQ(report.padded, 1u);
  std::vector<double> after = valuesOf(store, 0);
  std::vector<double> rows = asDouble(ramp(V * H, 1));
  for (int64_t k = 0; k < VPad * H; ++k)
    EXPECT_EQ(after[k], k < V * H ? rows[k] : before[k]) << k;
  EXPECT_NE(before[V * H], 0.0); // the padding rows were initialized
  EXPECT_EQ(valuesOf(store, 1), asDouble(ramp(S * H, -3)));

  // A full padded table is copied whole.
  loadWeights(fileWith(gptTensors(VPad)), bundle, store);
  EXPECT_EQ(valuesOf(store, 0), asDouble(ramp(VPad * H, 1)));
}

TEST_F(WeightsTest, VocabularyLargerThanThePaddedOneIsRejected) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  EXPECT_MTRT_ERROR(
      loadWeights(fileWith(gptTensors(VPad + 1)), bundle, store),
      MTRT_STATUS_INVALID_ARGUMENT,
      "'w.safetensors': tensor 'transformer.wte.weight' is [9, 4] but "
      "parameter 'transformer.wte.weight' of bundle 'gpt.mtb' is [8, 4]: the "
      "file's vocabulary has 9 rows, more than the bundle's padded "
      "vocabulary of 8; compile the model with --vocab-size 9");
}

TEST_F(WeightsTest, VocabularySmallerThanTheModelsIsRejected) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  EXPECT_MTRT_ERROR(
      loadWeights(fileWith(gptTensors(V - 1)), bundle, store),
      MTRT_STATUS_INVALID_ARGUMENT,
      "'w.safetensors': tensor 'transformer.wte.weight' is [5, 4] but "
      "parameter 'transformer.wte.weight' of bundle 'gpt.mtb' is [8, 4]: the "
      "file's vocabulary has 5 rows, fewer than the model's vocab_size of 6; "
      "compile the model with --vocab-size 5, or load weights of a 6-token "
      "vocabulary");
}

TEST_F(WeightsTest, UntiedOutputLayerIsPaddedToo) {
  Bundle bundle = llamaBundle();
  host::ParameterStore store(bundle);
  store.initialize(pool, 3);
  std::vector<double> before = valuesOf(store, 2);
  WeightsLoadReport report = loadWeights(
      fileWith(
          {f32("model.embed_tokens.weight", {V, H}, ramp(V * H, 1)),
           f32("model.norm.weight", {H}, ramp(H, 2)),
           f32("lm_head.weight", {V, H}, ramp(V * H, -1)),
           f32("model.layers.0.self_attn.rotary_emb.inv_freq", {2}, {1, 0.5})}),
      bundle, store);
  EXPECT_EQ(report.parameters, 3u);
  EXPECT_EQ(report.padded, 2u);
  EXPECT_EQ(report.ignored, 1u); // inv_freq
  std::vector<double> head = valuesOf(store, 2),
                      rows = asDouble(ramp(V * H, -1));
  for (int64_t k = 0; k < VPad * H; ++k)
    EXPECT_EQ(head[k], k < V * H ? rows[k] : before[k]) << k;
}

TEST_F(WeightsTest, TiedOutputLayerEqualToTheEmbeddingIsAccepted) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  std::vector<RawTensor> tensors = gptTensors();
  tensors.push_back(f32("lm_head.weight", {V, H}, ramp(V * H, 1)));
  WeightsLoadReport report = loadWeights(fileWith(tensors), bundle, store);
  EXPECT_EQ(report.parameters, 4u);
  EXPECT_EQ(report.ignored, 1u);
}

TEST_F(WeightsTest, TiedOutputLayerThatDiffersIsRejected) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  std::vector<RawTensor> tensors = gptTensors();
  std::vector<float> head = ramp(V * H, 1);
  head[5] = 42;
  tensors.push_back(f32("lm_head.weight", {V, H}, head));
  EXPECT_MTRT_ERROR(
      loadWeights(fileWith(tensors), bundle, store),
      MTRT_STATUS_INVALID_ARGUMENT,
      "'w.safetensors': tensor 'lm_head.weight' differs from "
      "'transformer.wte.weight' (transformer.wte.weight) at [1, 1]: 42 vs "
      "1.625; the file has untied weights, but bundle 'gpt.mtb' ties the "
      "output layer to the embedding: compile the model with "
      "--untie-embeddings-and-output-weights");

  tensors.back() = f32("lm_head.weight", {VPad, H}, ramp(VPad * H, 1));
  EXPECT_MTRT_ERROR(
      loadWeights(fileWith(tensors), bundle, store),
      MTRT_STATUS_INVALID_ARGUMENT,
      "'w.safetensors': tensor 'lm_head.weight' is [8, 4] and tensor "
      "'transformer.wte.weight' is [6, 4]: the file has untied weights, but "
      "bundle 'gpt.mtb' ties the output layer to the embedding: compile the "
      "model with --untie-embeddings-and-output-weights");
}

TEST_F(WeightsTest, UntiedBundleNeedsTheOutputLayer) {
  Bundle bundle = gptBundle(/*untied=*/true);
  host::ParameterStore store(bundle);
  EXPECT_MTRT_ERROR(
      loadWeights(fileWith(gptTensors()), bundle, store),
      MTRT_STATUS_INVALID_ARGUMENT,
      "'w.safetensors': no tensor for parameter 'lm_head.weight' [8, 4] of "
      "bundle 'gpt.mtb' (1 of 5 parameters missing); the file's model ties "
      "its output layer to the embedding (Hugging Face then leaves "
      "lm_head.weight out): compile the model without "
      "--untie-embeddings-and-output-weights");
}

TEST_F(WeightsTest, Gpt2ModelNamesWithoutThePrefixAreMapped) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  std::vector<RawTensor> tensors = gptTensors(V, "");
  // GPT2Model's causal-mask buffers, prefix-less too.
  tensors.push_back(
      {"h.0.attn.bias", "BOOL", {1, 1, S, S}, std::vector<uint8_t>(S * S, 1)});
  tensors.push_back(f32("h.0.attn.masked_bias", {}, {-1e4f}));
  WeightsLoadReport report = loadWeights(fileWith(tensors), bundle, store);
  EXPECT_EQ(report.parameters, 4u);
  EXPECT_EQ(report.ignored, 2u);
  EXPECT_EQ(valuesOf(store, 2), asDouble(ramp(H, 0.5)));
  EXPECT_EQ(valuesOf(store, 3), asDouble(ramp(H, -0.5)));
}

TEST_F(WeightsTest, KnownBuffers) {
  EXPECT_TRUE(isKnownBuffer("transformer.h.0.attn.bias"));
  EXPECT_TRUE(isKnownBuffer("transformer.h.11.attn.masked_bias"));
  EXPECT_TRUE(isKnownBuffer("model.layers.31.self_attn.rotary_emb.inv_freq"));
  EXPECT_FALSE(isKnownBuffer("transformer.h.0.attn.c_attn.bias"));
  EXPECT_FALSE(isKnownBuffer("transformer.h..attn.bias"));
  EXPECT_FALSE(isKnownBuffer("transformer.h.x.attn.bias"));
  EXPECT_FALSE(isKnownBuffer("model.layers.0.self_attn.q_proj.weight"));
}

TEST_F(WeightsTest, TwoNamesForOneParameterAreRejected) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  std::vector<RawTensor> tensors = gptTensors();
  tensors.push_back(f32("wpe.weight", {S, H}, ramp(S * H, 0)));
  EXPECT_MTRT_ERROR(
      loadWeights(fileWith(tensors), bundle, store),
      MTRT_STATUS_INVALID_ARGUMENT,
      "'w.safetensors': tensors 'transformer.wpe.weight' and "
      "'wpe.weight' both hold parameter 'transformer.wpe.weight'; "
      "keep one of them");
}

TEST_F(WeightsTest, ExtraTensorIsRejected) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  std::vector<RawTensor> tensors = gptTensors();
  tensors.push_back(f32("transformer.h.0.mlp.c_fc.weight", {H, 2}, ramp(8, 0)));
  EXPECT_MTRT_ERROR(
      loadWeights(fileWith(tensors), bundle, store),
      MTRT_STATUS_INVALID_ARGUMENT,
      "'w.safetensors': tensor 'transformer.h.0.mlp.c_fc.weight' ([4, 2] F32) "
      "is not a parameter of bundle 'gpt.mtb' (its parameters are "
      "'transformer.wte.weight', 'transformer.wpe.weight', ...); the file "
      "holds another model: load weights saved from the model the bundle "
      "was compiled from");
}

TEST_F(WeightsTest, MissingTensorsAreRejected) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  std::vector<RawTensor> tensors = gptTensors();
  tensors.erase(tensors.begin() + 1, tensors.end());
  EXPECT_MTRT_ERROR(
      loadWeights(fileWith(tensors), bundle, store),
      MTRT_STATUS_INVALID_ARGUMENT,
      "'w.safetensors': no tensor for parameter 'transformer.wpe.weight' "
      "[3, 4] of bundle 'gpt.mtb' (3 of 4 parameters missing: also "
      "'transformer.ln_f.weight', 'transformer.ln_f.bias'); the file must "
      "hold every parameter: save it from a model of the bundle's "
      "architecture (layers, biases, tied or untied output layer)");
}

TEST_F(WeightsTest, ShapeMismatchIsRejected) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  std::vector<RawTensor> tensors = gptTensors(V, "");
  tensors[1] = f32("wpe.weight", {S, H + 1}, ramp(S * (H + 1), 0));
  EXPECT_MTRT_ERROR(
      loadWeights(fileWith(tensors), bundle, store),
      MTRT_STATUS_INVALID_ARGUMENT,
      "'w.safetensors': tensor 'wpe.weight' (read as "
      "'transformer.wpe.weight') is [3, 5] but parameter "
      "'transformer.wpe.weight' of bundle 'gpt.mtb' is [3, 4]; compile the "
      "model with the sizes the weights were trained with (megatron-compile "
      "--hidden-size, --ffn-hidden-size, --num-attention-heads, "
      "--num-query-groups, --max-position-embeddings, ...)");
  // Rank counts too, and only the vocabulary tables may be shorter.
  tensors[1] = f32("wpe.weight", {S * H}, ramp(S * H, 0));
  expectError([&] { loadWeights(fileWith(tensors), bundle, store); },
              MTRT_STATUS_INVALID_ARGUMENT, {"is [12] but parameter"});
  tensors[1] = f32("wpe.weight", {S - 1, H}, ramp((S - 1) * H, 0));
  expectError([&] { loadWeights(fileWith(tensors), bundle, store); },
              MTRT_STATUS_INVALID_ARGUMENT, {"is [2, 4] but parameter"});
}

TEST_F(WeightsTest, NonFloatDtypeIsRejected) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  std::vector<RawTensor> tensors = gptTensors();
  tensors[2] = {"transformer.ln_f.weight",
                "I32",
                {H},
                bytesOf(std::vector<int32_t>{1, 1, 1, 1})};
  EXPECT_MTRT_ERROR(
      loadWeights(fileWith(tensors), bundle, store),
      MTRT_STATUS_INVALID_ARGUMENT,
      "'w.safetensors': tensor 'transformer.ln_f.weight' is I32, expected a "
      "floating-point type (F32, F64, BF16 or F16) for parameter "
      "'transformer.ln_f.weight'; convert the weights to float before saving "
      "them");
}

TEST_F(WeightsTest, StoreIsUnchangedWhenLoadingFails) {
  Bundle bundle = gptBundle();
  host::ParameterStore store(bundle);
  store.initialize(pool, 5);
  std::vector<std::vector<double>> before;
  for (size_t i = 0; i < store.size(); ++i)
    before.push_back(valuesOf(store, i));
  std::vector<RawTensor> tensors = gptTensors();
  tensors.push_back(f32("unexpected", {1}, {0}));
  EXPECT_THROW(loadWeights(fileWith(tensors), bundle, store), Error);
  for (size_t i = 0; i < store.size(); ++i)
    EXPECT_EQ(valuesOf(store, i), before[i]) << i;
}

TEST_F(WeightsTest, Bf16F16AndF64ValuesConvert) {
  Bundle bundle = gptBundle();
  // bf16 and f16 bit patterns of 1.5, -0.25, 3, 0.0078125.
  std::vector<uint16_t> bf16 = {0x3FC0, 0xBE80, 0x4040, 0x3C00};
  std::vector<uint16_t> f16 = {0x3E00, 0xB400, 0x4200, 0x2000};
  std::vector<double> expected = {1.5, -0.25, 3, 0.0078125};
  std::vector<double> f64Wpe(S * H);
  for (int64_t k = 0; k < S * H; ++k)
    f64Wpe[k] = 0.1 * static_cast<double>(k + 1); // not exact in f32
  std::vector<RawTensor> tensors = gptTensors();
  tensors[1] = {"transformer.wpe.weight", "F64", {S, H}, bytesOf(f64Wpe)};
  tensors[2] = {"transformer.ln_f.weight", "BF16", {H}, bytesOf(bf16)};
  tensors[3] = {"transformer.ln_f.bias", "F16", {H}, bytesOf(f16)};
  SafetensorsFile file = fileWith(tensors);
  for (DType type : {DType::F32, DType::F64}) {
    host::ParameterStore store(bundle, type);
    loadWeights(file, bundle, store);
    EXPECT_EQ(valuesOf(store, 2), expected);
    EXPECT_EQ(valuesOf(store, 3), expected);
    std::vector<double> wpe = valuesOf(store, 1);
    for (int64_t k = 0; k < S * H; ++k)
      EXPECT_EQ(wpe[k], type == DType::F64 ? f64Wpe[k]
                                           : static_cast<double>(
                                                 static_cast<float>(f64Wpe[k])))
          << k;
  }
}

TEST_F(WeightsTest, StoreOfAnotherBundleIsRejected) {
  Bundle a = gptBundle(false, "a.mtb"), b = gptBundle(false, "b.mtb");
  host::ParameterStore store(a);
  EXPECT_MTRT_ERROR(loadWeights(fileWith(gptTensors()), b, store),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    "loadWeights: the parameter store was made for another "
                    "bundle than 'b.mtb'");
}

/// gptBundle() over a grid of two ranks, the vocabulary table split by
/// rows (4 a rank: rank 1 holds rows 4 and 5 of the file and the two
/// padding rows), the rest replicated.
Bundle gptBundleOfTwoRanks() {
  Json wte = parameterJson("transformer.wte.weight", {VPad, H});
  wte["split_axes"] = {{0}, Json::array()};
  Json parameters = {wte, parameterJson("transformer.wpe.weight", {S, H}),
                     parameterJson("transformer.ln_f.weight", {H}, "ones"),
                     parameterJson("transformer.ln_f.bias", {H}, "zeros")};
  FunctionBuilder f("read_parameters");
  f.output(f.op("get_parameter", {}, {VPad / 2, H}, {{"parameter", 0}}));
  for (size_t i = 1; i < parameters.size(); ++i) {
    std::vector<int64_t> shape = parameters[i]["shape"];
    f.output(f.op("get_parameter", {}, shape, {{"parameter", i}}));
  }
  Json model = modelJson(V, H, S, 1, 1);
  model["padded_vocab_size"] = VPad;
  Json m = manifestJson(model, parameters, Json::array({f.build()}));
  m["grid"] = {{"shape", {2}}};
  return Bundle::parseManifest("gpt-2ranks.mtb", m.dump());
}

/// megatron-train --init-from with in-process ranks loads every rank's store
/// at once, a multi-process rank its own alone: each store gets its shard
/// of the file's tensors either way, and padding rows keep their values.
TEST_F(WeightsTest, EachRankGetsItsShardOfTheFilesTensors) {
  Bundle bundle = gptBundleOfTwoRanks();
  SafetensorsFile file = fileWith(gptTensors(V));
  std::vector<double> rows = asDouble(ramp(V * H, 1));
  for (bool together : {true, false}) {
    host::ParameterStore rank0(bundle, DType::F32, {0}),
        rank1(bundle, DType::F32, {1});
    rank0.initialize(pool, 7);
    rank1.initialize(pool, 7);
    std::vector<double> padding = valuesOf(rank1, 0);
    WeightsLoadReport report;
    if (together) {
      report = loadWeights(file, bundle, {&rank0, &rank1});
    } else {
      report = loadWeights(file, bundle, {&rank1});
      loadWeights(file, bundle, {&rank0});
    }
    EXPECT_EQ(report.parameters, 4u);
    EXPECT_EQ(report.padded, 1u);
    std::vector<double> shard0 = valuesOf(rank0, 0),
                        shard1 = valuesOf(rank1, 0);
    ASSERT_EQ(shard0.size(), static_cast<size_t>(VPad / 2 * H));
    for (int64_t k = 0; k < VPad / 2 * H; ++k) {
      EXPECT_EQ(shard0[k], rows[k]) << together << " " << k;
      int64_t global = VPad / 2 * H + k;
      EXPECT_EQ(shard1[k], global < V * H ? rows[global] : padding[k])
          << together << " " << k;
    }
    EXPECT_NE(padding.back(), 0.0); // the padding rows were initialized
    for (const host::ParameterStore *store : {&rank0, &rank1}) {
      EXPECT_EQ(valuesOf(*store, 1), asDouble(ramp(S * H, -3)));
      EXPECT_EQ(valuesOf(*store, 3), asDouble(ramp(H, -0.5)));
    }
  }
  // A store of one rank alone is not the whole tensor: the one-store
  // loadWeights refuses the bundle.
  host::ParameterStore alone(bundle, DType::F32, {0});
  EXPECT_MTRT_ERROR(loadWeights(file, bundle, alone), MTRT_STATUS_UNIMPLEMENTED,
                    "loadWeights: bundle 'gpt-2ranks.mtb' splits "
                    "parameters over ranks (transformer.wte.weight), so one "
                    "store holds a rank's shards, not the file's whole "
                    "tensors: call the loadWeights that takes the ranks' "
                    "stores");
}

/// --save-weights of a multi-process run: each rank calls saveWeights with
/// its own store; rank 0 receives rank 1's shard of the split table (not
/// the replicated tensors) and writes the file the stores together give.
/// Where rank 0 cannot write, every rank fails.
TEST_F(WeightsTest, EachRankSendsItsShardToTheRankThatWrites) {
  Bundle bundle = gptBundleOfTwoRanks();
  host::ParameterStore rank0(bundle, DType::F32, {0}),
      rank1(bundle, DType::F32, {1});
  rank0.initialize(pool, 7);
  rank1.initialize(pool, 7);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  saveWeights(dir.file("together.safetensors"), bundle, {&rank0, &rank1});
  auto bytes = [](const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  for (const std::string &name :
       {dir.file("ranks.safetensors"), dir.file("missing/w.safetensors")}) {
    comm::InProcessWorld world(2);
    std::vector<std::exception_ptr> errors =
        comm::runRanks(world, [&](comm::Communicator &c) {
          comm::RankContext rank(c, {2});
          saveWeights(name, bundle, &rank, c.rank() == 0 ? rank0 : rank1);
        });
    bool writable = name == dir.file("ranks.safetensors");
    const char *expected[2] = {"cannot create the temporary file",
                               "rank 0 could not write --save-weights"};
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(errors[r] == nullptr, writable) << name << " rank " << r;
      if (errors[r])
        try {
          std::rethrow_exception(errors[r]);
        } catch (const std::exception &e) {
          EXPECT_NE(std::string(e.what()).find(expected[r]), std::string::npos)
              << e.what();
        }
    }
  }
  EXPECT_EQ(bytes(dir.file("ranks.safetensors")),
            bytes(dir.file("together.safetensors")));
}

TEST(WeightsFlagsTest, MegatronTrainTakesWeightFiles) {
  TrainCommand c = parseTrainCommand(
      {"b.mtb", "--data-path", "c.txt", "--train-iters", "1", "--lr", "1e-3",
       "--init-from", "in.safetensors", "--save-weights=out.safetensors"});
  EXPECT_EQ(c.initFrom, "in.safetensors");
  EXPECT_EQ(c.saveWeights, "out.safetensors");
  EXPECT_MTRT_ERROR(
      parseTrainCommand({"b.mtb", "--data-path", "c.txt", "--train-iters", "1",
                         "--lr", "1e-3", "--init-from="}),
      MTRT_STATUS_INVALID_ARGUMENT,
      "--init-from: expected the path of a .safetensors file");
  EXPECT_NE(trainUsage().find("--save-weights FILE"), std::string::npos);
}

} // namespace
