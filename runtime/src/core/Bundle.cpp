// Reads bundle files: the container checks, the JSON manifest and its schema
// (docs/BundleFormat.md).
#include "core/Bundle.h"

#include "core/Sha256.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace mtrt {

using Json = nlohmann::json;

//===----------------------------------------------------------------------===//
// Element types, ops and printing
//===----------------------------------------------------------------------===//

namespace {

struct DTypeName {
  DType dtype;
  const char *name;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {DType::F32, "f32", 4}, {DType::F64, "f64", 8}, {DType::BF16, "bf16", 2},
    {DType::F16, "f16", 2}, {DType::I32, "i32", 4}, {DType::I64, "i64", 8},
};

enum class AttrKind { Int, Number, Bool, String, IntArray };

struct AttrSpec {
  const char *name;
  AttrKind kind;
  bool required;
};

/// A row of the op table: operand and result counts and attributes.
struct OpInfo {
  Op op;
  const char *name;
  int minOperands, maxOperands;
  int minResults, maxResults;
  std::vector<AttrSpec> attrs;
};

constexpr int kMany = std::numeric_limits<int>::max();

const std::vector<AttrSpec> kAttentionAttrs = {
    {"causal", AttrKind::Bool, false},
    {"scale", AttrKind::Number, false},
    {"dropout_p", AttrKind::Number, false},
    {"seed", AttrKind::Int, false}};
const std::vector<AttrSpec> kLossAttrs = {
    {"reduction", AttrKind::String, true},
    {"ignore_index", AttrKind::Int, false}};
const std::vector<AttrSpec> kEpsilon = {{"epsilon", AttrKind::Number, true}};
const std::vector<AttrSpec> kAxis = {{"axis", AttrKind::Int, true}};

const std::vector<OpInfo> &opTable() {
  static const std::vector<OpInfo> table = {
      {Op::GetParameter,
       "get_parameter",
       0,
       0,
       1,
       1,
       {{"parameter", AttrKind::Int, true}}},
      {Op::AccumulateGradient,
       "accumulate_gradient",
       1,
       1,
       0,
       0,
       {{"parameter", AttrKind::Int, true}}},
      {Op::Fill, "fill", 0, 0, 1, 1, {{"value", AttrKind::Number, true}}},
      {Op::PositionIds, "position_ids", 0, 0, 1, 1, {}},
      {Op::Embedding, "embedding", 2, 2, 1, 1, {}},
      {Op::LayerNorm, "layer_norm", 2, 3, 1, 1, kEpsilon},
      {Op::RmsNorm, "rms_norm", 2, 2, 1, 1, kEpsilon},
      {Op::Linear,
       "linear",
       2,
       3,
       1,
       1,
       {{"transpose_weight", AttrKind::Bool, false}}},
      {Op::Matmul,
       "matmul",
       2,
       2,
       1,
       1,
       {{"transpose_lhs", AttrKind::Bool, false},
        {"transpose_rhs", AttrKind::Bool, false}}},
      {Op::Attention, "attention", 3, 3, 1, 1, kAttentionAttrs},
      {Op::Rope,
       "rope",
       1,
       1,
       1,
       1,
       {{"base", AttrKind::Number, true},
        {"rotary_dim", AttrKind::Int, false},
        {"inverse", AttrKind::Bool, false}}},
      {Op::Gelu, "gelu", 1, 1, 1, 1, {{"approximate", AttrKind::String, true}}},
      {Op::Silu, "silu", 1, 1, 1, 1, {}},
      {Op::Swiglu, "swiglu", 2, 2, 1, 1, {}},
      {Op::Dropout,
       "dropout",
       1,
       1,
       1,
       1,
       {{"p", AttrKind::Number, true}, {"seed", AttrKind::Int, true}}},
      {Op::Add, "add", 2, 2, 1, 1, {}},
      {Op::Mul, "mul", 2, 2, 1, 1, {}},
      {Op::Softmax, "softmax", 1, 1, 1, 1, kAxis},
      {Op::CrossEntropy, "cross_entropy", 2, 2, 1, 1, kLossAttrs},
      {Op::Reshape, "reshape", 1, 1, 1, 1, {}},
      {Op::Transpose,
       "transpose",
       1,
       1,
       1,
       1,
       {{"permutation", AttrKind::IntArray, true}}},
      {Op::Split, "split", 1, 1, 1, kMany, kAxis},
      {Op::Concat, "concat", 1, kMany, 1, 1, kAxis},
      {Op::EmbeddingGrad, "embedding_grad", 2, 2, 1, 1, {}},
      {Op::LayerNormGrad, "layer_norm_grad", 3, 3, 2, 3, kEpsilon},
      {Op::RmsNormGrad, "rms_norm_grad", 3, 3, 2, 2, kEpsilon},
      {Op::LinearWeightGrad,
       "linear_weight_grad",
       2,
       2,
       1,
       1,
       {{"transpose_weight", AttrKind::Bool, false}}},
      {Op::BiasGrad, "bias_grad", 1, 1, 1, 1, {}},
      {Op::AttentionGrad, "attention_grad", 4, 4, 3, 3, kAttentionAttrs},
      {Op::GeluGrad,
       "gelu_grad",
       2,
       2,
       1,
       1,
       {{"approximate", AttrKind::String, true}}},
      {Op::SiluGrad, "silu_grad", 2, 2, 1, 1, {}},
      {Op::SwigluGrad, "swiglu_grad", 3, 3, 2, 2, {}},
      {Op::SoftmaxGrad, "softmax_grad", 2, 2, 1, 1, kAxis},
      {Op::CrossEntropyGrad, "cross_entropy_grad", 3, 3, 1, 1, kLossAttrs},
  };
  return table;
}

const OpInfo &opInfo(Op op) {
  for (const OpInfo &info : opTable())
    if (info.op == op)
      return info;
  throw Error(MTRT_STATUS_INTERNAL, "op without a row in the op table");
}

/// At most `limit` characters of `json` as JSON text, for messages.
std::string describe(const Json &json, size_t limit = 60) {
  std::string text = json.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > limit)
    text = text.substr(0, limit) + "...";
  return text;
}

const char *jsonTypeName(const Json &json) {
  if (json.is_number_integer())
    return "an integer";
  if (json.is_number())
    return "a number";
  if (json.is_string())
    return "a string";
  if (json.is_boolean())
    return "a boolean";
  if (json.is_array())
    return "an array";
  if (json.is_object())
    return "an object";
  return "null";
}

std::string index(const std::string &path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

std::string member(const std::string &path, const char *key) {
  return path.empty() ? std::string(key) : path + "." + key;
}

uint32_t readU32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

uint64_t readU64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

} // namespace

const char *dtypeName(DType dtype) {
  for (const DTypeName &entry : kDTypes)
    if (entry.dtype == dtype)
      return entry.name;
  return "?";
}

bool isFloatingPoint(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16 ||
         dtype == DType::F16;
}

size_t dtypeSize(DType dtype) {
  for (const DTypeName &entry : kDTypes)
    if (entry.dtype == dtype)
      return entry.size;
  return 0;
}

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::string TensorType::str() const {
  return shapeString(shape) + " " + dtypeName(dtype);
}

const char *opName(Op op) { return opInfo(op).name; }

const Function *Bundle::findFunction(std::string_view name) const {
  for (const Function &function : functions_)
    if (function.name == name)
      return &function;
  return nullptr;
}

//===----------------------------------------------------------------------===//
// ManifestReader: the schema
//===----------------------------------------------------------------------===//

/// Reads the manifest's JSON into a Bundle, checking every field on the way.
/// Every failure throws an Error whose message reads
///   bundle 'NAME': FIELD.PATH: found VALUE, expected EXPECTATION
class ManifestReader {
public:
  explicit ManifestReader(std::string_view name) : name_(name) {}

  Bundle read(std::string_view text);

  [[noreturn]] void
  fail(const std::string &path, const std::string &found,
       const std::string &expected,
       mtrt_status_code_t code = MTRT_STATUS_INVALID_ARGUMENT) {
    throw Error(code, "bundle '" + name_ + "': " + path + ": found " + found +
                          ", expected " + expected);
  }

private:
  // Typed field access.
  const Json &field(const Json &object, const std::string &path,
                    const char *key);
  const Json *optionalField(const Json &object, const char *key);
  void expectObject(const Json &json, const std::string &path);
  void expectArray(const Json &json, const std::string &path);
  int64_t readInt(const Json &json, const std::string &path,
                  int64_t min = std::numeric_limits<int64_t>::min(),
                  int64_t max = std::numeric_limits<int64_t>::max());
  double readNumber(const Json &json, const std::string &path);
  bool readBool(const Json &json, const std::string &path);
  std::string readString(const Json &json, const std::string &path);
  std::vector<int64_t> readShape(const Json &json, const std::string &path,
                                 int64_t *outElements);
  DType readDType(const Json &json, const std::string &path);
  TensorType readTensorType(const Json &object, const std::string &path);

  void readModel(const Json &json, const std::string &path, ModelConfig &out);
  void readParameters(const Json &json, const std::string &path,
                      std::vector<Parameter> &out);
  void readFunction(const Json &json, const std::string &path, Function &out);
  void readInstruction(const Json &json, const std::string &path,
                       Function &function, size_t position);
  void readAttributes(const Json *attrs, const std::string &path,
                      const OpInfo &info, Attributes &out);
  void checkFunctionSignature(const Function &function,
                              const std::string &path);

  std::string name_;
  const std::vector<Parameter> *parameters_ = nullptr;

  // Per function, while its instructions are read.
  static constexpr int64_t kUndefined = -2, kInput = -1;
  std::vector<int64_t> definedAt_;
  std::vector<int64_t> freedAt_;
  std::vector<bool> parameterView_;
  std::vector<bool> isOutput_;
  // Where each value is defined, from a lenient first pass, for messages.
  std::vector<int64_t> laterDefinition_;

  friend class OpChecker;
};

const Json &ManifestReader::field(const Json &object, const std::string &path,
                                  const char *key) {
  auto it = object.find(key);
  if (it == object.end())
    fail(member(path, key), "nothing (the field is missing)",
         std::string("the required field \"") + key + "\"");
  return *it;
}

const Json *ManifestReader::optionalField(const Json &object, const char *key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

void ManifestReader::expectObject(const Json &json, const std::string &path) {
  if (!json.is_object())
    fail(path, std::string(jsonTypeName(json)) + " " + describe(json),
         "an object");
}

void ManifestReader::expectArray(const Json &json, const std::string &path) {
  if (!json.is_array())
    fail(path, std::string(jsonTypeName(json)) + " " + describe(json),
         "an array");
}

int64_t ManifestReader::readInt(const Json &json, const std::string &path,
                                int64_t min, int64_t max) {
  if (!json.is_number_integer())
    fail(path, std::string(jsonTypeName(json)) + " " + describe(json),
         "an integer");
  if (json.is_number_unsigned() &&
      json.get<uint64_t>() >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail(path, describe(json), "an integer that fits in 64 signed bits");
  int64_t value = json.get<int64_t>();
  if (value < min || value > max) {
    std::string range;
    if (max == std::numeric_limits<int64_t>::max())
      range = "an integer >= " + std::to_string(min);
    else if (min == std::numeric_limits<int64_t>::min())
      range = "an integer <= " + std::to_string(max);
    else
      range = "an integer in [" + std::to_string(min) + ", " +
              std::to_string(max) + "]";
    fail(path, std::to_string(value), range);
  }
  return value;
}

double ManifestReader::readNumber(const Json &json, const std::string &path) {
  if (!json.is_number())
    fail(path, std::string(jsonTypeName(json)) + " " + describe(json),
         "a number");
  double value = json.get<double>();
  if (!std::isfinite(value))
    fail(path, describe(json), "a finite number");
  return value;
}

bool ManifestReader::readBool(const Json &json, const std::string &path) {
  if (!json.is_boolean())
    fail(path, std::string(jsonTypeName(json)) + " " + describe(json),
         "true or false");
  return json.get<bool>();
}

std::string ManifestReader::readString(const Json &json,
                                       const std::string &path) {
  if (!json.is_string())
    fail(path, std::string(jsonTypeName(json)) + " " + describe(json),
         "a string");
  return json.get<std::string>();
}

std::vector<int64_t> ManifestReader::readShape(const Json &json,
                                               const std::string &path,
                                               int64_t *outElements) {
  expectArray(json, path);
  std::vector<int64_t> shape;
  int64_t elements = 1;
  for (size_t i = 0; i < json.size(); ++i) {
    int64_t dim = readInt(json[i], index(path, i), 0);
    shape.push_back(dim);
    if (dim != 0 && elements > kMaxElements / dim)
      fail(path, "shape " + describe(json),
           "at most 2^60 elements (the product of the dimensions overflows)");
    elements *= dim;
  }
  *outElements = elements;
  return shape;
}

DType ManifestReader::readDType(const Json &json, const std::string &path) {
  if (json.is_string()) {
    std::string text = json.get<std::string>();
    for (const DTypeName &entry : kDTypes)
      if (text == entry.name)
        return entry.dtype;
  }
  fail(path, describe(json),
       "one of \"f32\", \"f64\", \"bf16\", \"f16\", \"i32\", \"i64\"");
}

TensorType ManifestReader::readTensorType(const Json &object,
                                          const std::string &path) {
  expectObject(object, path);
  TensorType type;
  type.shape = readShape(field(object, path, "shape"), member(path, "shape"),
                         &type.numElements);
  type.dtype = readDType(field(object, path, "dtype"), member(path, "dtype"));
  return type;
}

void ManifestReader::readModel(const Json &json, const std::string &path,
                               ModelConfig &out) {
  expectObject(json, path);
  out.name = readString(field(json, path, "name"), member(path, "name"));
  struct IntField {
    const char *key;
    int64_t *target;
    int64_t min;
  } ints[] = {
      {"num_layers", &out.numLayers, 0},
      {"hidden_size", &out.hiddenSize, 1},
      {"num_attention_heads", &out.numAttentionHeads, 1},
      {"num_query_groups", &out.numQueryGroups, 1},
      {"ffn_hidden_size", &out.ffnHiddenSize, 1},
      {"seq_length", &out.seqLength, 1},
      {"vocab_size", &out.vocabSize, 1},
      {"padded_vocab_size", &out.paddedVocabSize, 1},
      {"micro_batch_size", &out.microBatchSize, 1},
      {"global_batch_size", &out.globalBatchSize, 1},
      {"tensor_model_parallel_size", &out.tensorModelParallelSize, 1},
      {"pipeline_model_parallel_size", &out.pipelineModelParallelSize, 1},
      {"data_parallel_size", &out.dataParallelSize, 1},
  };
  for (const IntField &entry : ints)
    *entry.target = readInt(field(json, path, entry.key),
                            member(path, entry.key), entry.min);
  const Json &precision = field(json, path, "precision");
  std::string text = precision.is_string() ? precision.get<std::string>() : "";
  if (text != "fp32" && text != "bf16" && text != "fp16")
    fail(member(path, "precision"), describe(precision),
         "one of \"fp32\", \"bf16\", \"fp16\"");
  out.precision = text;
  if (out.paddedVocabSize < out.vocabSize)
    fail(member(path, "padded_vocab_size"), std::to_string(out.paddedVocabSize),
         "at least vocab_size (" + std::to_string(out.vocabSize) + ")");
  // micro_batch_size * data_parallel_size cannot overflow: both are checked
  // against global_batch_size first.
  int64_t perStep = out.microBatchSize;
  if (out.dataParallelSize > out.globalBatchSize ||
      perStep > out.globalBatchSize ||
      out.globalBatchSize % (perStep * out.dataParallelSize) != 0)
    fail(member(path, "global_batch_size"), std::to_string(out.globalBatchSize),
         "a multiple of micro_batch_size * data_parallel_size (" +
             std::to_string(out.microBatchSize) + " * " +
             std::to_string(out.dataParallelSize) + ")");
}

void ManifestReader::readParameters(const Json &json, const std::string &path,
                                    std::vector<Parameter> &out) {
  expectArray(json, path);
  std::map<std::string, size_t> names;
  for (size_t i = 0; i < json.size(); ++i) {
    std::string at = index(path, i);
    const Json &entry = json[i];
    expectObject(entry, at);
    Parameter parameter;
    parameter.name = readString(field(entry, at, "name"), member(at, "name"));
    if (parameter.name.empty())
      fail(member(at, "name"), "\"\"", "a non-empty name");
    auto [it, inserted] = names.emplace(parameter.name, i);
    if (!inserted)
      fail(member(at, "name"), "\"" + parameter.name + "\"",
           "a name not already used by parameters[" +
               std::to_string(it->second) + "]");
    parameter.type = readTensorType(entry, at);
    if (!isFloatingPoint(parameter.type.dtype))
      fail(member(at, "dtype"),
           std::string("\"") + dtypeName(parameter.type.dtype) + "\"",
           "a floating-point type (f32, f64, bf16, f16)");
    const Json &init = field(entry, at, "init");
    std::string method = init.is_string() ? init.get<std::string>() : "";
    if (method == "normal")
      parameter.init = InitMethod::Normal;
    else if (method == "zeros")
      parameter.init = InitMethod::Zeros;
    else if (method == "ones")
      parameter.init = InitMethod::Ones;
    else
      fail(member(at, "init"), describe(init),
           "one of \"normal\", \"zeros\", \"ones\"");
    if (parameter.init == InitMethod::Normal) {
      parameter.std = readNumber(field(entry, at, "std"), member(at, "std"));
      if (!(parameter.std > 0))
        fail(member(at, "std"), describe(entry["std"]),
             "a standard deviation > 0 for init \"normal\"");
    } else if (const Json *std = optionalField(entry, "std")) {
      readNumber(*std, member(at, "std"));
    }
    parameter.weightDecay =
        readBool(field(entry, at, "weight_decay"), member(at, "weight_decay"));
    out.push_back(std::move(parameter));
  }
}

/// Shape and element-type rules of one instruction, once its operands and
/// results are known to be defined values.
class OpChecker {
public:
  OpChecker(ManifestReader &reader, const Function &function,
            const Instruction &inst, const std::string &path,
            const std::vector<Parameter> &parameters)
      : reader_(reader), function_(function), inst_(inst), path_(path),
        parameters_(parameters) {}

  void check();

private:
  const TensorType &operand(size_t i) const {
    return function_.values[inst_.operands[i]];
  }
  const TensorType &result(size_t i) const {
    return function_.values[inst_.results[i]];
  }
  std::string where(bool isResult, size_t i) const {
    return index(path_ + (isResult ? ".results" : ".operands"), i);
  }
  int64_t valueIndex(bool isResult, size_t i) const {
    return isResult ? inst_.results[i] : inst_.operands[i];
  }
  const TensorType &type(bool isResult, size_t i) const {
    return isResult ? result(i) : operand(i);
  }

  /// Fails naming the op unless `expected` already does.
  [[noreturn]] void fail(const std::string &at, const std::string &found,
                         const std::string &expected) {
    std::string name = opName(inst_.op);
    reader_.fail(at, found,
                 expected.find(name) == std::string::npos
                     ? expected + " for " + name
                     : expected);
  }
  [[noreturn]] void failShape(bool isResult, size_t i,
                              const std::string &expected) {
    fail(where(isResult, i),
         "shape " + shapeString(type(isResult, i).shape) + " (value " +
             std::to_string(valueIndex(isResult, i)) + ")",
         expected);
  }
  void expectFloat(bool isResult, size_t i) {
    if (!isFloatingPoint(type(isResult, i).dtype))
      fail(where(isResult, i),
           std::string("dtype ") + dtypeName(type(isResult, i).dtype) +
               " (value " + std::to_string(valueIndex(isResult, i)) + ")",
           std::string("a floating-point type for ") + opName(inst_.op));
  }
  void expectIndex(bool isResult, size_t i) {
    DType dtype = type(isResult, i).dtype;
    if (dtype != DType::I32 && dtype != DType::I64)
      fail(where(isResult, i),
           std::string("dtype ") + dtypeName(dtype) + " (value " +
               std::to_string(valueIndex(isResult, i)) + ")",
           std::string("i32 or i64 for ") + opName(inst_.op) + "'s ids");
  }
  void expectMinRank(bool isResult, size_t i, int64_t rank) {
    if (type(isResult, i).rank() < rank)
      failShape(isResult, i,
                "rank " + std::to_string(rank) + " or more for " +
                    opName(inst_.op));
  }
  void expectRank(bool isResult, size_t i, int64_t rank) {
    if (type(isResult, i).rank() != rank)
      failShape(isResult, i,
                "rank " + std::to_string(rank) + " for " + opName(inst_.op));
  }
  void expectShape(bool isResult, size_t i, const std::vector<int64_t> &shape,
                   const std::string &why) {
    if (type(isResult, i).shape != shape)
      failShape(isResult, i, shapeString(shape) + " (" + why + ")");
  }
  int64_t normalizeAxis(int64_t axis, int64_t rank) {
    if (axis < -rank || axis >= rank)
      fail(path_ + ".attrs.axis", std::to_string(axis),
           "an axis in [" + std::to_string(-rank) + ", " +
               std::to_string(rank) + ") for rank " + std::to_string(rank));
    return axis < 0 ? axis + rank : axis;
  }
  std::vector<int64_t> attentionOutput(size_t q, size_t k, size_t v);
  void checkLoss(size_t logits, size_t labels);
  void checkOneElementType();

  ManifestReader &reader_;
  const Function &function_;
  const Instruction &inst_;
  std::string path_;
  const std::vector<Parameter> &parameters_;
};

/// q [b, sq, hq, d], k [b, sk, hkv, d], v [b, sk, hkv, dv] -> [b, sq, hq, dv].
std::vector<int64_t> OpChecker::attentionOutput(size_t q, size_t k, size_t v) {
  for (size_t i : {q, k, v}) {
    expectFloat(false, i);
    expectRank(false, i, 4);
  }
  const auto &qs = operand(q).shape, &ks = operand(k).shape,
             &vs = operand(v).shape;
  if (ks[0] != qs[0] || ks[3] != qs[3])
    failShape(false, k,
              "[" + std::to_string(qs[0]) + ", seq, kv_heads, " +
                  std::to_string(qs[3]) +
                  "] (the query's batch and head dimension)");
  if (ks[2] == 0 || qs[2] % ks[2] != 0)
    failShape(false, k,
              "a key/value head count that divides the query's " +
                  std::to_string(qs[2]) + " heads");
  if (inst_.attrs.causal && qs[1] != ks[1])
    failShape(false, k,
              "the query's sequence length " + std::to_string(qs[1]) +
                  " (causal attention)");
  if (vs[0] != ks[0] || vs[1] != ks[1] || vs[2] != ks[2])
    failShape(false, v,
              "[" + std::to_string(ks[0]) + ", " + std::to_string(ks[1]) +
                  ", " + std::to_string(ks[2]) +
                  ", head_dim_v] (the key's batch, sequence and heads)");
  return {qs[0], qs[1], qs[2], vs[3]};
}

void OpChecker::checkLoss(size_t logits, size_t labels) {
  expectFloat(false, logits);
  expectMinRank(false, logits, 1);
  expectIndex(false, labels);
  std::vector<int64_t> rows(operand(logits).shape.begin(),
                            operand(logits).shape.end() - 1);
  expectShape(false, labels, rows, "the logits' shape without the vocabulary");
}

void OpChecker::check() {
  const Attributes &a = inst_.attrs;
  const char *name = opName(inst_.op);
  auto sameAs = [&](bool isResult, size_t i, size_t like) {
    expectShape(isResult, i, operand(like).shape,
                std::string("the shape of operands[") + std::to_string(like) +
                    "]");
  };
  switch (inst_.op) {
  case Op::GetParameter:
  case Op::AccumulateGradient: {
    const Parameter &parameter = parameters_[a.parameter];
    bool isResult = inst_.op == Op::GetParameter;
    const TensorType &t = type(isResult, 0);
    if (t.shape != parameter.type.shape || t.dtype != parameter.type.dtype)
      fail(where(isResult, 0),
           t.str() + " (value " + std::to_string(valueIndex(isResult, 0)) + ")",
           parameter.type.str() + ", the type of parameters[" +
               std::to_string(a.parameter) + "] (" + parameter.name + ")");
    break;
  }
  case Op::Fill:
    expectFloat(true, 0);
    break;
  case Op::PositionIds:
    expectIndex(true, 0);
    expectMinRank(true, 0, 1);
    break;
  case Op::Embedding: {
    expectFloat(false, 0);
    expectRank(false, 0, 2);
    expectIndex(false, 1);
    expectFloat(true, 0);
    std::vector<int64_t> shape = operand(1).shape;
    shape.push_back(operand(0).shape[1]);
    expectShape(true, 0, shape, "the ids' shape and the table's hidden size");
    break;
  }
  case Op::LayerNorm:
  case Op::RmsNorm: {
    expectFloat(false, 0);
    expectMinRank(false, 0, 1);
    std::vector<int64_t> hidden = {operand(0).shape.back()};
    for (size_t i = 1; i < inst_.operands.size(); ++i) {
      expectFloat(false, i);
      expectShape(false, i, hidden, "the input's last dimension");
    }
    sameAs(true, 0, 0);
    break;
  }
  case Op::Linear: {
    expectFloat(false, 0);
    expectMinRank(false, 0, 1);
    expectFloat(false, 1);
    expectRank(false, 1, 2);
    int64_t in = operand(0).shape.back();
    const auto &w = operand(1).shape;
    int64_t wIn = a.transposeWeight ? w[1] : w[0];
    int64_t out = a.transposeWeight ? w[0] : w[1];
    if (wIn != in)
      failShape(false, 1,
                std::string(a.transposeWeight ? "[out, " : "[") +
                    std::to_string(in) + (a.transposeWeight ? "]" : ", out]") +
                    " (the input's last dimension" +
                    (a.transposeWeight ? ", transpose_weight" : "") + ")");
    if (inst_.operands.size() == 3) {
      expectFloat(false, 2);
      expectShape(false, 2, {out}, "the weight's output size");
    }
    std::vector<int64_t> shape = operand(0).shape;
    shape.back() = out;
    expectFloat(true, 0);
    expectShape(true, 0, shape,
                "the input's leading dimensions and the output size");
    break;
  }
  case Op::Matmul: {
    expectFloat(false, 0);
    expectFloat(false, 1);
    expectMinRank(false, 0, 2);
    expectRank(false, 1, operand(0).rank());
    const auto &l = operand(0).shape, &r = operand(1).shape;
    size_t rank = l.size();
    if (!std::equal(l.begin(), l.end() - 2, r.begin()))
      failShape(false, 1, "the batch dimensions of operands[0]");
    int64_t m = a.transposeLhs ? l[rank - 1] : l[rank - 2];
    int64_t k = a.transposeLhs ? l[rank - 2] : l[rank - 1];
    int64_t k2 = a.transposeRhs ? r[rank - 1] : r[rank - 2];
    int64_t n = a.transposeRhs ? r[rank - 2] : r[rank - 1];
    if (k != k2)
      failShape(false, 1,
                "a contracted dimension of " + std::to_string(k) +
                    " like operands[0]");
    std::vector<int64_t> shape(l.begin(), l.end() - 2);
    shape.push_back(m);
    shape.push_back(n);
    expectFloat(true, 0);
    expectShape(true, 0, shape, "the batch dimensions, then m x n");
    break;
  }
  case Op::Attention:
    expectFloat(true, 0);
    expectShape(true, 0, attentionOutput(0, 1, 2),
                "[batch, seq_q, heads_q, head_dim_v]");
    break;
  case Op::AttentionGrad: {
    std::vector<int64_t> out = attentionOutput(1, 2, 3);
    expectFloat(false, 0);
    expectShape(false, 0, out, "the attention output's shape");
    for (size_t i = 0; i < 3; ++i) {
      expectFloat(true, i);
      sameAs(true, i, i + 1);
    }
    break;
  }
  case Op::Rope: {
    expectFloat(false, 0);
    expectRank(false, 0, 4);
    int64_t headDim = operand(0).shape[3];
    int64_t rotary = a.rotaryDim.value_or(headDim);
    if (rotary % 2 != 0 || rotary > headDim || rotary < 0)
      fail(path_ + ".attrs.rotary_dim", std::to_string(rotary),
           "an even number of features <= the head dimension " +
               std::to_string(headDim));
    sameAs(true, 0, 0);
    break;
  }
  case Op::Gelu:
  case Op::Silu:
  case Op::Dropout:
  case Op::Softmax:
    expectFloat(false, 0);
    if (inst_.op == Op::Softmax)
      normalizeAxis(a.axis, operand(0).rank());
    sameAs(true, 0, 0);
    break;
  case Op::Swiglu:
  case Op::Add:
  case Op::Mul:
    expectFloat(false, 0);
    sameAs(false, 1, 0);
    sameAs(true, 0, 0);
    break;
  case Op::CrossEntropy: {
    checkLoss(0, 1);
    expectFloat(true, 0);
    std::vector<int64_t> shape;
    if (a.reduction == Reduction::None)
      shape = operand(1).shape;
    expectShape(true, 0, shape,
                a.reduction == Reduction::None ? "the labels' shape"
                                               : "a scalar for mean and sum");
    break;
  }
  case Op::CrossEntropyGrad: {
    checkLoss(1, 2);
    expectFloat(false, 0);
    std::vector<int64_t> shape;
    if (a.reduction == Reduction::None)
      shape = operand(2).shape;
    expectShape(false, 0, shape,
                a.reduction == Reduction::None ? "the labels' shape"
                                               : "a scalar for mean and sum");
    sameAs(true, 0, 1);
    break;
  }
  case Op::Reshape:
    expectFloat(false, 0);
    if (result(0).numElements != operand(0).numElements)
      failShape(true, 0,
                "a shape of " + std::to_string(operand(0).numElements) +
                    " elements like the input " +
                    shapeString(operand(0).shape));
    break;
  case Op::Transpose: {
    expectFloat(false, 0);
    const auto &in = operand(0).shape;
    const auto &perm = a.permutation;
    std::vector<bool> seen(in.size(), false);
    bool valid = perm.size() == in.size();
    for (int64_t p : perm) {
      if (!valid || p < 0 || p >= static_cast<int64_t>(in.size()) || seen[p]) {
        valid = false;
        break;
      }
      seen[p] = true;
    }
    if (!valid)
      fail(path_ + ".attrs.permutation", shapeString(perm),
           "a permutation of 0.." + std::to_string(in.size()) +
               " (exclusive) for the input's rank " +
               std::to_string(in.size()));
    std::vector<int64_t> shape;
    for (int64_t p : perm)
      shape.push_back(in[p]);
    expectShape(true, 0, shape, "the input's dimensions permuted");
    break;
  }
  case Op::Split:
  case Op::Concat: {
    bool split = inst_.op == Op::Split;
    // `whole` is the unsplit tensor; `pieces` the others.
    bool wholeIsResult = !split;
    const TensorType &whole = type(wholeIsResult, 0);
    size_t count = split ? inst_.results.size() : inst_.operands.size();
    expectFloat(wholeIsResult, 0);
    int64_t axis = normalizeAxis(a.axis, whole.rank());
    int64_t sum = 0;
    for (size_t i = 0; i < count; ++i) {
      const TensorType &piece = type(split, i);
      std::vector<int64_t> expected = whole.shape;
      expected[axis] = piece.rank() == whole.rank() ? piece.shape[axis] : -1;
      if (piece.shape != expected)
        failShape(split, i,
                  "the shape " + shapeString(whole.shape) +
                      " except along axis " + std::to_string(axis));
      sum += piece.shape[axis];
    }
    if (sum != whole.shape[axis])
      failShape(wholeIsResult, 0,
                "a size along axis " + std::to_string(axis) + " of " +
                    std::to_string(sum) + ", the sum of the pieces'");
    break;
  }
  case Op::EmbeddingGrad: {
    expectFloat(false, 0);
    expectIndex(false, 1);
    std::vector<int64_t> ids = operand(1).shape;
    expectMinRank(false, 0, 1);
    int64_t hidden = operand(0).shape.back();
    ids.push_back(hidden);
    expectShape(false, 0, ids, "the ids' shape and the hidden size");
    expectFloat(true, 0);
    expectRank(true, 0, 2);
    if (result(0).shape[1] != hidden)
      failShape(true, 0,
                "[vocab, " + std::to_string(hidden) + "] (the hidden size)");
    break;
  }
  case Op::LayerNormGrad:
  case Op::RmsNormGrad: {
    expectFloat(false, 1);
    expectMinRank(false, 1, 1);
    sameAs(false, 0, 1);
    std::vector<int64_t> hidden = {operand(1).shape.back()};
    expectShape(false, 2, hidden, "the input's last dimension");
    sameAs(true, 0, 1);
    for (size_t i = 1; i < inst_.results.size(); ++i)
      expectShape(true, i, hidden, "the input's last dimension");
    break;
  }
  case Op::LinearWeightGrad: {
    expectFloat(false, 0);
    expectMinRank(false, 0, 1);
    const auto &x = operand(0).shape;
    std::vector<int64_t> dy = x;
    dy.back() =
        operand(1).rank() == operand(0).rank() ? operand(1).shape.back() : -1;
    if (operand(1).shape != dy)
      failShape(false, 1, "the input's leading dimensions, then out");
    int64_t in = x.back(), out = dy.back();
    expectShape(true, 0,
                a.transposeWeight ? std::vector<int64_t>{out, in}
                                  : std::vector<int64_t>{in, out},
                a.transposeWeight ? "[out, in] with transpose_weight"
                                  : "[in, out]");
    break;
  }
  case Op::BiasGrad:
    expectFloat(false, 0);
    expectMinRank(false, 0, 1);
    expectShape(true, 0, {operand(0).shape.back()},
                "the output gradient's last dimension");
    break;
  case Op::GeluGrad:
  case Op::SiluGrad:
    expectFloat(false, 1);
    sameAs(false, 0, 1);
    sameAs(true, 0, 1);
    break;
  case Op::SwigluGrad:
    expectFloat(false, 1);
    sameAs(false, 0, 1);
    sameAs(false, 2, 1);
    sameAs(true, 0, 1);
    sameAs(true, 1, 1);
    break;
  case Op::SoftmaxGrad:
    expectFloat(false, 1);
    normalizeAxis(a.axis, operand(1).rank());
    sameAs(false, 0, 1);
    sameAs(true, 0, 1);
    break;
  }
  (void)name;
  checkOneElementType();
}

/// Every operand and result of an op that is not ids is floating-point, and
/// all of them have one element type, except the loss of cross_entropy and
/// its incoming gradient (f32 whatever the logits' type). The executor relies
/// on this: it sizes and reads every non-id value as its float type.
void OpChecker::checkOneElementType() {
  bool haveFirst = false;
  DType first = DType::F32;
  std::string firstWhere;
  auto isIds = [&](bool isResult, size_t i) {
    switch (inst_.op) {
    case Op::PositionIds:
      return isResult;
    case Op::Embedding:
    case Op::EmbeddingGrad:
    case Op::CrossEntropy:
      return !isResult && i == 1;
    case Op::CrossEntropyGrad:
      return !isResult && i == 2;
    default:
      return false;
    }
  };
  auto visit = [&](bool isResult, size_t i) {
    if (isIds(isResult, i))
      return; // checked by expectIndex
    expectFloat(isResult, i);
    if (inst_.op == Op::CrossEntropy && isResult)
      return;
    if (inst_.op == Op::CrossEntropyGrad && !isResult && i == 0)
      return;
    DType dtype = type(isResult, i).dtype;
    if (!haveFirst) {
      haveFirst = true;
      first = dtype;
      firstWhere = isResult ? "results[" : "operands[";
      firstWhere += std::to_string(i) + "]";
    } else if (dtype != first) {
      fail(where(isResult, i),
           std::string("dtype ") + dtypeName(dtype) + " (value " +
               std::to_string(valueIndex(isResult, i)) + ")",
           std::string(dtypeName(first)) + " like " + firstWhere +
               " (an op has one element type)");
    }
  };
  for (size_t i = 0; i < inst_.operands.size(); ++i)
    visit(false, i);
  for (size_t i = 0; i < inst_.results.size(); ++i)
    visit(true, i);
}

void ManifestReader::readAttributes(const Json *attrs, const std::string &path,
                                    const OpInfo &info, Attributes &out) {
  static const Json kEmpty = Json::object();
  if (!attrs)
    attrs = &kEmpty;
  expectObject(*attrs, path);
  for (auto it = attrs->begin(); it != attrs->end(); ++it) {
    bool known = false;
    for (const AttrSpec &spec : info.attrs)
      known |= it.key() == spec.name;
    if (!known) {
      std::string allowed;
      for (const AttrSpec &spec : info.attrs)
        allowed += std::string(allowed.empty() ? "" : ", ") + spec.name;
      fail(member(path, it.key().c_str()), "an attribute \"" + it.key() + "\"",
           std::string("only the attributes of ") + info.name + " (" +
               (allowed.empty() ? "none" : allowed) + ")");
    }
  }
  for (const AttrSpec &spec : info.attrs) {
    const Json *value = optionalField(*attrs, spec.name);
    std::string at = member(path, spec.name);
    if (!value) {
      if (spec.required)
        fail(at, "nothing (the attribute is missing)",
             std::string("the attribute \"") + spec.name + "\" of " +
                 info.name);
      continue;
    }
    std::string key = spec.name;
    switch (spec.kind) {
    case AttrKind::Bool: {
      bool flag = readBool(*value, at);
      if (key == "transpose_weight")
        out.transposeWeight = flag;
      else if (key == "transpose_lhs")
        out.transposeLhs = flag;
      else if (key == "transpose_rhs")
        out.transposeRhs = flag;
      else if (key == "causal")
        out.causal = flag;
      else if (key == "inverse")
        out.inverse = flag;
      break;
    }
    case AttrKind::Int: {
      if (key == "parameter") {
        int64_t count = static_cast<int64_t>(parameters_->size());
        int64_t p = readInt(*value, at);
        if (p < 0 || p >= count)
          fail(at, std::to_string(p),
               "a parameter index in [0, " + std::to_string(count) +
                   ") (the bundle has " + std::to_string(count) +
                   " parameters)");
        out.parameter = p;
      } else if (key == "seed") {
        out.seed = readInt(*value, at);
      } else if (key == "rotary_dim") {
        out.rotaryDim = readInt(*value, at, 0);
      } else if (key == "axis") {
        out.axis = readInt(*value, at); // normalized by OpChecker
      } else if (key == "ignore_index") {
        out.ignoreIndex = readInt(*value, at);
      }
      break;
    }
    case AttrKind::Number: {
      double number = readNumber(*value, at);
      if (key == "value") {
        out.value = number;
      } else if (key == "epsilon") {
        if (number < 0)
          fail(at, describe(*value), "an epsilon >= 0");
        out.epsilon = number;
      } else if (key == "scale") {
        if (!(number > 0))
          fail(at, describe(*value), "a scale > 0");
        out.scale = number;
      } else if (key == "dropout_p" || key == "p") {
        if (!(number >= 0 && number < 1))
          fail(at, describe(*value), "a probability in [0, 1)");
        (key == "p" ? out.p : out.dropoutP) = number;
      } else if (key == "base") {
        if (!(number > 0))
          fail(at, describe(*value), "a base > 0");
        out.base = number;
      }
      break;
    }
    case AttrKind::String: {
      std::string text = value->is_string() ? value->get<std::string>() : "";
      if (key == "approximate") {
        if (text == "erf")
          out.approximate = GeluApproximate::Erf;
        else if (text == "tanh")
          out.approximate = GeluApproximate::Tanh;
        else
          fail(at, describe(*value), "\"erf\" or \"tanh\"");
      } else if (key == "reduction") {
        if (text == "mean")
          out.reduction = Reduction::Mean;
        else if (text == "sum")
          out.reduction = Reduction::Sum;
        else if (text == "none")
          out.reduction = Reduction::None;
        else
          fail(at, describe(*value), "one of \"mean\", \"sum\", \"none\"");
      }
      break;
    }
    case AttrKind::IntArray: {
      expectArray(*value, at);
      for (size_t i = 0; i < value->size(); ++i)
        out.permutation.push_back(readInt((*value)[i], index(at, i)));
      break;
    }
    }
  }
}

void ManifestReader::readInstruction(const Json &json, const std::string &path,
                                     Function &function, size_t position) {
  expectObject(json, path);
  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string &key = it.key();
    if (key != "op" && key != "operands" && key != "results" &&
        key != "attrs" && key != "free")
      fail(member(path, key.c_str()), "a field \"" + key + "\"",
           "only \"op\", \"operands\", \"results\", \"attrs\" and \"free\"");
  }
  const Json &opJson = field(json, path, "op");
  const OpInfo *info = nullptr;
  if (opJson.is_string())
    for (const OpInfo &candidate : opTable())
      if (opJson.get<std::string>() == candidate.name)
        info = &candidate;
  if (!info)
    fail(member(path, "op"), describe(opJson),
         "an op of the bundle format (docs/BundleFormat.md lists them: "
         "get_parameter, embedding, linear, ...)");

  Instruction inst;
  inst.op = info->op;
  int64_t valueCount = static_cast<int64_t>(function.values.size());
  auto readIndices = [&](const char *key, std::vector<int64_t> &out) {
    const Json *list = optionalField(json, key);
    if (!list)
      return;
    std::string at = member(path, key);
    expectArray(*list, at);
    for (size_t i = 0; i < list->size(); ++i) {
      int64_t v = readInt((*list)[i], index(at, i));
      if (v < 0 || v >= valueCount)
        fail(index(at, i), std::to_string(v),
             "a value index in [0, " + std::to_string(valueCount) + ")");
      out.push_back(v);
    }
  };
  readIndices("operands", inst.operands);
  readIndices("results", inst.results);
  readIndices("free", inst.free);

  auto checkCount = [&](const char *what, size_t count, int min, int max) {
    if (static_cast<int64_t>(count) >= min &&
        static_cast<int64_t>(count) <= max)
      return;
    std::string expected;
    if (min == max)
      expected = std::to_string(min);
    else if (max == kMany)
      expected = "at least " + std::to_string(min);
    else
      expected = std::to_string(min) + " to " + std::to_string(max);
    fail(member(path, what), std::to_string(count) + " " + what,
         expected + " " + what + " for " + info->name);
  };
  checkCount("operands", inst.operands.size(), info->minOperands,
             info->maxOperands);
  checkCount("results", inst.results.size(), info->minResults,
             info->maxResults);

  int64_t here = static_cast<int64_t>(position);
  for (size_t i = 0; i < inst.operands.size(); ++i) {
    int64_t v = inst.operands[i];
    std::string at = index(member(path, "operands"), i);
    if (definedAt_[v] == kUndefined) {
      int64_t later = laterDefinition_[v];
      fail(at,
           "value " + std::to_string(v) +
               (later >= 0 ? ", which is used before it is defined (by "
                             "instructions[" +
                                 std::to_string(later) + "])"
                           : ", which nothing defines"),
           "an input of the function or a result of an earlier instruction");
    }
    if (freedAt_[v] >= 0)
      fail(at,
           "value " + std::to_string(v) + ", freed by instructions[" +
               std::to_string(freedAt_[v]) + "]",
           "a value that is still live (free lists a value's last use)");
  }
  for (size_t i = 0; i < inst.results.size(); ++i) {
    int64_t v = inst.results[i];
    std::string at = index(member(path, "results"), i);
    if (definedAt_[v] != kUndefined)
      fail(at,
           "value " + std::to_string(v) + ", already defined " +
               (definedAt_[v] == kInput
                    ? std::string("as an input")
                    : "by instructions[" + std::to_string(definedAt_[v]) + "]"),
           "a value defined exactly once");
    definedAt_[v] = here;
  }
  readAttributes(optionalField(json, "attrs"), member(path, "attrs"), *info,
                 inst.attrs);
  OpChecker(*this, function, inst, path, *parameters_).check();
  if (inst.op == Op::Softmax || inst.op == Op::SoftmaxGrad ||
      inst.op == Op::Split || inst.op == Op::Concat) {
    const TensorType &t =
        function.values[inst.op == Op::Concat ? inst.results[0]
                                              : inst.operands.back()];
    if (inst.attrs.axis < 0)
      inst.attrs.axis += t.rank();
  }
  if (inst.op == Op::GetParameter)
    parameterView_[inst.results[0]] = true;

  for (size_t i = 0; i < inst.free.size(); ++i) {
    int64_t v = inst.free[i];
    std::string at = index(member(path, "free"), i);
    if (definedAt_[v] == kUndefined)
      fail(at, "value " + std::to_string(v) + ", which is not defined yet",
           "a value defined by this or an earlier instruction");
    if (definedAt_[v] == kInput || isOutput_[v] || parameterView_[v])
      fail(at,
           "value " + std::to_string(v) + ", " +
               (definedAt_[v] == kInput ? "an input"
                : isOutput_[v]          ? "an output"
                                        : "a parameter view"),
           "a value the function owns (inputs, outputs and parameter views "
           "are never freed)");
    if (freedAt_[v] >= 0)
      fail(at,
           "value " + std::to_string(v) + ", already freed by instructions[" +
               std::to_string(freedAt_[v]) + "]",
           "each value freed once");
    freedAt_[v] = here;
  }
  function.instructions.push_back(std::move(inst));
}

void ManifestReader::readFunction(const Json &json, const std::string &path,
                                  Function &out) {
  expectObject(json, path);
  out.name = readString(field(json, path, "name"), member(path, "name"));
  const Json &values = field(json, path, "values");
  expectArray(values, member(path, "values"));
  for (size_t i = 0; i < values.size(); ++i)
    out.values.push_back(
        readTensorType(values[i], index(member(path, "values"), i)));
  int64_t count = static_cast<int64_t>(out.values.size());

  definedAt_.assign(count, kUndefined);
  freedAt_.assign(count, -1);
  parameterView_.assign(count, false);
  isOutput_.assign(count, false);

  for (bool inputs : {true, false}) {
    const char *key = inputs ? "inputs" : "outputs";
    const Json &list = field(json, path, key);
    std::string at = member(path, key);
    expectArray(list, at);
    for (size_t i = 0; i < list.size(); ++i) {
      int64_t v = readInt(list[i], index(at, i));
      if (v < 0 || v >= count)
        fail(index(at, i), std::to_string(v),
             "a value index in [0, " + std::to_string(count) + ")");
      if (inputs) {
        if (definedAt_[v] == kInput)
          fail(index(at, i), "value " + std::to_string(v) + " listed twice",
               "distinct inputs");
        definedAt_[v] = kInput;
        out.inputs.push_back(v);
      } else {
        isOutput_[v] = true;
        out.outputs.push_back(v);
      }
    }
  }

  const Json &instructions = field(json, path, "instructions");
  std::string at = member(path, "instructions");
  expectArray(instructions, at);
  laterDefinition_.assign(count, -1);
  for (size_t i = 0; i < instructions.size(); ++i) {
    const Json &inst = instructions[i];
    if (!inst.is_object() || !inst.contains("results") ||
        !inst["results"].is_array())
      continue;
    for (const Json &v : inst["results"])
      if (v.is_number_integer() && v.get<int64_t>() >= 0 &&
          v.get<int64_t>() < count && laterDefinition_[v.get<int64_t>()] < 0)
        laterDefinition_[v.get<int64_t>()] = static_cast<int64_t>(i);
  }
  for (size_t i = 0; i < instructions.size(); ++i)
    readInstruction(instructions[i], index(at, i), out, i);

  for (int64_t v = 0; v < count; ++v)
    if (definedAt_[v] == kUndefined)
      fail(index(member(path, "values"), v),
           "value " + std::to_string(v) + ", which nothing defines",
           "every value to be an input or the result of exactly one "
           "instruction");
  checkFunctionSignature(out, path);
}

/// The entry points the runtime calls have the signatures the format fixes.
void ManifestReader::checkFunctionSignature(const Function &function,
                                            const std::string &path) {
  bool loss = function.name == "train_step" || function.name == "eval_step";
  bool predict = function.name == "predict_step";
  if (!loss && !predict)
    return;
  size_t inputs = loss ? 2 : 1;
  if (function.inputs.size() != inputs)
    fail(member(path, "inputs"),
         std::to_string(function.inputs.size()) + " inputs",
         std::to_string(inputs) + " for " + function.name +
             (loss ? " (tokens, labels)" : " (tokens)"));
  if (function.outputs.size() != 1)
    fail(member(path, "outputs"),
         std::to_string(function.outputs.size()) + " outputs",
         "1 for " + function.name + (loss ? " (the loss)" : " (the logits)"));
  const TensorType &tokens = function.values[function.inputs[0]];
  for (size_t i = 0; i < inputs; ++i) {
    const TensorType &t = function.values[function.inputs[i]];
    if ((t.dtype != DType::I32 && t.dtype != DType::I64) || t.rank() != 2 ||
        t.shape != tokens.shape)
      fail(index(member(path, "inputs"), i),
           "value " + std::to_string(function.inputs[i]) + " of type " +
               t.str(),
           "[batch, seq] of i32 or i64" +
               std::string(i ? " like the tokens" : ""));
  }
  const TensorType &out = function.values[function.outputs[0]];
  std::string outAt = index(member(path, "outputs"), 0);
  if (loss && (!isFloatingPoint(out.dtype) || out.rank() != 0))
    fail(outAt,
         "value " + std::to_string(function.outputs[0]) + " of type " +
             out.str(),
         "a floating-point scalar (the loss)");
  if (predict &&
      (!isFloatingPoint(out.dtype) || out.rank() != 3 ||
       out.shape[0] != tokens.shape[0] || out.shape[1] != tokens.shape[1]))
    fail(outAt,
         "value " + std::to_string(function.outputs[0]) + " of type " +
             out.str(),
         "floating-point logits [" + std::to_string(tokens.shape[0]) + ", " +
             std::to_string(tokens.shape[1]) + ", vocab]");
}

Bundle ManifestReader::read(std::string_view text) {
  Json root;
  try {
    // Depth is bounded so that hostile nesting cannot exhaust the stack of
    // whatever walks the tree afterwards.
    root = Json::parse(
        text.begin(), text.end(), [&](int depth, Json::parse_event_t, Json &) {
          if (depth > 64)
            fail("manifest", "JSON nested more than 64 levels deep",
                 "the manifest's schema (at most a few levels)");
          return true;
        });
  } catch (const Json::parse_error &e) {
    fail("manifest", "text that is not JSON (" + std::string(e.what()) + ")",
         "UTF-8 JSON");
  }
  expectObject(root, "manifest");

  const Json &format = field(root, "", "format");
  if (!format.is_string() || format.get<std::string>() != "megatron-bundle")
    fail("format", describe(format), "\"megatron-bundle\"");
  int64_t version = readInt(field(root, "", "version"), "version");
  if (version != Bundle::kFormatVersion)
    fail("version", std::to_string(version),
         std::to_string(Bundle::kFormatVersion) +
             ", the version in the file's header");

  Bundle bundle;
  bundle.name_ = name_;
  bundle.producer_ = readString(field(root, "", "producer"), "producer");
  readModel(field(root, "", "model"), "model", bundle.model_);
  readParameters(field(root, "", "parameters"), "parameters",
                 bundle.parameters_);
  parameters_ = &bundle.parameters_;

  const Json &functions = field(root, "", "functions");
  expectArray(functions, "functions");
  std::set<std::string> names;
  for (size_t i = 0; i < functions.size(); ++i) {
    Function function;
    readFunction(functions[i], index("functions", i), function);
    if (!names.insert(function.name).second)
      fail(index("functions", i) + ".name", "\"" + function.name + "\"",
           "a name no other function has");
    bundle.functions_.push_back(std::move(function));
  }
  return bundle;
}

//===----------------------------------------------------------------------===//
// The container
//===----------------------------------------------------------------------===//

Bundle Bundle::parseManifest(std::string_view name, std::string_view json) {
  return ManifestReader(name).read(json);
}

Bundle Bundle::parse(std::string_view name, const uint8_t *data, size_t size) {
  ManifestReader reader(name);
  auto dataLoss = [&](const std::string &path, const std::string &found,
                      const std::string &expected) {
    reader.fail(path, found, expected, MTRT_STATUS_DATA_LOSS);
  };
  if (size < kHeaderSize)
    dataLoss("header", std::to_string(size) + " bytes (the file is truncated)",
             "a 64-byte header at least");
  if (std::memcmp(data, "MTBUNDLE", 8) != 0) {
    std::string found;
    for (int i = 0; i < 8; ++i) {
      char c = static_cast<char>(data[i]);
      found += (c >= 32 && c < 127) ? std::string(1, c) : "\\x..";
    }
    reader.fail("header.magic (offset 0)",
                "\"" + found + "\" (this is not a bundle file)",
                "the bytes \"MTBUNDLE\"");
  }
  uint32_t version = readU32(data + 8);
  if (version != kFormatVersion)
    reader.fail("header.version (offset 8)", std::to_string(version),
                std::to_string(kFormatVersion) +
                    " (this runtime reads format version 1; rebuild the "
                    "bundle with a megatron-compile of the same release)",
                MTRT_STATUS_UNIMPLEMENTED);
  uint32_t flags = readU32(data + 12);
  if (flags != 0)
    reader.fail("header.flags (offset 12)", std::to_string(flags),
                "0 (no flags are defined in format version 1)");
  uint64_t manifestLength = readU64(data + 16);
  uint64_t payloadLength = readU64(data + 24);
  uint64_t available = size - kHeaderSize;
  if (manifestLength > available)
    dataLoss("header.manifest_length (offset 16)",
             std::to_string(manifestLength) + " bytes",
             "at most the " + std::to_string(available) +
                 " bytes after the header (the file is truncated or the "
                 "length corrupted)");
  if (payloadLength > available - manifestLength)
    dataLoss("header.payload_length (offset 24)",
             std::to_string(payloadLength) + " bytes",
             "at most the " + std::to_string(available - manifestLength) +
                 " bytes after the manifest (the file is truncated or the "
                 "length corrupted)");
  if (manifestLength + payloadLength != available)
    dataLoss("header", std::to_string(size) + " bytes in the file",
             "exactly 64 + " + std::to_string(manifestLength) + " + " +
                 std::to_string(payloadLength) + " = " +
                 std::to_string(kHeaderSize + manifestLength + payloadLength) +
                 " bytes (header + manifest + payload)");
  if (payloadLength != 0)
    reader.fail("header.payload_length (offset 24)",
                std::to_string(payloadLength), "0 in format version 1");
  Sha256Digest digest = sha256(data + kHeaderSize, available);
  Sha256Digest stored;
  std::memcpy(stored.data(), data + 32, stored.size());
  if (digest != stored)
    dataLoss("header.sha256 (offset 32)",
             "a SHA-256 of the manifest and payload of " + toHex(digest) +
                 " (the file is corrupted)",
             "the stored " + toHex(stored));
  return reader.read(std::string_view(
      reinterpret_cast<const char *>(data + kHeaderSize), manifestLength));
}

Bundle Bundle::load(const std::string &path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file)
    throw Error(MTRT_STATUS_NOT_FOUND,
                "bundle '" + path + "': cannot open it (" +
                    std::strerror(errno) +
                    "); check the path, or write it with megatron-compile "
                    "MODEL -o " +
                    path);
  std::streamoff size = file.tellg();
  if (size < 0)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "bundle '" + path +
                    "': cannot tell its size (not a regular file?)");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  file.seekg(0);
  if (size > 0 && !file.read(reinterpret_cast<char *>(bytes.data()), size))
    throw Error(MTRT_STATUS_DATA_LOSS, "bundle '" + path + "': reading " +
                                           std::to_string(size) +
                                           " bytes failed");
  return parse(path, bytes.data(), bytes.size());
}

} // namespace mtrt
