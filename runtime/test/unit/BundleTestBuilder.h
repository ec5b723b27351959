// Test helpers: manifests built as JSON in the test, written as bundle files,
// and error expectations.
#ifndef MTRT_TEST_UNIT_BUNDLETESTBUILDER_H
#define MTRT_TEST_UNIT_BUNDLETESTBUILDER_H

#include "core/Bundle.h"
#include "core/Sha256.h"

#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <string>
#include <unistd.h>
#include <vector>

namespace mtrt::test {

using Json = nlohmann::json;

/// Builds one function of a manifest, value by value.
class FunctionBuilder {
public:
  explicit FunctionBuilder(std::string name) : name_(std::move(name)) {}

  int64_t value(std::vector<int64_t> shape, const char *dtype = "f32") {
    values_.push_back({{"shape", shape}, {"dtype", dtype}});
    return static_cast<int64_t>(values_.size()) - 1;
  }
  int64_t input(std::vector<int64_t> shape, const char *dtype = "i32") {
    int64_t v = value(std::move(shape), dtype);
    inputs_.push_back(v);
    return v;
  }
  void output(int64_t v) { outputs_.push_back(v); }

  /// Appends an instruction; empty lists and attrs are omitted, as the
  /// format says.
  Json &inst(const char *op, std::vector<int64_t> operands,
             std::vector<int64_t> results, Json attrs = Json::object(),
             std::vector<int64_t> free = {}) {
    Json i = {{"op", op}};
    if (!operands.empty())
      i["operands"] = operands;
    if (!results.empty())
      i["results"] = results;
    if (!attrs.empty())
      i["attrs"] = attrs;
    if (!free.empty())
      i["free"] = free;
    instructions_.push_back(i);
    return instructions_.back();
  }
  /// An instruction with one new result of `shape`; returns the result.
  int64_t op(const char *op, std::vector<int64_t> operands,
             std::vector<int64_t> shape, Json attrs = Json::object(),
             const char *dtype = "f32") {
    int64_t r = value(std::move(shape), dtype);
    inst(op, std::move(operands), {r}, std::move(attrs));
    return r;
  }
  /// Marks `v` freed by the last instruction.
  void freeLast(int64_t v) { instructions_.back()["free"].push_back(v); }

  Json build() const {
    return {{"name", name_},
            {"inputs", inputs_},
            {"outputs", outputs_},
            {"values", values_},
            {"instructions", instructions_}};
  }

private:
  std::string name_;
  Json values_ = Json::array(), instructions_ = Json::array();
  std::vector<int64_t> inputs_, outputs_;
};

inline Json modelJson(int64_t vocab, int64_t hidden, int64_t seq,
                      int64_t microBatch, int64_t globalBatch) {
  return {{"name", "test-model"},
          {"num_layers", 1},
          {"hidden_size", hidden},
          {"num_attention_heads", 1},
          {"num_query_groups", 1},
          {"ffn_hidden_size", 4 * hidden},
          {"seq_length", seq},
          {"vocab_size", vocab},
          {"padded_vocab_size", vocab},
          {"micro_batch_size", microBatch},
          {"global_batch_size", globalBatch},
          {"tensor_model_parallel_size", 1},
          {"pipeline_model_parallel_size", 1},
          {"data_parallel_size", 1},
          {"precision", "fp32"}};
}

inline Json parameterJson(const std::string &name, std::vector<int64_t> shape,
                          const char *init = "normal", double std = 0.02,
                          bool weightDecay = true) {
  Json p = {{"name", name},
            {"shape", shape},
            {"dtype", "f32"},
            {"init", init},
            {"weight_decay", weightDecay}};
  if (std::string(init) == "normal")
    p["std"] = std;
  return p;
}

inline Json manifestJson(Json model, Json parameters, Json functions) {
  return {{"format", "megatron-bundle"}, {"version", 1},
          {"producer", "test"},          {"model", std::move(model)},
          {"parameters", parameters},    {"functions", functions}};
}

/// The bytes of a bundle file: header, manifest, SHA-256 over it.
inline std::vector<uint8_t> bundleBytes(const std::string &manifest,
                                        uint32_t version = 1,
                                        uint32_t flags = 0) {
  std::vector<uint8_t> bytes(64 + manifest.size());
  auto put = [&](size_t at, uint64_t value, int size) {
    for (int i = 0; i < size; ++i)
      bytes[at + i] = static_cast<uint8_t>(value >> (8 * i));
  };
  std::memcpy(bytes.data(), "MTBUNDLE", 8);
  put(8, version, 4);
  put(12, flags, 4);
  put(16, manifest.size(), 8);
  put(24, 0, 8);
  std::memcpy(bytes.data() + 64, manifest.data(), manifest.size());
  Sha256Digest digest = sha256(bytes.data() + 64, manifest.size());
  std::memcpy(bytes.data() + 32, digest.data(), 32);
  return bytes;
}

/// A fresh path under the temporary directory, removed at destruction.
class TempFile {
public:
  explicit TempFile(const std::string &suffix) {
    const char *dir = std::getenv("TMPDIR");
    path_ = std::string(dir ? dir : "/tmp") + "/mtrt-test-" +
            std::to_string(getpid()) + "-" + std::to_string(counter()++) +
            suffix;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string &path() const { return path_; }
  void write(const std::vector<uint8_t> &bytes) const {
    std::ofstream(path_, std::ios::binary)
        .write(reinterpret_cast<const char *>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }

private:
  static int &counter() {
    static int n = 0;
    return n;
  }
  std::string path_;
};

/// The manifest of a bigram language model: logits = embedding(tokens) @ W
/// + b, mean cross-entropy against the labels. train_step runs forward,
/// backward (hand-written, the ops autodiff emits) and accumulates the three
/// gradients; eval_step is the forward; predict_step returns the logits.
/// Parameters: 0 the table [V, H], 1 W [H, V], 2 b [V] (zeros, no decay).
inline Json bigramManifest(int64_t vocab, int64_t hidden, int64_t batch,
                           int64_t seq, int64_t globalBatch = 0) {
  int64_t V = vocab, H = hidden, B = batch, S = seq;
  auto forward = [&](FunctionBuilder &f, int64_t &tokens, int64_t &x,
                     int64_t &w) {
    tokens = f.input({B, S});
    int64_t table = f.op("get_parameter", {}, {V, H}, {{"parameter", 0}});
    w = f.op("get_parameter", {}, {H, V}, {{"parameter", 1}});
    int64_t b = f.op("get_parameter", {}, {V}, {{"parameter", 2}});
    x = f.op("embedding", {table, tokens}, {B, S, H});
    return f.op("linear", {x, w, b}, {B, S, V});
  };
  Json functions = Json::array();
  {
    FunctionBuilder f("train_step");
    int64_t tokens, x, w;
    int64_t logits = forward(f, tokens, x, w);
    int64_t labels = f.input({B, S});
    Json ce = {{"reduction", "mean"}};
    int64_t loss = f.op("cross_entropy", {logits, labels}, {}, ce);
    f.output(loss);
    int64_t one =
        f.op("fill", {}, {}, {{"value", 1.0}, {"loss_seed", true}});
    int64_t dlogits =
        f.op("cross_entropy_grad", {one, logits, labels}, {B, S, V}, ce);
    f.freeLast(one);
    f.freeLast(logits);
    int64_t dw = f.op("linear_weight_grad", {x, dlogits}, {H, V});
    int64_t db = f.op("bias_grad", {dlogits}, {V});
    int64_t dx =
        f.op("linear", {dlogits, w}, {B, S, H}, {{"transpose_weight", true}});
    f.freeLast(dlogits);
    int64_t dtable = f.op("embedding_grad", {dx, tokens}, {V, H});
    f.freeLast(dx);
    f.freeLast(x);
    f.inst("accumulate_gradient", {dtable}, {}, {{"parameter", 0}}, {dtable});
    f.inst("accumulate_gradient", {dw}, {}, {{"parameter", 1}}, {dw});
    f.inst("accumulate_gradient", {db}, {}, {{"parameter", 2}}, {db});
    functions.push_back(f.build());
  }
  {
    FunctionBuilder f("eval_step");
    int64_t tokens, x, w;
    int64_t logits = forward(f, tokens, x, w);
    int64_t labels = f.input({B, S});
    f.output(
        f.op("cross_entropy", {logits, labels}, {}, {{"reduction", "mean"}}));
    functions.push_back(f.build());
  }
  {
    FunctionBuilder f("predict_step");
    int64_t tokens, x, w;
    f.output(forward(f, tokens, x, w));
    functions.push_back(f.build());
  }
  Json parameters = {
      parameterJson("embedding.word_embeddings.weight", {V, H}),
      parameterJson("output_layer.weight", {H, V}),
      parameterJson("output_layer.bias", {V}, "zeros", 0, false)};
  return manifestJson(modelJson(V, H, S, B, globalBatch ? globalBatch : B),
                      parameters, functions);
}

/// Expects `body` to throw an mtrt::Error with `code` whose message holds
/// every one of `parts`.
template <typename Fn>
void expectError(Fn &&body, mtrt_status_code_t code,
                 std::initializer_list<std::string> parts) {
  try {
    body();
    ADD_FAILURE() << "expected an error with code "
                  << mtrt_status_code_string(code);
  } catch (const Error &e) {
    EXPECT_EQ(e.code(), code)
        << mtrt_status_code_string(e.code()) << ": " << e.what();
    std::string message = e.what();
    for (const std::string &part : parts)
      EXPECT_NE(message.find(part), std::string::npos)
          << "'" << part << "' not in: " << message;
  }
}

/// Expects the reader to refuse `manifest` (read as the bundle `name`) with
/// INVALID_ARGUMENT and a message holding every one of `parts`.
inline void expectManifestRejected(const Json &manifest,
                                   std::initializer_list<std::string> parts,
                                   const std::string &name = "m.mtb") {
  expectError([&] { Bundle::parseManifest(name, manifest.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT, parts);
}

/// The memory plan of a manifest's first function.
inline Json &firstMemoryPlan(Json &manifest) {
  return manifest["functions"][0]["memory_plan"];
}

} // namespace mtrt::test

#endif // MTRT_TEST_UNIT_BUNDLETESTBUILDER_H
