//===- CompileConfigTest.cpp - Units for the YAML model files and flags ---===//

#include "CompileConfigTestUtils.h"

#include "llvm/ADT/StringSet.h"

#include <algorithm>

using namespace megatron;
using namespace megatron::testing;

namespace {

//===----------------------------------------------------------------------===//
// Bundled model files
//===----------------------------------------------------------------------===//

TEST(CompileConfigTest, BundledModelsLoadAndValidate) {
  struct Expect {
    StringRef file;
    int64_t layers, hidden, heads, groups, ffn, seq, vocab, micro;
    Precision precision;
  };
  const Expect models[] = {
      {"tiny-gpt.yaml", 2, 128, 4, 4, 512, 128, 256, 8, Precision::FP32},
      {"gpt2-124m.yaml", 12, 768, 12, 12, 3072, 1024, 50257, 32,
       Precision::BF16},
      {"gpt2-350m.yaml", 24, 1024, 16, 16, 4096, 1024, 50257, 32,
       Precision::BF16},
      {"gpt-1.3b.yaml", 24, 2048, 16, 16, 8192, 2048, 50257, 8,
       Precision::BF16},
      {"tiny-llama.yaml", 2, 128, 8, 2, 352, 128, 256, 8, Precision::FP32},
      {"llama-7b.yaml", 32, 4096, 32, 32, 11008, 4096, 32000, 1,
       Precision::BF16},
      {"llama-1.5b.yaml", 16, 2048, 32, 8, 8192, 2048, 128256, 4,
       Precision::BF16},
  };
  for (const Expect &e : models) {
    SCOPED_TRACE(e.file.str());
    llvm::Expected<CompileConfig> config = loadCompileConfig(modelPath(e.file));
    ASSERT_TRUE(bool(config)) << message(config.takeError());
    EXPECT_EQ(message(validateCompileConfig(*config)), "<success>");
    EXPECT_EQ(config->model.name, e.file.drop_back(5).str());
    EXPECT_EQ(config->model.numLayers, e.layers);
    EXPECT_EQ(config->model.hiddenSize, e.hidden);
    EXPECT_EQ(config->model.numAttentionHeads, e.heads);
    EXPECT_EQ(config->model.queryGroups(), e.groups);
    EXPECT_EQ(config->model.ffnSize(), e.ffn);
    EXPECT_EQ(config->model.seqLength, e.seq);
    EXPECT_EQ(config->model.vocabSize, e.vocab);
    EXPECT_EQ(config->batch.microBatchSize, e.micro);
    EXPECT_EQ(config->precision, e.precision);
  }
  for (StringRef file : {"hf/gpt2-config.json", "hf/llama-config.json"}) {
    SCOPED_TRACE(file.str());
    llvm::Expected<CompileConfig> config = loadCompileConfig(modelPath(file));
    ASSERT_TRUE(bool(config)) << message(config.takeError());
    EXPECT_EQ(message(validateCompileConfig(*config)), "<success>");
  }
}

TEST(CompileConfigTest, LlamaFilesAreLlamaShaped) {
  llvm::Expected<CompileConfig> c =
      loadCompileConfig(modelPath("llama-7b.yaml"));
  ASSERT_TRUE(bool(c)) << message(c.takeError());
  EXPECT_EQ(c->model.normalization, Normalization::RMSNorm);
  EXPECT_EQ(c->model.positionEmbeddingType, PositionEmbedding::Rope);
  EXPECT_EQ(c->model.activation, Activation::Swiglu);
  EXPECT_FALSE(c->model.addBiasLinear);
  EXPECT_TRUE(c->model.untieEmbeddingsAndOutputWeights);
  EXPECT_EQ(c->model.rotaryBase, 10000.0);
  EXPECT_EQ(c->model.normEpsilon, 1e-5);
  EXPECT_EQ(c->model.hiddenDropout, 0.0);
  EXPECT_EQ(c->paddedVocabSize(), 32000);
}

TEST(CompileConfigTest, Gpt2PaddedVocabularyFollowsMegatron) {
  llvm::Expected<CompileConfig> c =
      loadCompileConfig(modelPath("gpt2-124m.yaml"));
  ASSERT_TRUE(bool(c)) << message(c.takeError());
  // Multiples of 128 * tp: 393 * 128, 197 * 256, 99 * 512, 50 * 1024.
  const std::pair<int64_t, int64_t> cases[] = {
      {1, 50304}, {2, 50432}, {4, 50688}, {8, 51200}};
  for (auto [tp, padded] : cases) {
    c->parallel.tensorModelParallelSize = tp;
    EXPECT_EQ(c->paddedVocabSize(), padded) << "tp=" << tp;
  }
}

//===----------------------------------------------------------------------===//
// The YAML format
//===----------------------------------------------------------------------===//

TEST(CompileConfigTest, FlatKeysEqualSections) {
  CompileConfig sections =
      parse(std::string(kSmall) + "parallel:\n  tensor_model_parallel_size: 2\n"
                                  "recompute:\n  granularity: full\n"
                                  "  num_layers: 2\n"
                                  "precision: bf16\n");
  CompileConfig flat = parse("num_layers: 4\nhidden_size: 64\n"
                             "num_attention_heads: 4\nseq_length: 32\n"
                             "vocab_size: 100\ntensor_model_parallel_size: 2\n"
                             "recompute_granularity: full\n"
                             "recompute_num_layers: 2\nprecision: bf16\n");
  for (const CompileConfig *c : {&sections, &flat}) {
    EXPECT_EQ(c->model.numLayers, 4);
    EXPECT_EQ(c->parallel.tensorModelParallelSize, 2);
    EXPECT_EQ(c->recompute.granularity, RecomputeGranularity::Full);
    EXPECT_EQ(c->recompute.numLayers, 2);
    EXPECT_EQ(c->precision, Precision::BF16);
    EXPECT_EQ(c->model.name, "x");
    EXPECT_EQ(c->sourcePath, "x.yaml");
  }
  EXPECT_EQ(sections.keyOrigins.lookup("tensor_model_parallel_size"),
            "x.yaml:8:31");
}

TEST(CompileConfigTest, UnknownKeySuggestsTheNearest) {
  EXPECT_EQ(message(parseCompileConfig("model:\n  num_layers: 2\n"
                                       "  num_attention_head: 12\n",
                                       "models/x.yaml")),
            "models/x.yaml:3:3: unknown key 'num_attention_head' in section "
            "'model'; did you mean 'num_attention_heads'?");
  EXPECT_EQ(message(parseCompileConfig("n_head: 12\n", "x.yaml")),
            "x.yaml:1:1: unknown key 'n_head'; did you mean "
            "'num_attention_heads'?");
  EXPECT_EQ(
      message(parseCompileConfig("recompute:\n  granularty: full\n", "x.yaml")),
      "x.yaml:2:3: unknown key 'granularty' in section 'recompute'; did "
      "you mean 'granularity'?");
  EXPECT_EQ(message(parseCompileConfig("paralel:\n  x: 1\n", "x.yaml")),
            "x.yaml:1:1: unknown key 'paralel'; did you mean 'parallel'?");
  EXPECT_EQ(message(parseCompileConfig("frobnicate: 1\n", "x.yaml")),
            "x.yaml:1:1: unknown key 'frobnicate'; models/README.md lists "
            "every key");
}

TEST(CompileConfigTest, KeyInTheWrongSection) {
  EXPECT_EQ(message(parseCompileConfig(
                "model:\n  tensor_model_parallel_size: 2\n", "x.yaml")),
            "x.yaml:2:3: 'tensor_model_parallel_size' belongs in section "
            "'parallel', not in 'model'");
  EXPECT_EQ(
      message(parseCompileConfig("model:\n  precision: bf16\n", "x.yaml")),
      "x.yaml:2:3: 'precision' is a top-level key (precision: bf16), "
      "not part of section 'model'");
  EXPECT_EQ(message(parseCompileConfig("model: 12\n", "x.yaml")),
            "x.yaml:1:8: 'model' is a section: expected keys indented under "
            "it, got '12'");
}

TEST(CompileConfigTest, DuplicateKeys) {
  EXPECT_EQ(message(parseCompileConfig(
                "model:\n  num_layers: 2\n  num_layers: 3\n", "x.yaml")),
            "x.yaml:3:3: duplicate key 'num_layers'; it is already set at "
            "x.yaml:2:3");
  // The same key flat and in its section is a duplicate too.
  EXPECT_EQ(message(parseCompileConfig(
                "num_layers: 2\nmodel:\n  num_layers: 3\n", "x.yaml")),
            "x.yaml:3:3: duplicate key 'num_layers'; it is already set at "
            "x.yaml:1:1");
  EXPECT_EQ(message(parseCompileConfig("model:\n  num_layers: 2\nmodel:\n",
                                       "x.yaml")),
            "x.yaml:3:1: duplicate section 'model'; it already appears at "
            "x.yaml:1:1");
}

TEST(CompileConfigTest, WrongTypesNameKeyValueAndExpectation) {
  const std::pair<StringRef, StringRef> cases[] = {
      {"model:\n  num_attention_heads: twelve\n",
       "models/x.yaml:2:24: num_attention_heads: expected a positive integer, "
       "got 'twelve'"},
      {"model:\n  num_layers: -2\n",
       "models/x.yaml:2:15: num_layers: expected a positive integer, got '-2'"},
      {"model:\n  hidden_size: 0\n",
       "models/x.yaml:2:16: hidden_size: expected a positive integer, got '0'"},
      {"model:\n  hidden_size: 76.8\n",
       "models/x.yaml:2:16: hidden_size: expected a positive integer, got "
       "'76.8'"},
      {"model:\n  vocab_size: 99999999999999999999\n",
       "models/x.yaml:2:15: vocab_size: expected a positive integer, got "
       "'99999999999999999999' (it does not fit in a 64-bit integer)"},
      {"model:\n  hidden_dropout: 1.5\n",
       "models/x.yaml:2:19: hidden_dropout: expected a probability in [0, 1), "
       "got '1.5'"},
      {"model:\n  norm_epsilon: 0\n",
       "models/x.yaml:2:17: norm_epsilon: expected a positive number, got "
       "'0'"},
      {"model:\n  init_method_std: .nan\n",
       "models/x.yaml:2:20: init_method_std: expected a positive number, got "
       "'.nan'"},
      {"model:\n  normalization: BatchNorm\n",
       "models/x.yaml:2:18: normalization: expected LayerNorm or RMSNorm, got "
       "'BatchNorm'"},
      {"precision: fp8\n",
       "models/x.yaml:1:12: precision: expected fp32, bf16 or fp16, got "
       "'fp8'"},
      {"parallel:\n  sequence_parallel: maybe\n",
       "models/x.yaml:2:22: sequence_parallel: expected true or false, got "
       "'maybe'"},
      {"model:\n  num_layers:\n",
       "models/x.yaml:2:3: num_layers: expected a positive integer, got "
       "'null'"},
      {"model:\n  num_layers: [1, 2]\n",
       "models/x.yaml:2:16: num_layers: expected a single value, got a list"},
  };
  for (auto [text, expected] : cases)
    EXPECT_EQ(message(parseCompileConfig(text, "models/x.yaml")), expected);
}

TEST(CompileConfigTest, BadYamlNamesTheFile) {
  std::string err = message(
      parseCompileConfig("model:\n  num_layers: [1, 2\n", "models/bad.yaml"));
  EXPECT_EQ(err, "models/bad.yaml:2:20: invalid YAML: Could not find closing "
                 "]!");
  EXPECT_EQ(message(parseCompileConfig("", "models/empty.yaml")),
            "models/empty.yaml: the model file is empty; expected keys such as "
            "'model:' with 'num_layers: 12' under it");
  EXPECT_EQ(message(parseCompileConfig("- 1\n- 2\n", "x.yaml")),
            "x.yaml:1:1: expected a mapping of keys (like 'model:' or "
            "'num_layers: 12') at the top level, got a list");
  EXPECT_EQ(message(parseCompileConfig("a: 1\n---\nb: 2\n", "x.yaml")),
            "x.yaml: 2 YAML documents; a model file is one document (remove "
            "the '---' separators)");
  EXPECT_EQ(message(loadCompileConfig("/nonexistent/m.yaml")),
            "cannot read model file '/nonexistent/m.yaml': No such file or "
            "directory");
}

TEST(CompileConfigTest, EveryKeyIsUniqueSettableAndDocumented) {
  llvm::StringSet<> seen;
  for (const ConfigKeyInfo &info : getConfigKeys()) {
    SCOPED_TRACE(info.key.str());
    EXPECT_TRUE(seen.insert(info.key).second);
    EXPECT_FALSE(info.help.empty());
    EXPECT_FALSE(info.defaultValue.empty());
    CompileConfig config;
    // The flag form reaches the same key: an empty value is either accepted
    // (flags) or rejected as that key's value, never as an unknown option.
    std::string flag = "--" + info.key.str();
    std::replace(flag.begin(), flag.end(), '_', '-');
    std::string err = message(applyOverride(config, flag, ""));
    EXPECT_EQ(err.find("unknown"), std::string::npos) << err;
  }
}

//===----------------------------------------------------------------------===//
// Command-line overrides
//===----------------------------------------------------------------------===//

TEST(CompileConfigTest, OverridesSetTheSameFieldsAsKeys) {
  CompileConfig config = parse(kSmall);
  ASSERT_FALSE(applyOverride(config, "--tensor-model-parallel-size", "2"));
  ASSERT_FALSE(applyOverride(config, "pipeline_model_parallel_size", "2"));
  ASSERT_FALSE(applyOverride(config, "sequence-parallel", ""));
  ASSERT_FALSE(applyOverride(config, "--num-layers", "8"));
  ASSERT_FALSE(applyOverride(config, "--bf16", ""));
  ASSERT_FALSE(applyOverride(config, "--swiglu", ""));
  ASSERT_FALSE(applyOverride(config, "--disable-bias-linear", ""));
  ASSERT_FALSE(applyOverride(config, "--recompute-activations", ""));
  EXPECT_EQ(config.parallel.tensorModelParallelSize, 2);
  EXPECT_EQ(config.parallel.pipelineModelParallelSize, 2);
  EXPECT_TRUE(config.parallel.sequenceParallel);
  EXPECT_EQ(config.model.numLayers, 8);
  EXPECT_EQ(config.precision, Precision::BF16);
  EXPECT_EQ(config.model.activation, Activation::Swiglu);
  EXPECT_FALSE(config.model.addBiasLinear);
  EXPECT_EQ(config.recompute.granularity, RecomputeGranularity::Selective);
  EXPECT_EQ(config.keyOrigins.lookup("tensor_model_parallel_size"),
            "command line (--tensor-model-parallel-size)");
  EXPECT_EQ(message(validateCompileConfig(config)), "<success>");
}

TEST(CompileConfigTest, OverrideErrors) {
  CompileConfig config = parse(kSmall);
  EXPECT_EQ(message(applyOverride(config, "--tensor-model-paralel-size", "2")),
            "unknown option '--tensor-model-paralel-size'; did you mean "
            "'--tensor-model-parallel-size'?");
  EXPECT_EQ(message(applyOverride(config, "num_attention_head", "2")),
            "unknown key 'num_attention_head'; did you mean "
            "'num_attention_heads'?");
  EXPECT_EQ(message(applyOverride(config, "--num-attention-heads", "twelve")),
            "--num-attention-heads: expected a positive integer, got "
            "'twelve'");
  EXPECT_EQ(message(applyOverride(config, "micro_batch_size", "-1")),
            "micro_batch_size: expected a positive integer, got '-1'");
  // A rejected value leaves the field as it was.
  EXPECT_EQ(config.model.numAttentionHeads, 4);
}

} // namespace
