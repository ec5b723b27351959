// Private to the bundle reader: the op table, JSON helpers, and the classes
// that check a manifest (BundleManifest.cpp) and each instruction
// (BundleOpChecker.cpp).
#ifndef MTRT_SRC_CORE_BUNDLEREADER_H
#define MTRT_SRC_CORE_BUNDLEREADER_H

#include "core/Bundle.h"

#include <nlohmann/json.hpp>

#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

namespace mtrt::bundle_detail {

using Json = nlohmann::json;

struct DTypeName {
  DType dtype;
  const char *name;
  size_t size;
};
inline constexpr DTypeName kDTypes[] = {
    {DType::F32, "f32", 4}, {DType::F64, "f64", 8}, {DType::BF16, "bf16", 2},
    {DType::F16, "f16", 2}, {DType::I32, "i32", 4}, {DType::I64, "i64", 8},
    {DType::F8E4M3, "f8e4m3", 1}, {DType::F8E5M2, "f8e5m2", 1},
};

/// AxesList: one list of grid axes per dimension (split_axes).
enum class AttrKind { Int, Number, Bool, String, IntArray, AxesList };

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

inline constexpr int kMany = std::numeric_limits<int>::max();

/// The row of `op` in the op table.
const OpInfo &opInfo(Op op);
const std::vector<OpInfo> &opTable();

/// At most `limit` characters of `json` as JSON text, for messages.
std::string describe(const Json &json, size_t limit = 60);
const char *jsonTypeName(const Json &json);
std::string index(const std::string &path, size_t i);
std::string member(const std::string &path, const char *key);

/// Reads the manifest's JSON into a Bundle, checking every field on the way.
/// Every failure throws an Error whose message reads
///   bundle 'NAME': FIELD.PATH: found VALUE, expected EXPECTATION
class ManifestReader {
public:
  explicit ManifestReader(std::string_view name) : name_(name) {}

  /// `payload`: the bytes after the manifest, which `kernels` points into.
  Bundle read(std::string_view text, std::string_view payload);

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
  /// Refuses a key of `object` that is not in `known`: every object of the
  /// manifest is closed (docs/bundle-manifest.schema.json), so a key this
  /// runtime does not know is a bundle it cannot run as written. `what`
  /// names the object in the message ("a parameter").
  void expectKnownKeys(const Json &object, const std::string &path,
                       std::initializer_list<const char *> known,
                       const char *what);
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
  void readFp8(const Json &json, const std::string &path, Fp8Settings &out);
  void readGrid(const Json &json, const std::string &path,
                std::vector<int64_t> &out);
  void readParameters(const Json &json, const std::string &path,
                      std::vector<Parameter> &out);
  void readGradientBuffer(const Json &json, const std::string &path,
                          const Bundle &bundle, GradientBuffer &out);
  /// A pipeline bundle's gradient_buffers (version 7): one per pipeline
  /// rank, each holding exactly that rank's parameters.
  /// The buffer's `buckets` (format version 9), after the rest of it.
  void readGradientBuckets(const Json &json, const std::string &path,
                           const Bundle &bundle, GradientBuffer &out);
  /// A bucket's `gather_before` (--overlap-param-gather): no instruction
  /// of the function before it reads one of the bucket's parameters.
  void readGatherBefore(const Json &json, const std::string &path,
                        const Bundle &bundle, const GradientBuffer &buffer,
                        GradientBucket &bucket);
  void readGradientBuffers(const Json &json, const std::string &path,
                           Bundle &bundle);
  void readSplitAxes(const Json &json, const std::string &path,
                     Parameter &parameter);
  void readPipelineRanks(const Json &json, const std::string &path,
                         Parameter &parameter);
  std::vector<int64_t> readGridAxes(const Json &json, const std::string &path);
  void readFunction(const Json &json, const std::string &path, Function &out);
  /// train_step's output_names (version 12): "loss", then "aux_loss", then
  /// any of kLoggedMoeLosses, each an f32 scalar.
  void readOutputNames(const Json &json, const std::string &path,
                       Function &out);
  void readInstruction(const Json &json, const std::string &path,
                       Function &function, size_t position);
  /// A fused instruction's body (after its operands and results are read):
  /// each op an elementwise op of the group's type, reading the group's
  /// operands and earlier body results, defining the group's results
  /// exactly once and inner values.
  void readFusedBody(const Json &json, const std::string &path,
                     Function &function, size_t position, Instruction &inst);
  /// The `kernels` section (format version 3) and its payload ranges.
  void readFusedKernels(const Json &json, const std::string &path,
                        std::string_view payload, FusedKernels &out);
  void readAttributes(const Json *attrs, const std::string &path,
                      const OpInfo &info, Attributes &out);
  void checkFunctionSignature(const Function &function,
                              const std::string &path);
  /// The `pipeline` section (BundlePipeline.cpp), after the functions.
  void readPipeline(const Json &json, const std::string &path, Bundle &bundle);
  /// A stage entry's reported_losses (version 12, after aux_loss).
  void readReportedLosses(const Json &json, const std::string &path,
                          PipelineStageInfo &stage);
  /// After the pipeline section (BundlePipeline.cpp): every stage function
  /// reads and accumulates only parameters that its pipeline rank holds.
  void checkStageParameters(const Bundle &bundle);
  /// Reads and checks `memory_plan` (core/MemoryPlan.cpp); needs the
  /// function's instructions, and definedAt_/freedAt_ from reading them.
  void readMemoryPlan(const Json &json, const std::string &path,
                      Function &function);

  std::string name_;
  const std::vector<Parameter> *parameters_ = nullptr;
  /// The fp8 section, once read (fp8_scale and fp8_update name its metas).
  const Fp8Settings *fp8_ = nullptr;
  /// The number of fused kernels the manifest's `kernels` section lists.
  size_t kernelCount_ = 0;
  /// The manifest's grid; empty when it has none.
  std::vector<int64_t> grid_;
  /// The manifest's format version.
  int64_t version_ = 0;

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
  void checkCollective();
  void checkShift();
  /// The mixture-of-experts ops (moe_*): routing indices [T, K] in i32,
  /// router logits [T, E], permuted rows [T * K, ...].
  void checkMoe();
  void checkExpertDispatch();
  void checkContextLayout(bool isResult, size_t tile, size_t sequenceDim);
  void checkGlobalTile(bool isResult, size_t tile);
  void checkAttentionBlock(size_t query);
  void checkLoss(size_t logits, size_t labels);
  void checkChunkedLinear(bool labels);
  std::vector<int64_t> rowsOfInput();
  void checkOneElementType();
  void checkFp8();

  ManifestReader &reader_;
  const Function &function_;
  const Instruction &inst_;
  std::string path_;
  const std::vector<Parameter> &parameters_;
};

} // namespace mtrt::bundle_detail

#endif // MTRT_SRC_CORE_BUNDLEREADER_H
