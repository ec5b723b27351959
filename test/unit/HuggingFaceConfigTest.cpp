//===- HuggingFaceConfigTest.cpp - Units for reading HF config.json files -===//

#include "CompileConfigTestUtils.h"

using namespace megatron;
using namespace megatron::testing;

namespace {

//===----------------------------------------------------------------------===//
// Hugging Face config.json
//===----------------------------------------------------------------------===//

TEST(HuggingFaceConfigTest, Gpt2MapsLikeMegatron) {
  llvm::Expected<CompileConfig> hf =
      loadCompileConfig(modelPath("hf/gpt2-config.json"));
  ASSERT_TRUE(bool(hf)) << message(hf.takeError());
  const ModelConfig &m = hf->model;
  EXPECT_EQ(m.name, "gpt2");
  EXPECT_EQ(m.normalization, Normalization::LayerNorm);
  EXPECT_EQ(m.positionEmbeddingType, PositionEmbedding::LearnedAbsolute);
  EXPECT_EQ(m.activation, Activation::Gelu);
  EXPECT_TRUE(m.openaiGelu);
  EXPECT_TRUE(m.addBiasLinear);
  EXPECT_FALSE(m.untieEmbeddingsAndOutputWeights);
  EXPECT_EQ(m.vocabSize, 50257);
  EXPECT_EQ(hf->paddedVocabSize(), 50304);
  EXPECT_EQ(m.seqLength, 1024);
  EXPECT_EQ(m.maxPositions(), 1024);
  EXPECT_EQ(m.ffnSize(), 3072);
  EXPECT_EQ(m.normEpsilon, 1e-5);
  EXPECT_EQ(m.hiddenDropout, 0.1);
  EXPECT_EQ(hf->keyOrigins.lookup("num_attention_heads"),
            modelPath("hf/gpt2-config.json") + ":15:3");

  // The same model as the bundled YAML file.
  llvm::Expected<CompileConfig> yaml =
      loadCompileConfig(modelPath("gpt2-124m.yaml"));
  ASSERT_TRUE(bool(yaml)) << message(yaml.takeError());
  const ModelConfig &y = yaml->model;
  EXPECT_EQ(m.numLayers, y.numLayers);
  EXPECT_EQ(m.hiddenSize, y.hiddenSize);
  EXPECT_EQ(m.numAttentionHeads, y.numAttentionHeads);
  EXPECT_EQ(m.queryGroups(), y.queryGroups());
  EXPECT_EQ(m.openaiGelu, y.openaiGelu);
  EXPECT_EQ(m.attentionDropout, y.attentionDropout);
  EXPECT_EQ(m.initMethodStd, y.initMethodStd);

  CompileConfig exact = parse(R"({"model_type": "gpt2", "n_layer": 2,
      "n_embd": 64, "n_head": 4, "n_positions": 64, "vocab_size": 100,
      "activation_function": "gelu", "tie_word_embeddings": false,
      "n_inner": 100})",
                              "cfg/tiny/config.json");
  EXPECT_FALSE(exact.model.openaiGelu);
  EXPECT_TRUE(exact.model.untieEmbeddingsAndOutputWeights);
  EXPECT_EQ(exact.model.ffnSize(), 100);
  EXPECT_EQ(exact.model.seqLength, 64); // n_positions without n_ctx
  EXPECT_EQ(exact.model.name, "tiny");  // the directory of a config.json
}

TEST(HuggingFaceConfigTest, LlamaMapsLikeMegatron) {
  llvm::Expected<CompileConfig> hf =
      loadCompileConfig(modelPath("hf/llama-config.json"));
  ASSERT_TRUE(bool(hf)) << message(hf.takeError());
  llvm::Expected<CompileConfig> yaml =
      loadCompileConfig(modelPath("tiny-llama.yaml"));
  ASSERT_TRUE(bool(yaml)) << message(yaml.takeError());
  const ModelConfig &m = hf->model, &y = yaml->model;
  EXPECT_EQ(m.name, "llama");
  EXPECT_EQ(m.numLayers, y.numLayers);
  EXPECT_EQ(m.hiddenSize, y.hiddenSize);
  EXPECT_EQ(m.numAttentionHeads, y.numAttentionHeads);
  EXPECT_EQ(m.numQueryGroups, 2);
  EXPECT_EQ(m.ffnHiddenSize, y.ffnHiddenSize);
  EXPECT_EQ(m.seqLength, y.seqLength);
  EXPECT_EQ(m.maxPositions(), y.maxPositions());
  EXPECT_EQ(m.vocabSize, y.vocabSize);
  EXPECT_EQ(m.normalization, Normalization::RMSNorm);
  EXPECT_EQ(m.normEpsilon, y.normEpsilon);
  EXPECT_EQ(m.positionEmbeddingType, PositionEmbedding::Rope);
  EXPECT_EQ(m.rotaryBase, 10000.0);
  EXPECT_EQ(m.activation, Activation::Swiglu);
  EXPECT_FALSE(m.openaiGelu);
  EXPECT_FALSE(m.addBiasLinear);
  EXPECT_TRUE(m.untieEmbeddingsAndOutputWeights);
  EXPECT_EQ(m.hiddenDropout, 0.0);
  EXPECT_EQ(m.attentionDropout, 0.0);
  EXPECT_EQ(m.initMethodStd, y.initMethodStd);

  // Defaults: no num_key_value_heads means multi-head attention, and
  // LlamaConfig's rms_norm_eps default is 1e-6.
  CompileConfig bare = parse(R"({"model_type": "llama",
      "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "intermediate_size": 172, "vocab_size": 100,
      "max_position_embeddings": 64, "tie_word_embeddings": true})",
                             "llama.json");
  EXPECT_EQ(bare.model.queryGroups(), 4);
  EXPECT_EQ(bare.model.normEpsilon, 1e-6);
  EXPECT_FALSE(bare.model.untieEmbeddingsAndOutputWeights);
}

TEST(HuggingFaceConfigTest, RopeScalingOfBothTransformersForms) {
  // Llama 3.1's rope_scaling (transformers 4) and the same values in
  // rope_parameters (transformers 5) read alike.
  llvm::Expected<CompileConfig> v4 =
      loadCompileConfig(modelPath("hf/llama-3.2-1b-config.json"));
  ASSERT_TRUE(bool(v4)) << message(v4.takeError());
  llvm::Expected<CompileConfig> v5 =
      loadCompileConfig(modelPath("hf/llama-3.2-1b-v5-config.json"));
  ASSERT_TRUE(bool(v5)) << message(v5.takeError());
  for (const ModelConfig *m : {&v4->model, &v5->model}) {
    EXPECT_EQ(m->rotaryBase, 500000.0);
    EXPECT_EQ(m->ropeScaling, RopeScaling::Llama3);
    EXPECT_EQ(m->ropeScalingFactor, 32.0);
    EXPECT_EQ(m->ropeLowFreqFactor, 1.0);
    EXPECT_EQ(m->ropeHighFreqFactor, 4.0);
    EXPECT_EQ(m->ropeOriginalMaxPositions, 8192);
    EXPECT_FALSE(m->untieEmbeddingsAndOutputWeights);
  }

  // The legacy "type" spelling of transformers 4.36 and older, linear.
  CompileConfig linear = parse(R"({"model_type": "llama",
      "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "intermediate_size": 172, "vocab_size": 100,
      "max_position_embeddings": 64, "rope_theta": 20000.0,
      "rope_scaling": {"type": "linear", "factor": 2.0}})",
                               "llama.json");
  EXPECT_EQ(linear.model.rotaryBase, 20000.0);
  EXPECT_EQ(linear.model.ropeScaling, RopeScaling::Linear);
  EXPECT_EQ(linear.model.ropeScalingFactor, 2.0);

  // Mistral's null sliding_window (v0.2 on) is no window at all.
  CompileConfig mistral = parse(R"({"model_type": "mistral",
      "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "intermediate_size": 172, "vocab_size": 100,
      "max_position_embeddings": 64, "sliding_window": null})",
                                "mistral.json");
  EXPECT_EQ(mistral.model.slidingWindow, 0);
  EXPECT_EQ(mistral.model.ropeScaling, RopeScaling::None);
}

TEST(HuggingFaceConfigTest, Errors) {
  const std::pair<StringRef, StringRef> cases[] = {
      {"{\"model_type\": \"gemma\"}",
       "hf.json:1:2: model_type: unsupported model_type 'gemma'; "
       "supported: 'gpt2' (GPT2Config), 'llama' (LlamaConfig), 'mistral' "
       "(MistralConfig), 'qwen2' (Qwen2Config), 'qwen3' (Qwen3Config), "
       "'mixtral' (MixtralConfig) and 'qwen3_moe' (Qwen3MoeConfig)"},
      {"{\"n_layer\": 2}",
       "hf.json: no 'model_type' field, so this is not a Hugging Face "
       "config.json that can be read; supported: 'gpt2' (GPT2Config), "
       "'llama' (LlamaConfig), 'mistral' (MistralConfig), 'qwen2' "
       "(Qwen2Config), 'qwen3' (Qwen3Config), 'mixtral' (MixtralConfig) and "
       "'qwen3_moe' (Qwen3MoeConfig)"},
      {"{\"model_type\": \"gpt2\", \"n_layer\": 2,\n \"n_embd\": 64}",
       "hf.json: required field 'n_head' is missing (it gives "
       "num_attention_heads); every GPT2Config config.json has it"},
      {"{\"model_type\": \"gpt2\",\n  \"n_layer\": \"twelve\"}",
       "hf.json:2:3: n_layer: expected a positive integer, got "
       "'\"twelve\"'"},
      {"{\"model_type\": \"gpt2\",\n  \"n_layer\": 2.5}",
       "hf.json:2:3: n_layer: expected a positive integer, got '2.5'"},
      {"{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64,\n"
       "  \"n_head\": 4, \"vocab_size\": 9, \"n_positions\": 8,\n"
       "  \"activation_function\": \"relu\"}",
       "hf.json:3:3: activation_function: unsupported value 'relu'; "
       "supported: gelu_new, gelu_pytorch_tanh, gelu_fast (tanh GeLU, "
       "openai_gelu) and gelu (exact GeLU)"},
      {"{\"model_type\": \"llama\", \"num_hidden_layers\": 2,\n"
       "  \"hidden_size\": 64, \"num_attention_heads\": 4,\n"
       "  \"intermediate_size\": 172, \"vocab_size\": 100,\n"
       "  \"max_position_embeddings\": 64,\n"
       "  \"rope_scaling\": {\"rope_type\": \"llama3\"}}",
       "hf.json:5:20: rope_scaling.rope_type: rope_type llama3 needs a "
       "factor; add it"},
      {"{\"model_type\": \"llama\", \"num_hidden_layers\": 2,\n"
       "  \"hidden_size\": 64, \"num_attention_heads\": 4,\n"
       "  \"intermediate_size\": 172, \"vocab_size\": 100,\n"
       "  \"max_position_embeddings\": 64, \"hidden_act\": \"gelu\"}",
       "hf.json:4:34: hidden_act: unsupported value \"gelu\": LlamaConfig is "
       "read as SwiGLU, which needs hidden_act \"silu\""},
      {"{\"model_type\": \"gpt2\",\n  \"n_layer\": 12,,}",
       "hf.json:2:17: invalid JSON: Expected object key"},
      {"[1, 2]", "hf.json: expected a JSON object (a Hugging Face "
                 "config.json), got [1,2]"},
  };
  for (auto [text, expected] : cases)
    EXPECT_EQ(message(parseCompileConfig(text, "hf.json")), expected);
}

} // namespace
