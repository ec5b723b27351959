// Reads bundle files: the JSON manifest and its schema (docs/BundleFormat.md).
#include "core/BundleReader.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace mtrt::bundle_detail {

std::string describe(const Json &json, size_t limit) {
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

void ManifestReader::expectKnownKeys(const Json &object,
                                     const std::string &path,
                                     std::initializer_list<const char *> known,
                                     const char *what) {
  if (!object.is_object())
    return;
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool listed = false;
    for (const char *key : known)
      listed |= it.key() == key;
    if (listed)
      continue;
    std::string keys;
    for (const char *key : known)
      keys += std::string(keys.empty() ? "" : ", ") + key;
    fail(member(path, it.key().c_str()), "a field \"" + it.key() + "\"",
         std::string("only the fields of ") + what + " (" + keys +
             ") of format version " + std::to_string(version_) +
             " (docs/bundle-manifest.schema.json); a field this runtime does "
             "not know comes from another compiler: recompile the bundle "
             "with the megatron-compile of this runtime's release");
  }
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
       "one of \"f32\", \"f64\", \"bf16\", \"f16\", \"i32\", \"i64\", "
       "\"f8e4m3\", \"f8e5m2\"");
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

void ManifestReader::readFp8(const Json &json, const std::string &path,
                             Fp8Settings &out) {
  expectObject(json, path);
  expectKnownKeys(json, path,
                  {"format", "scaling", "amax_history_len",
                   "amax_compute_algo", "margin", "metas"},
                  "the fp8 section");
  auto choice = [&](const char *key, std::initializer_list<const char *> ok,
                    const char *expected) {
    const Json &value = field(json, path, key);
    std::string text = value.is_string() ? value.get<std::string>() : "";
    for (const char *candidate : ok)
      if (text == candidate)
        return text;
    fail(member(path, key), describe(value), expected);
  };
  out.format = choice("format", {"e4m3", "hybrid"}, "\"e4m3\" or \"hybrid\"");
  out.scaling = choice("scaling", {"delayed", "tensorwise"},
                       "\"delayed\" or \"tensorwise\"");
  out.amaxComputeAlgo = choice("amax_compute_algo", {"max", "most_recent"},
                               "\"max\" or \"most_recent\"");
  out.amaxHistoryLen =
      readInt(field(json, path, "amax_history_len"),
              member(path, "amax_history_len"), 1);
  if (out.amaxHistoryLen > (int64_t(1) << 20))
    fail(member(path, "amax_history_len"), std::to_string(out.amaxHistoryLen),
         "at most 2^20 amaxes");
  out.margin = readInt(field(json, path, "margin"), member(path, "margin"), 0);
  if (out.margin > 64)
    fail(member(path, "margin"), std::to_string(out.margin),
         "a margin from 0 to 64");
  const Json &metas = field(json, path, "metas");
  std::string metasAt = member(path, "metas");
  expectArray(metas, metasAt);
  std::set<std::string> names;
  for (size_t i = 0; i < metas.size(); ++i) {
    std::string at = index(metasAt, i);
    expectObject(metas[i], at);
    expectKnownKeys(metas[i], at, {"name", "format", "pipeline_rank"},
                    "an FP8 meta");
    Fp8Meta meta;
    meta.name = readString(field(metas[i], at, "name"), member(at, "name"));
    if (!names.insert(meta.name).second)
      fail(member(at, "name"), "\"" + meta.name + "\"",
           "a name no other meta has");
    meta.format = readDType(field(metas[i], at, "format"), member(at, "format"));
    if (!isFp8(meta.format))
      fail(member(at, "format"), dtypeName(meta.format),
           "\"f8e4m3\" or \"f8e5m2\"");
    if (const Json *rank = optionalField(metas[i], "pipeline_rank"))
      meta.pipelineRank = readInt(*rank, member(at, "pipeline_rank"), 0,
                                  grid_.empty() ? 0 : grid_[0] - 1);
    out.metas.push_back(std::move(meta));
  }
}

void ManifestReader::readModel(const Json &json, const std::string &path,
                               ModelConfig &out) {
  expectObject(json, path);
  expectKnownKeys(json, path,
                  {"name", "num_layers", "hidden_size", "num_attention_heads",
                   "num_query_groups", "ffn_hidden_size", "seq_length",
                   "vocab_size", "padded_vocab_size", "micro_batch_size",
                   "global_batch_size", "tensor_model_parallel_size",
                   "pipeline_model_parallel_size", "data_parallel_size",
                   "precision"},
                  "the model section");
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

void ManifestReader::readGrid(const Json &json, const std::string &path,
                              std::vector<int64_t> &out) {
  expectObject(json, path);
  expectKnownKeys(json, path, {"shape"}, "the grid");
  std::string at = member(path, "shape");
  const Json &shape = field(json, path, "shape");
  expectArray(shape, at);
  if (shape.empty())
    fail(at, "[]", "at least one grid axis ([dp, tp])");
  int64_t ranks = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t size = readInt(shape[i], index(at, i), 1, kMaxGridRanks);
    ranks *= size;
    if (ranks > kMaxGridRanks)
      fail(at, "shape " + describe(shape),
           "a grid of at most " + std::to_string(kMaxGridRanks) +
               " ranks (the product of the sizes)");
    out.push_back(size);
  }
}

std::vector<int64_t> ManifestReader::readGridAxes(const Json &json,
                                                  const std::string &path) {
  expectArray(json, path);
  int64_t rank = static_cast<int64_t>(grid_.size());
  std::vector<int64_t> axes;
  for (size_t i = 0; i < json.size(); ++i) {
    int64_t axis = readInt(json[i], index(path, i));
    if (axis < 0 || axis >= rank)
      fail(index(path, i), std::to_string(axis),
           "a grid axis in [0, " + std::to_string(rank) + ") (the grid is " +
               shapeString(grid_) + ")");
    if (std::find(axes.begin(), axes.end(), axis) != axes.end())
      fail(index(path, i), std::to_string(axis) + ", listed twice",
           "each grid axis at most once");
    axes.push_back(axis);
  }
  return axes;
}

void ManifestReader::readSplitAxes(const Json &json, const std::string &path,
                                   Parameter &parameter) {
  if (grid_.empty())
    fail(path, describe(json),
         "no split_axes in a bundle without a top-level \"grid\"");
  expectArray(json, path);
  const std::vector<int64_t> &shape = parameter.type.shape;
  if (json.size() != shape.size())
    fail(path, std::to_string(json.size()) + " lists",
         "one list per dimension of the shape " + shapeString(shape));
  std::vector<int64_t> used;
  parameter.localType = parameter.type;
  for (size_t d = 0; d < json.size(); ++d) {
    std::string at = index(path, d);
    std::vector<int64_t> axes = readGridAxes(json[d], at);
    for (size_t i = 0; i < axes.size(); ++i) {
      if (std::find(used.begin(), used.end(), axes[i]) != used.end())
        fail(index(at, i), std::to_string(axes[i]),
             "a grid axis that splits no other dimension");
      used.push_back(axes[i]);
    }
    int64_t ways = gridGroupSize(grid_, axes);
    if (shape[d] % ways != 0)
      fail(at, shapeString(axes) + " (" + std::to_string(ways) + " ways)",
           "axes whose sizes' product divides dimension " + std::to_string(d) +
               " of the shape " + shapeString(shape));
    parameter.localType.shape[d] = shape[d] / ways;
    parameter.localType.numElements = parameter.localType.numElements / ways;
    parameter.splitAxes.push_back(std::move(axes));
  }
  if (used.empty())
    parameter.splitAxes.clear();
}

void ManifestReader::readParameters(const Json &json, const std::string &path,
                                    std::vector<Parameter> &out) {
  expectArray(json, path);
  std::map<std::string, size_t> names;
  for (size_t i = 0; i < json.size(); ++i) {
    std::string at = index(path, i);
    const Json &entry = json[i];
    expectObject(entry, at);
    expectKnownKeys(entry, at,
                    {"name", "shape", "dtype", "init", "std", "weight_decay",
                     "expert_bias_update_rate", "split_axes", "pipeline_rank",
                     "pipeline_ranks"},
                    "a parameter");
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
    parameter.localType = parameter.type;
    if (const Json *split = optionalField(entry, "split_axes"))
      readSplitAxes(*split, member(at, "split_axes"), parameter);
    if (const Json *rate = optionalField(entry, "expert_bias_update_rate")) {
      std::string where = member(at, "expert_bias_update_rate");
      parameter.expertBiasUpdateRate = readNumber(*rate, where);
      if (!(parameter.expertBiasUpdateRate > 0) ||
          !std::isfinite(parameter.expertBiasUpdateRate))
        fail(where, describe(*rate), "a finite update rate > 0");
      if (parameter.type.rank() != 1 || parameter.type.dtype != DType::F32 ||
          parameter.weightDecay || !parameter.splitAxes.empty())
        fail(at, "\"" + parameter.name + "\"",
             "an expert bias (expert_bias_update_rate) that is one f32 per "
             "expert, whole on every rank, without weight decay");
    }
    if (const Json *rank = optionalField(entry, "pipeline_rank")) {
      parameter.pipelineRank =
          readInt(*rank, member(at, "pipeline_rank"), 0,
                  grid_.empty() ? 0 : grid_[0] - 1);
      parameter.pipelineRanks = {parameter.pipelineRank};
    }
    if (const Json *ranks = optionalField(entry, "pipeline_ranks"))
      readPipelineRanks(*ranks, member(at, "pipeline_ranks"), parameter);
    out.push_back(std::move(parameter));
  }
}

/// A parameter held on several pipeline ranks (format version 7): its
/// embedding group, the owner (pipeline_rank) first.
void ManifestReader::readPipelineRanks(const Json &json,
                                       const std::string &path,
                                       Parameter &parameter) {
  if (version_ < 7)
    fail(path, "pipeline_ranks in a version " + std::to_string(version_) +
                   " manifest",
         "none before format version 7 (the version is wrong or the "
         "manifest was edited)");
  if (parameter.pipelineRank < 0)
    fail(path, "pipeline_ranks without pipeline_rank",
         "pipeline_rank beside it: the pipeline rank that owns the "
         "parameter, its first entry");
  expectArray(json, path);
  if (json.size() < 2)
    fail(path, describe(json),
         "at least two pipeline ranks (a parameter on one rank has "
         "pipeline_rank only)");
  std::vector<int64_t> ranks;
  for (size_t i = 0; i < json.size(); ++i) {
    int64_t rank =
        readInt(json[i], index(path, i), 0, grid_.empty() ? 0 : grid_[0] - 1);
    if (!ranks.empty() && rank <= ranks.back())
      fail(index(path, i), std::to_string(rank),
           "a pipeline rank above " + std::to_string(ranks.back()) +
               " (the list is increasing)");
    ranks.push_back(rank);
  }
  if (ranks.front() != parameter.pipelineRank)
    fail(index(path, 0), std::to_string(ranks.front()),
         "the parameter's pipeline_rank " +
             std::to_string(parameter.pipelineRank) +
             " (the owner comes first)");
  parameter.pipelineRanks = std::move(ranks);
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
      else if (key == "truncate")
        out.truncate = flag;
      else if (key == "loss_seed")
        out.lossSeed = flag;
      else if (key == "normalize")
        out.normalize = flag;
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
      } else if (key == "original_max_positions") {
        out.originalMaxPositions = readInt(*value, at, 1);
      } else if (key == "kernel") {
        out.kernel = readInt(*value, at, 0); // bounded by readFusedBody
      } else if (key == "axis") {
        out.axis = readInt(*value, at); // normalized by OpChecker
      } else if (key == "ignore_index") {
        out.ignoreIndex = readInt(*value, at);
      } else if (key == "chunk_rows") {
        out.chunkRows = readInt(*value, at, 1);
      } else if (key == "whole_rows") {
        out.wholeRows = readInt(*value, at, 1);
      } else if (key == "context_axis") {
        out.contextAxis = readInt(*value, at, 0);
      } else if (key == "context_size") {
        out.contextSize = readInt(*value, at, 1);
      } else if (key == "key_step") {
        out.keyStep = readInt(*value, at, 0);
      } else if (key == "shift_axis") {
        out.shiftAxis = readInt(*value, at, 0); // one of grid_axes: OpChecker
      } else if (key == "offset") {
        out.offset = readInt(*value, at);
      } else if (key == "meta") {
        int64_t count =
            fp8_ ? static_cast<int64_t>(fp8_->metas.size()) : int64_t(0);
        int64_t m = readInt(*value, at);
        if (m < 0 || m >= count)
          fail(at, std::to_string(m),
               "an FP8 meta index in [0, " + std::to_string(count) +
                   ") (the bundle's fp8 section has " +
                   std::to_string(count) + " metas)");
        out.meta = m;
      } else if (key == "margin") {
        out.margin = readInt(*value, at, 0);
        if (out.margin > 64)
          fail(at, std::to_string(out.margin), "a margin from 0 to 64");
      } else if (key == "topk") {
        out.topk = readInt(*value, at, 1); // at most E: OpChecker
      } else if (key == "num_groups") {
        out.numGroups = readInt(*value, at, 1); // divides E: OpChecker
      } else if (key == "group_topk") {
        out.groupTopk = readInt(*value, at, 1);
      } else if (key == "sequence_length") {
        out.sequenceLength = readInt(*value, at, 1); // divides T: OpChecker
      } else if (key == "concat_axis") {
        out.concatAxis = readInt(*value, at);
      } else if (key == "num_experts") {
        out.numExperts = readInt(*value, at, 1);
      } else if (key == "expert_ranks") {
        out.expertRanks = readInt(*value, at, 1);
      } else if (key == "gather_axis" || key == "scatter_axis" ||
                 key == "slice_axis" || key == "split_axis") {
        out.axis = readInt(*value, at); // normalized by OpChecker
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
      } else if (key == "scaling_factor" || key == "low_freq_factor" ||
                 key == "high_freq_factor") {
        if (!(number > 0) || !std::isfinite(number))
          fail(at, describe(*value), "a finite factor > 0");
        (key == "scaling_factor"  ? out.scalingFactor
         : key == "low_freq_factor" ? out.lowFreqFactor
                                    : out.highFreqFactor) = number;
      } else if (key == "beta_fast" || key == "beta_slow" ||
                 key == "attention_factor") {
        if (!(number > 0) || !std::isfinite(number))
          fail(at, describe(*value), "a finite number > 0");
        (key == "beta_fast"   ? out.betaFast
         : key == "beta_slow" ? out.betaSlow
                              : out.attentionFactor) = number;
      } else if (key == "capacity_factor") {
        if (!(number > 0))
          fail(at, describe(*value), "a capacity factor > 0");
        out.capacityFactor = number;
      } else if (key == "coeff") {
        if (!(number >= 0))
          fail(at, describe(*value), "a loss coefficient >= 0");
        out.coeff = number;
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
      } else if (key == "reduction" &&
                 (info.op == Op::AllReduce || info.op == Op::ReduceScatter)) {
        if (text == "sum")
          out.collectiveReduction = CollectiveReduction::Sum;
        else if (text == "max")
          out.collectiveReduction = CollectiveReduction::Max;
        else
          fail(at, describe(*value), "\"sum\" or \"max\"");
      } else if (key == "format") {
        if (text == "f8e4m3")
          out.fp8Format = DType::F8E4M3;
        else if (text == "f8e5m2")
          out.fp8Format = DType::F8E5M2;
        else
          fail(at, describe(*value), "\"f8e4m3\" or \"f8e5m2\"");
      } else if (key == "score_function") {
        if (text == "softmax" || text == "sigmoid")
          out.sigmoid = text == "sigmoid";
        else
          fail(at, describe(*value), "\"softmax\" or \"sigmoid\"");
      } else if (key == "drop_policy") {
        if (text == "probs" || text == "position")
          out.dropByPosition = text == "position";
        else
          fail(at, describe(*value), "\"probs\" or \"position\"");
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
    case AttrKind::AxesList: {
      if (grid_.empty())
        fail(at, describe(*value),
             std::string("no split_axes (") + info.name +
                 ") in a bundle without a top-level \"grid\"");
      expectArray(*value, at);
      std::vector<int64_t> used;
      for (size_t d = 0; d < value->size(); ++d) {
        std::vector<int64_t> axes = readGridAxes((*value)[d], index(at, d));
        for (size_t i = 0; i < axes.size(); ++i) {
          if (std::find(used.begin(), used.end(), axes[i]) != used.end())
            fail(index(index(at, d), i), std::to_string(axes[i]),
                 "a grid axis that splits no other dimension");
          used.push_back(axes[i]);
        }
        out.splitAxes.push_back(std::move(axes));
      }
      break;
    }
    case AttrKind::IntArray: {
      if (key == "grid_axes") {
        if (grid_.empty())
          fail(at, describe(*value),
               std::string("no collective (") + info.name +
                   ") in a bundle without a top-level \"grid\"");
        out.gridAxes = readGridAxes(*value, at);
        break;
      }
      if (key == "vocab_shard_axes") {
        if (grid_.empty())
          fail(at, describe(*value),
               std::string("no vocab_shard_axes (") + info.name +
                   ") in a bundle without a top-level \"grid\"");
        out.vocabShardAxes = readGridAxes(*value, at);
        break;
      }
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
  expectKnownKeys(json, path,
                  {"op", "operands", "results", "attrs", "free", "body"},
                  "an instruction");
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
    if (function.innerValue[v])
      fail(at,
           "value " + std::to_string(v) + ", computed inside the fused "
           "group of instructions[" + std::to_string(definedAt_[v]) + "]",
           "a value that leaves its group (one of the group's results)");
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
    // A group's results are defined by its body.
    if (inst.op != Op::Fused)
      definedAt_[v] = here;
  }
  readAttributes(optionalField(json, "attrs"), member(path, "attrs"), *info,
                 inst.attrs);
  const Json *body = optionalField(json, "body");
  if ((body != nullptr) != (inst.op == Op::Fused))
    fail(member(path, "body"), body ? "a body" : "no body",
         inst.op == Op::Fused ? "the group's ops (\"body\") for fused"
                              : "a body only on fused instructions");
  if (body)
    readFusedBody(*body, member(path, "body"), function, position, inst);
  OpChecker(*this, function, inst, path, *parameters_).check();
  if (inst.op == Op::Softmax || inst.op == Op::SoftmaxGrad ||
      inst.op == Op::Split || inst.op == Op::Concat ||
      inst.op == Op::AllGather || inst.op == Op::ReduceScatter ||
      inst.op == Op::AllSlice) {
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

void ManifestReader::readFusedBody(const Json &json, const std::string &path,
                                   Function &function, size_t position,
                                   Instruction &inst) {
  expectArray(json, path);
  if (inst.attrs.kernel >= static_cast<int64_t>(kernelCount_))
    fail(member(path.substr(0, path.size() - 5), "attrs") + ".kernel",
         std::to_string(inst.attrs.kernel),
         "the index of one of the bundle's " + std::to_string(kernelCount_) +
             " fused kernels (the manifest's \"kernels\" section)");
  int64_t here = static_cast<int64_t>(position);
  // The values the body may read: the group's operands, then its results.
  std::set<int64_t> readable(inst.operands.begin(), inst.operands.end());
  std::vector<Instruction> outer = std::move(function.instructions);
  function.instructions.clear();
  for (size_t i = 0; i < json.size(); ++i) {
    std::string at = index(path, i);
    const Json &op = json[i];
    if (op.is_object())
      for (const char *key : {"operands", "results"})
        if (const Json *list = optionalField(op, key); list && list->is_array())
          for (size_t j = 0; j < list->size(); ++j) {
            const Json &v = (*list)[j];
            if (!v.is_number_integer())
              continue;
            int64_t value = v.get<int64_t>();
            bool isOperand = key[0] == 'o';
            if (isOperand && !readable.count(value))
              fail(index(member(at, key), j), "value " + std::to_string(value),
                   "an operand of the group or a result of an earlier op of "
                   "its body");
          }
    readInstruction(op, at, function, position);
    const Instruction &read = function.instructions.back();
    bool fusible = read.op == Op::Add || read.op == Op::Mul ||
                   read.op == Op::Silu || read.op == Op::Swiglu ||
                   (read.op == Op::Dropout && read.attrs.splitAxes.empty());
    // A column sum (new within version 10) of a result the group stores.
    bool columnSum = read.op == Op::BiasGrad &&
                     std::find(inst.results.begin(), inst.results.end(),
                               read.operands[0]) != inst.results.end() &&
                     std::find(inst.results.begin(), inst.results.end(),
                               read.results[0]) != inst.results.end();
    if (!fusible && !columnSum)
      fail(member(at, "op"), std::string("\"") + opName(read.op) + "\"",
           "an elementwise op a fused kernel computes (add, mul, dropout "
           "without split_axes, silu, swiglu), or a bias_grad of a result "
           "of the group into another (a column sum)");
    if (!read.free.empty())
      fail(member(at, "free"), "a free list",
           "none inside a group (the fused instruction frees its operands)");
    readable.insert(read.results.begin(), read.results.end());
  }
  inst.body = std::move(function.instructions);
  function.instructions = std::move(outer);
  if (inst.body.empty())
    fail(path, "[]", "at least one op");
  for (size_t i = 0; i < inst.results.size(); ++i)
    if (definedAt_[inst.results[i]] != here)
      fail(index(path.substr(0, path.size() - 5) + ".results", i),
           "value " + std::to_string(inst.results[i]) +
               ", which no op of the body defines",
           "each result of a group defined by one of its ops");
  for (const Instruction &op : inst.body)
    for (int64_t v : op.results)
      if (std::find(inst.results.begin(), inst.results.end(), v) ==
          inst.results.end())
        function.innerValue[v] = true;
}

void ManifestReader::readFusedKernels(const Json &json,
                                      const std::string &path,
                                      std::string_view payload,
                                      FusedKernels &out) {
  expectObject(json, path);
  expectKnownKeys(json, path, {"arch", "names", "cubin", "ptx", "source"},
                  "the kernels section");
  out.arch = readString(field(json, path, "arch"), member(path, "arch"));
  const Json &names = field(json, path, "names");
  expectArray(names, member(path, "names"));
  for (size_t i = 0; i < names.size(); ++i)
    out.names.push_back(readString(names[i], index(member(path, "names"), i)));
  auto blob = [&](const char *key) {
    std::string at = member(path, key);
    const Json &range = field(json, path, key);
    expectObject(range, at);
    expectKnownKeys(range, at, {"offset", "size"}, "a payload range");
    int64_t size = static_cast<int64_t>(payload.size());
    int64_t offset =
        readInt(field(range, at, "offset"), member(at, "offset"), 0, size);
    int64_t length = readInt(field(range, at, "size"), member(at, "size"), 0,
                             size - offset);
    return std::string(payload.substr(static_cast<size_t>(offset),
                                      static_cast<size_t>(length)));
  };
  out.cubin = blob("cubin");
  out.ptx = blob("ptx");
  out.source = blob("source");
}

void ManifestReader::readFunction(const Json &json, const std::string &path,
                                  Function &out) {
  expectObject(json, path);
  expectKnownKeys(
      json, path,
      {"name", "inputs", "outputs", "output_names", "values", "instructions",
       "memory_plan"},
      "a function");
  out.name = readString(field(json, path, "name"), member(path, "name"));
  const Json &values = field(json, path, "values");
  expectArray(values, member(path, "values"));
  for (size_t i = 0; i < values.size(); ++i) {
    std::string at = index(member(path, "values"), i);
    expectKnownKeys(values[i], at, {"shape", "dtype"}, "a value");
    out.values.push_back(readTensorType(values[i], at));
  }
  int64_t count = static_cast<int64_t>(out.values.size());

  definedAt_.assign(count, kUndefined);
  freedAt_.assign(count, -1);
  out.innerValue.assign(count, false);
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

  if (const Json *names = optionalField(json, "output_names"))
    readOutputNames(*names, member(path, "output_names"), out);

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
  if (const Json *plan = optionalField(json, "memory_plan"))
    readMemoryPlan(*plan, member(path, "memory_plan"), out);
}

void ManifestReader::readOutputNames(const Json &json, const std::string &path,
                                     Function &out) {
  if (version_ < 12)
    fail(path,
         "output_names in a version " + std::to_string(version_) + " manifest",
         "none before format version 12 (the version is wrong or the "
         "manifest was edited)");
  if (out.name != "train_step")
    fail(path, "output_names of '" + out.name + "'",
         "output_names on train_step only");
  expectArray(json, path);
  if (json.size() != out.outputs.size() || json.size() < 2)
    fail(path, std::to_string(json.size()) + " names",
         "one per output (" + std::to_string(out.outputs.size()) +
             "), at least loss and aux_loss");
  for (size_t i = 0; i < json.size(); ++i) {
    std::string at = index(path, i);
    std::string name = readString(json[i], at);
    bool known = i == 0 ? name == "loss"
                        : name == kAuxLossName ||
                              std::find(std::begin(kLoggedMoeLosses),
                                        std::end(kLoggedMoeLosses),
                                        name) != std::end(kLoggedMoeLosses);
    if (!known)
      fail(at, "'" + name + "'",
           i == 0 ? std::string("'loss' (the first output)")
                  : "one of aux_loss, load_balancing_loss, "
                    "seq_load_balancing_loss, z_loss");
    if (std::find(out.outputNames.begin(), out.outputNames.end(), name) !=
        out.outputNames.end())
      fail(at, "'" + name + "' twice", "distinct names");
    const TensorType &t = out.values[out.outputs[i]];
    if (t.dtype != DType::F32 || t.rank() != 0)
      fail(at, "'" + name + "' of type " + t.str(), "an f32 scalar");
    out.outputNames.push_back(std::move(name));
  }
  if (out.outputNames[1] != kAuxLossName)
    fail(index(path, 1), "'" + out.outputNames[1] + "'",
         "'aux_loss' second (the auxiliary losses that the loss includes)");
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
  if (function.outputs.size() != 1 && function.outputNames.empty())
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
  if (predict && (!isFloatingPoint(out.dtype) || out.rank() != 3 ||
                  out.shape[0] != tokens.shape[0] ||
                  out.shape[1] != tokens.shape[1]))
    fail(outAt,
         "value " + std::to_string(function.outputs[0]) + " of type " +
             out.str(),
         "floating-point logits [" + std::to_string(tokens.shape[0]) + ", " +
             std::to_string(tokens.shape[1]) + ", vocab]");
}

Bundle ManifestReader::read(std::string_view text, std::string_view payload) {
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
  if (version < Bundle::kOldestFormatVersion ||
      version > Bundle::kFormatVersion)
    fail("version", std::to_string(version),
         std::to_string(Bundle::kOldestFormatVersion) + " to " +
             std::to_string(Bundle::kFormatVersion) +
             ", the version in the file's header");
  version_ = version;
  expectKnownKeys(root, "",
                  {"format", "version", "producer", "model", "grid",
                   "parameters", "functions", "kernels", "gradient_buffer",
                   "gradient_buffers", "pipeline", "fp8"},
                  "the manifest");

  Bundle bundle;
  bundle.name_ = name_;
  bundle.typedPrecision_ = version >= 8;
  bundle.producer_ = readString(field(root, "", "producer"), "producer");
  if (const Json *model = optionalField(root, "model")) {
    readModel(*model, "model", bundle.model_);
    bundle.hasModel_ = true;
  }
  if (const Json *grid = optionalField(root, "grid"))
    readGrid(*grid, "grid", grid_);
  bundle.gridShape_ = grid_;
  readParameters(field(root, "", "parameters"), "parameters",
                 bundle.parameters_);
  parameters_ = &bundle.parameters_;
  if (const Json *fp8 = optionalField(root, "fp8")) {
    bundle.fp8_.emplace();
    readFp8(*fp8, "fp8", *bundle.fp8_);
    fp8_ = &*bundle.fp8_;
  }
  if (const Json *kernels = optionalField(root, "kernels")) {
    if (version < 3)
      fail("kernels", "a kernels section in a version " +
                          std::to_string(version) + " manifest",
           "none before format version 3");
    readFusedKernels(*kernels, "kernels", payload, bundle.fusedKernels_);
    bundle.fusedKernels_.typeMask = version >= 6;
    bundle.fusedKernels_.sampleKeys = version >= 7;
    bundle.fusedKernels_.fourPositionDraws = version >= 10;
    bundle.fusedKernels_.version = version;
  }
  kernelCount_ = bundle.fusedKernels_.names.size();

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
  if (const Json *pipeline = optionalField(root, "pipeline"))
    readPipeline(*pipeline, "pipeline", bundle);
  checkStageParameters(bundle);
  if (const Json *buffer = optionalField(root, "gradient_buffer")) {
    if (version < 2)
      fail("gradient_buffer", "a gradient_buffer in a version " +
                                  std::to_string(version) + " manifest",
           "none before format version 2 (the version is wrong or the "
           "manifest was edited)");
    if (bundle.pipeline())
      fail("gradient_buffer", "a gradient_buffer in a pipeline bundle",
           "gradient_buffers, one per pipeline rank (format version 7; "
           "recompile the bundle)");
    GradientBuffer out;
    readGradientBuffer(*buffer, "gradient_buffer", bundle, out);
    bundle.gradientBuffers_.push_back(std::move(out));
  }
  if (const Json *buffers = optionalField(root, "gradient_buffers")) {
    if (version < 7)
      fail("gradient_buffers", "gradient_buffers in a version " +
                                   std::to_string(version) + " manifest",
           "none before format version 7 (the version is wrong or the "
           "manifest was edited)");
    if (!bundle.gradientBuffers_.empty())
      fail("gradient_buffers", "both gradient_buffer and gradient_buffers",
           "one of them: gradient_buffers in a pipeline bundle, "
           "gradient_buffer otherwise");
    readGradientBuffers(*buffers, "gradient_buffers", bundle);
  }
  return bundle;
}

/// Whether `parameter` is split over any of `axes` (expert parallelism's
/// experts over a gradient buffer's data axes).
/// Whether a gradient buffer's manifest holds the distributed optimizer's
/// per-bucket shards (buckets with a gather_function), whose buckets are
/// padded apart.
static bool hasBucketShards(const Json &buffer) {
  auto buckets = buffer.find("buckets");
  return buckets != buffer.end() && buckets->is_array() && !buckets->empty() &&
         (*buckets)[0].is_object() && (*buckets)[0].contains("gather_function");
}

static bool splitOverAxes(const Parameter &parameter,
                          const std::vector<int64_t> &axes) {
  for (const std::vector<int64_t> &split : parameter.splitAxes)
    for (int64_t axis : split)
      if (std::find(axes.begin(), axes.end(), axis) != axes.end())
        return true;
  return false;
}

void ManifestReader::readGradientBuffers(const Json &json,
                                         const std::string &path,
                                         Bundle &bundle) {
  expectArray(json, path);
  if (!bundle.pipeline())
    fail(path, "gradient_buffers in a bundle without a pipeline section",
         "a pipeline bundle (one buffer per pipeline rank); others have one "
         "gradient_buffer");
  int64_t ranks = bundle.pipeline()->size;
  if (static_cast<int64_t>(json.size()) != ranks)
    fail(path, std::to_string(json.size()) + " buffers",
         std::to_string(ranks) + ", one per pipeline rank");
  const std::vector<Parameter> &parameters = bundle.parameters();
  for (size_t r = 0; r < json.size(); ++r) {
    std::string at = index(path, r);
    expectObject(json[r], at);
    expectKnownKeys(json[r], at,
                    {"pipeline_rank", "reduce_function", "gather_function",
                     "parameters", "offsets", "size", "grid_axes",
                     "distributed_optimizer", "buckets",
                     "overlap_param_gather"},
                    "a pipeline rank's gradient buffer");
    // The pipeline rank and the function names; the rest is a
    // gradient_buffer's.
    Json layout = json[r];
    GradientBuffer out;
    out.pipelineRank =
        readInt(field(layout, at, "pipeline_rank"), member(at, "pipeline_rank"),
                static_cast<int64_t>(r), static_cast<int64_t>(r));
    out.reduceFunction = readString(field(layout, at, "reduce_function"),
                                    member(at, "reduce_function"));
    layout.erase("pipeline_rank");
    layout.erase("reduce_function");
    bool distributed = readBool(field(layout, at, "distributed_optimizer"),
                                member(at, "distributed_optimizer"));
    if (const Json *gather = optionalField(layout, "gather_function")) {
      if (!distributed)
        fail(member(at, "gather_function"), gather->dump(),
             "none: only the distributed optimizer gathers parameters");
      out.gatherFunction = readString(*gather, member(at, "gather_function"));
      layout.erase("gather_function");
    } else if (distributed) {
      field(layout, at, "gather_function");
    }
    readGradientBuffer(layout, at, bundle, out);
    for (int64_t axis : out.gridAxes)
      if (axis == 0)
        fail(member(at, "grid_axes"), "axis 0 (the pipeline axis)",
             "the data-parallel axis 1: a pipeline rank's buffer is reduced "
             "over its data-parallel group only");
    std::vector<bool> listed(parameters.size(), false);
    for (size_t i = 0; i < out.parameters.size(); ++i) {
      size_t p = static_cast<size_t>(out.parameters[i]);
      listed[p] = true;
      // A table tied across stages is held, and reduced, on each rank of
      // its embedding group.
      if (!parameters[p].heldOnPipelineRank(out.pipelineRank))
        fail(index(member(at, "parameters"), i),
             "parameter " + std::to_string(p) + " ('" + parameters[p].name +
                 "') of pipeline rank " +
                 std::to_string(parameters[p].pipelineRank),
             "a parameter of pipeline rank " + std::to_string(out.pipelineRank) +
                 ": each pipeline rank's buffer holds its own stages' "
                 "gradients");
    }
    // A parameter split over the buffer's data axis (expert parallelism's
    // experts) has whole gradients on its rank, reduced by nothing; the
    // optimizer (the distributed one too) steps it there whole.
    for (size_t p = 0; p < parameters.size(); ++p)
      if (parameters[p].heldOnPipelineRank(out.pipelineRank) && !listed[p] &&
          !splitOverAxes(parameters[p], out.gridAxes))
        fail(member(at, "parameters"),
             "no entry for parameter " + std::to_string(p) + " ('" +
                 parameters[p].name + "') of pipeline rank " +
                 std::to_string(out.pipelineRank),
             "every parameter of the rank but those split over the buffer's "
             "grid axes (expert parallelism's experts): its data-parallel "
             "gradient reduction runs only in the buffer");
    bundle.gradientBuffers_.push_back(std::move(out));
  }
}

/// The buffer's layout, and the functions that reduce it (docs/BundleFormat.md,
/// "Gradient reduction").
void ManifestReader::readGradientBuffer(const Json &json,
                                        const std::string &path,
                                        const Bundle &bundle,
                                        GradientBuffer &out) {
  expectObject(json, path);
  if (grid_.empty())
    fail(path, "a gradient buffer in a bundle without a grid",
         "a grid: the buffer is reduced over grid axes");
  expectKnownKeys(json, path,
                  {"parameters", "offsets", "size", "grid_axes",
                   "distributed_optimizer", "buckets", "overlap_param_gather"},
                  "a gradient buffer");
  out.gridAxes = readGridAxes(field(json, path, "grid_axes"),
                              member(path, "grid_axes"));
  out.distributedOptimizer = readBool(field(json, path, "distributed_optimizer"),
                                      member(path, "distributed_optimizer"));
  const std::vector<Parameter> &parameters = bundle.parameters();
  std::string parametersAt = member(path, "parameters");
  std::string offsetsAt = member(path, "offsets");
  const Json &list = field(json, path, "parameters");
  const Json &offsets = field(json, path, "offsets");
  expectArray(list, parametersAt);
  expectArray(offsets, offsetsAt);
  if (offsets.size() != list.size())
    fail(offsetsAt, std::to_string(offsets.size()) + " offsets",
         std::to_string(list.size()) + ", one per parameter of the buffer");
  std::vector<bool> listed(parameters.size(), false);
  int64_t end = 0;
  DType dtype = DType::F32;
  std::vector<int64_t> gaps;
  for (size_t i = 0; i < list.size(); ++i) {
    int64_t p = readInt(list[i], index(parametersAt, i), 0,
                        static_cast<int64_t>(parameters.size()) - 1);
    if (listed[p])
      fail(index(parametersAt, i), "parameter " + std::to_string(p) + " again",
           "each parameter at most once");
    listed[p] = true;
    const TensorType &local = parameters[p].localType;
    if (i == 0)
      dtype = local.dtype;
    if (local.dtype != dtype || !isFloatingPoint(dtype))
      fail(index(parametersAt, i),
           "parameter " + std::to_string(p) + " of type " + local.str(),
           std::string("one floating-point type for the whole buffer (") +
               dtypeName(dtype) + ")");
    int64_t offset = readInt(offsets[i], index(offsetsAt, i), 0);
    // Per-bucket shards pad each bucket: a gap is checked with the buckets.
    if (offset != end && !(offset > end && hasBucketShards(json)))
      fail(index(offsetsAt, i), std::to_string(offset),
           std::to_string(end) +
               ", where the previous parameter's shard ends (the buffer is "
               "contiguous; only the distributed optimizer's per-bucket "
               "shards pad between buckets)");
    if (offset > end)
      gaps.push_back(offset);
    end = offset + local.numElements;
    out.parameters.push_back(p);
    out.offsets.push_back(offset);
  }
  if (out.parameters.empty())
    fail(parametersAt, "[]", "at least one parameter");
  out.size = readInt(field(json, path, "size"), member(path, "size"), end,
                     kMaxElements);
  int64_t group = gridGroupSize(grid_, out.gridAxes);
  if (out.distributedOptimizer && out.pipelineRank < 0) {
    // Expert parallelism's experts, split over the buffer's axes, are
    // stepped whole on their ranks (DistributedOptimizer's local
    // parameters).
    for (size_t p = 0; p < parameters.size(); ++p)
      if (!listed[p] && !splitOverAxes(parameters[p], out.gridAxes))
        fail(parametersAt,
             "no entry for parameter " + std::to_string(p) + " ('" +
                 parameters[p].name + "')",
             "every parameter but those split over the buffer's grid axes "
             "(expert parallelism's experts): the distributed optimizer "
             "updates parameters through the buffer");
    if (out.size % group != 0)
      fail(member(path, "size"), std::to_string(out.size),
           "a multiple of the " + std::to_string(group) +
               " ranks that share the buffer (the padded size)");
  }

  // The functions that reduce the buffer and gather the parameters.
  TensorType buffer{{out.size}, dtype, out.size};
  TensorType shard{{out.size / group}, dtype, out.size / group};
  auto check = [&](const std::string &name, const TensorType &in,
                   const TensorType &result) {
    const Function *function = bundle.findFunction(name);
    if (!function)
      fail("functions", "no function \"" + name + "\"",
           name + ", which " + path +
               (out.distributedOptimizer ? " with distributed_optimizer" : "") +
               " needs");
    std::string signature;
    if (function->inputs.size() == 1 && function->outputs.size() == 1) {
      const TensorType &a = function->values[function->inputs[0]];
      const TensorType &b = function->values[function->outputs[0]];
      if (a.shape == in.shape && a.dtype == in.dtype &&
          b.shape == result.shape && b.dtype == result.dtype)
        return;
      signature = a.str() + " -> " + b.str();
    } else {
      signature = std::to_string(function->inputs.size()) + " inputs and " +
                  std::to_string(function->outputs.size()) + " outputs";
    }
    fail("functions." + name, signature,
         in.str() + " -> " + result.str() + " for the gradient buffer");
  };
  if (out.distributedOptimizer) {
    check(out.reduceFunction, buffer, shard);
    check(out.gatherFunction, shard, buffer);
  } else {
    check(out.reduceFunction, buffer, buffer);
  }
  if (const Json *buckets = optionalField(json, "buckets")) {
    readGradientBuckets(*buckets, member(path, "buckets"), bundle, out);
    for (const GradientBucket &bucket : out.buckets) {
      TensorType slice{{bucket.size}, dtype, bucket.size};
      if (!out.bucketShards()) {
        check(bucket.reduceFunction, slice, slice);
        continue;
      }
      if (bucket.size % group != 0)
        fail(member(path, "buckets"),
             "a bucket of " + std::to_string(bucket.size) + " elements",
             "a multiple of the " + std::to_string(group) +
                 " ranks that share each bucket's shards (the padded size)");
      TensorType part{{bucket.size / group}, dtype, bucket.size / group};
      check(bucket.reduceFunction, slice, part);
      check(bucket.gatherFunction, part, slice);
    }
  }
  // The padding between parameters is the end of a bucket.
  for (int64_t gap : gaps)
    if (std::none_of(out.buckets.begin(), out.buckets.end(),
                     [&](const GradientBucket &b) { return b.offset == gap; }))
      fail(member(path, "offsets"),
           "padding before offset " + std::to_string(gap),
           "padding only at the end of a bucket");
  if (const Json *overlap = optionalField(json, "overlap_param_gather")) {
    out.overlapParamGather =
        readBool(*overlap, member(path, "overlap_param_gather"));
    if (out.overlapParamGather && !out.bucketShards())
      fail(member(path, "overlap_param_gather"), "true",
           "false: the parameters are gathered per bucket only from the "
           "distributed optimizer's per-bucket shards (buckets with a "
           "gather_function)");
  }
  for (const GradientBucket &bucket : out.buckets)
    if (bucket.gatherBefore >= 0 && !out.overlapParamGather)
      fail(member(path, "buckets"), "a bucket with gather_before",
           "none without overlap_param_gather");
}

/// The buckets tile the buffer in order, cut at parameter boundaries, and a
/// bucket starts only after every gradient in it is accumulated: a bucket
/// reduced too early would leave the rest of its gradients out of the sum.
void ManifestReader::readGradientBuckets(const Json &json,
                                         const std::string &path,
                                         const Bundle &bundle,
                                         GradientBuffer &out) {
  if (version_ < 9)
    fail(path, "buckets in a version " + std::to_string(version_) + " manifest",
         "none before format version 9 (the version is wrong or the "
         "manifest was edited)");
  expectArray(json, path);
  if (json.empty())
    fail(path, "[]", "at least one bucket, or no buckets key");
  const std::vector<Parameter> &parameters = bundle.parameters();
  // The training functions whose accumulate_gradient instructions fill this
  // buffer: train_step, or the backward functions of the pipeline rank's
  // stages.
  std::vector<std::string> training;
  if (const PipelineInfo *pipeline = bundle.pipeline()) {
    for (const PipelineStageInfo &stage : pipeline->stages)
      if (stage.rank == out.pipelineRank)
        training.push_back(bundle.functions()[stage.backward].name);
  } else {
    training.push_back("train_step");
  }
  int64_t end = 0;
  for (size_t b = 0; b < json.size(); ++b) {
    std::string at = index(path, b);
    expectObject(json[b], at);
    expectKnownKeys(json[b], at,
                    {"offset", "size", "reduce_function", "ready_after",
                     "gather_function", "gather_before"},
                    "a gradient bucket");
    GradientBucket bucket;
    bucket.offset =
        readInt(field(json[b], at, "offset"), member(at, "offset"), end, end);
    bucket.size = readInt(field(json[b], at, "size"), member(at, "size"), 1,
                          out.size - bucket.offset);
    end = bucket.offset + bucket.size;
    bool last = b + 1 == json.size();
    if (last && end != out.size)
      fail(member(at, "size"), std::to_string(bucket.size),
           std::to_string(out.size - bucket.offset) +
               ": the last bucket ends where the buffer does (its padding "
               "included)");
    if (!last && std::find(out.offsets.begin(), out.offsets.end(), end) ==
                     out.offsets.end())
      fail(member(at, "size"), std::to_string(bucket.size),
           "a size that ends the bucket where a parameter's gradient "
           "starts (buckets are cut at parameter boundaries)");
    bucket.reduceFunction = readString(field(json[b], at, "reduce_function"),
                                       member(at, "reduce_function"));
    if (const Json *gather = optionalField(json[b], "gather_function")) {
      if (!out.distributedOptimizer)
        fail(member(at, "gather_function"), gather->dump(),
             "none: only the distributed optimizer gathers parameters");
      bucket.gatherFunction =
          readString(*gather, member(at, "gather_function"));
    }
    if (b > 0 && bucket.gatherFunction.empty() !=
                     out.buckets.front().gatherFunction.empty())
      fail(member(at, "gather_function"),
           bucket.gatherFunction.empty() ? "none" : bucket.gatherFunction,
           "a gather_function on every bucket or on none");
    if (const Json *before = optionalField(json[b], "gather_before"))
      readGatherBefore(*before, member(at, "gather_before"), bundle, out,
                       bucket);
    if (const Json *ready = optionalField(json[b], "ready_after")) {
      std::string readyAt = member(at, "ready_after");
      expectObject(*ready, readyAt);
      expectKnownKeys(*ready, readyAt, {"function", "instruction"},
                      "a bucket's ready_after");
      bucket.readyFunction = readString(field(*ready, readyAt, "function"),
                                        member(readyAt, "function"));
      if (std::find(training.begin(), training.end(), bucket.readyFunction) ==
          training.end()) {
        std::string names;
        for (const std::string &name : training)
          names += (names.empty() ? "" : " or ") + name;
        fail(member(readyAt, "function"), "\"" + bucket.readyFunction + "\"",
             names + ", a training function that accumulates into this "
                     "buffer");
      }
      const Function &function = *bundle.findFunction(bucket.readyFunction);
      bucket.readyAfter = readInt(
          field(*ready, readyAt, "instruction"), member(readyAt, "instruction"),
          0, static_cast<int64_t>(function.instructions.size()) - 1);
    }
    // Every accumulation of a gradient in the bucket comes before the
    // bucket starts, in the one function named.
    for (size_t i = 0; i < out.parameters.size(); ++i) {
      size_t p = static_cast<size_t>(out.parameters[i]);
      int64_t first = out.offsets[i];
      if (first < bucket.offset || first >= end)
        continue;
      if (first + parameters[p].localType.numElements > end)
        fail(member(at, "size"), std::to_string(bucket.size),
             "a bucket that holds the whole gradient of parameter " +
                 std::to_string(p) + " ('" + parameters[p].name + "')");
      if (bucket.readyFunction.empty())
        continue;
      if (parameters[p].pipelineRanks.size() > 1)
        fail(member(at, "ready_after"),
             "a start inside the schedule for a bucket that holds parameter " +
                 std::to_string(p) + " ('" + parameters[p].name +
                 "'), tied across pipeline ranks",
             "no ready_after: the tied gradient is summed over its embedding "
             "group after the schedule, before its data-parallel reduction");
      for (const Function &function : bundle.functions())
        for (size_t k = 0; k < function.instructions.size(); ++k) {
          const Instruction &inst = function.instructions[k];
          if (inst.op != Op::AccumulateGradient ||
              inst.attrs.parameter != static_cast<int64_t>(p))
            continue;
          if (function.name != bucket.readyFunction ||
              static_cast<int64_t>(k) > bucket.readyAfter)
            fail(member(member(at, "ready_after"), "instruction"),
                 std::to_string(bucket.readyAfter) + " of " +
                     bucket.readyFunction,
                 "a start after every accumulation of the bucket's "
                 "gradients, but parameter " +
                     std::to_string(p) + " ('" + parameters[p].name +
                     "') is accumulated at instruction " + std::to_string(k) +
                     " of " + function.name);
        }
    }
    out.buckets.push_back(std::move(bucket));
  }
}

void ManifestReader::readGatherBefore(const Json &json, const std::string &path,
                                      const Bundle &bundle,
                                      const GradientBuffer &buffer,
                                      GradientBucket &bucket) {
  expectObject(json, path);
  expectKnownKeys(json, path, {"function", "instruction"},
                  "a bucket's gather_before");
  if (bundle.pipeline())
    fail(path, json.dump(),
         "none in a pipeline bundle (its ranks gather every bucket before "
         "their schedule)");
  bucket.gatherBeforeFunction =
      readString(field(json, path, "function"), member(path, "function"));
  const Function *function = bundle.findFunction(bucket.gatherBeforeFunction);
  if (bucket.gatherBeforeFunction != "train_step" || !function)
    fail(member(path, "function"), "\"" + bucket.gatherBeforeFunction + "\"",
         "train_step, the step that reads the parameters next");
  bucket.gatherBefore =
      readInt(field(json, path, "instruction"), member(path, "instruction"), 0,
              static_cast<int64_t>(function->instructions.size()) - 1);
  // The bucket's parameters, and the values that hold them.
  std::vector<bool> inBucket(bundle.parameters().size(), false);
  for (size_t i = 0; i < buffer.parameters.size(); ++i)
    if (buffer.offsets[i] >= bucket.offset &&
        buffer.offsets[i] < bucket.offset + bucket.size)
      inBucket[static_cast<size_t>(buffer.parameters[i])] = true;
  std::vector<bool> holds(function->values.size(), false);
  for (size_t k = 0; k < function->instructions.size(); ++k) {
    const Instruction &inst = function->instructions[k];
    if (inst.op == Op::GetParameter &&
        inBucket[static_cast<size_t>(inst.attrs.parameter)]) {
      holds[static_cast<size_t>(inst.results[0])] = true;
      continue;
    }
    for (int64_t v : inst.operands)
      if (holds[static_cast<size_t>(v)] &&
          static_cast<int64_t>(k) < bucket.gatherBefore)
        fail(member(path, "instruction"), std::to_string(bucket.gatherBefore),
             "at most " + std::to_string(k) + ": instruction " +
                 std::to_string(k) + " of " + function->name +
                 " reads a parameter of the bucket");
  }
}

} // namespace mtrt::bundle_detail
