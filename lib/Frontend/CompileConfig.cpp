//===- CompileConfig.cpp - Reading model files into a CompileConfig -------===//
//
// Opens a model file, picks the reader (YAML or Hugging Face config.json) and
// reads this project's YAML format with LLVM's YAML parser. Every error names
// file:line:column, the key, the value and what is allowed, because the person
// reading it has only the file in front of them.
//
//===----------------------------------------------------------------------===//

#include "ConfigKeys.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/YAMLParser.h"

using namespace llvm;
using namespace megatron;
using namespace megatron::config;

namespace {

/// Walks one YAML document. Syntax errors are found by a separate pass
/// first, so this walk sees a well-formed stream and only judges content.
class YamlConfigReader {
public:
  YamlConfigReader(StringRef contents, StringRef fileName)
      : contents(contents), fileName(fileName),
        stream(MemoryBufferRef(contents, fileName), sourceMgr,
               /*ShowColors=*/false) {}

  Expected<CompileConfig> read();

private:
  std::string location(yaml::Node *node) const;
  Error errorAt(yaml::Node *node, const Twine &message) const {
    return createStringError(inconvertibleErrorCode(),
                             location(node) + ": " + message);
  }
  Error readMapping(yaml::MappingNode *map, StringRef section);
  Error readKey(yaml::Node *keyNode, StringRef name, yaml::Node *value,
                const KeyDef &def);
  Error unknownKey(yaml::Node *keyNode, StringRef name, StringRef section);

  StringRef contents;
  StringRef fileName;
  SourceMgr sourceMgr;
  yaml::Stream stream;
  CompileConfig config;
  /// Where each key and section was first set, to report duplicates.
  StringMap<std::string> seen;
};

} // namespace

std::string YamlConfigReader::location(yaml::Node *node) const {
  SMLoc loc = node ? node->getSourceRange().Start : SMLoc();
  if (!loc.isValid())
    return fileName.str();
  auto [line, column] = sourceMgr.getLineAndColumn(loc);
  return (fileName + ":" + Twine(line) + ":" + Twine(column)).str();
}

/// The name of a node's kind, for "expected ..., got a sequence".
static StringRef describeNode(yaml::Node *node) {
  if (isa<yaml::MappingNode>(node))
    return "a mapping";
  if (isa<yaml::SequenceNode>(node))
    return "a list";
  if (isa<yaml::AliasNode>(node))
    return "an alias";
  return "a multi-line text";
}

/// Finds syntax errors with a throwaway stream; LLVM's parser reports them
/// through the SourceMgr, which formats them as file:line:column.
static Error checkYamlSyntax(StringRef contents, StringRef fileName,
                             unsigned &numDocuments) {
  std::string firstError;
  SourceMgr sourceMgr;
  sourceMgr.setDiagHandler(
      [](const SMDiagnostic &diag, void *context) {
        auto *out = static_cast<std::string *>(context);
        if (!out->empty())
          return;
        *out = (diag.getFilename() + ":" + Twine(diag.getLineNo()) + ":" +
                Twine(diag.getColumnNo() + 1) +
                ": invalid YAML: " + diag.getMessage())
                   .str();
      },
      &firstError);
  yaml::Stream stream(MemoryBufferRef(contents, fileName), sourceMgr,
                      /*ShowColors=*/false);
  numDocuments = 0;
  for (yaml::Document &doc : stream) {
    ++numDocuments;
    doc.skip();
    if (stream.failed())
      break;
  }
  if (stream.failed() || !firstError.empty())
    return createStringError(inconvertibleErrorCode(),
                             firstError.empty() ? fileName + ": invalid YAML"
                                                : firstError);
  return Error::success();
}

Expected<CompileConfig> YamlConfigReader::read() {
  unsigned numDocuments;
  if (Error err = checkYamlSyntax(contents, fileName, numDocuments))
    return std::move(err);
  if (numDocuments > 1)
    return createStringError(inconvertibleErrorCode(),
                             fileName + ": " + Twine(numDocuments) +
                                 " YAML documents; a model file is one "
                                 "document (remove the '---' separators)");

  yaml::document_iterator doc = stream.begin();
  yaml::Node *root = doc == stream.end() ? nullptr : doc->getRoot();
  if (!root || isa<yaml::NullNode>(root))
    return createStringError(inconvertibleErrorCode(),
                             fileName + ": the model file is empty; expected "
                                        "keys such as 'model:' with "
                                        "'num_layers: 12' under it");
  auto *map = dyn_cast<yaml::MappingNode>(root);
  if (!map)
    return errorAt(root, "expected a mapping of keys (like 'model:' or "
                         "'num_layers: 12') at the top level, got " +
                             (isa<yaml::ScalarNode>(root)
                                  ? StringRef("a single value")
                                  : describeNode(root)));
  if (Error err = readMapping(map, ""))
    return std::move(err);

  config.sourcePath = fileName.str();
  if (config.model.name.empty())
    config.model.name = sys::path::stem(fileName).str();
  return std::move(config);
}

Error YamlConfigReader::readMapping(yaml::MappingNode *map, StringRef section) {
  for (yaml::KeyValueNode &entry : *map) {
    yaml::Node *keyNode = entry.getKey();
    yaml::Node *value = entry.getValue();
    SmallString<32> keyStorage;
    auto *keyScalar = dyn_cast_or_null<yaml::ScalarNode>(keyNode);
    if (!keyScalar)
      return errorAt(keyNode, "expected a key name, got " +
                                  (keyNode && !isa<yaml::NullNode>(keyNode)
                                       ? describeNode(keyNode)
                                       : StringRef("nothing")));
    StringRef name = keyScalar->getValue(keyStorage);

    if (section.empty() && isMappingSection(name)) {
      auto [it, inserted] =
          seen.try_emplace("section " + name.str(), location(keyNode));
      if (!inserted)
        return errorAt(keyNode, "duplicate section '" + name +
                                    "'; it already appears at " + it->second);
      if (isa<yaml::NullNode>(value))
        continue;
      auto *inner = dyn_cast<yaml::MappingNode>(value);
      if (!inner) {
        SmallString<32> storage;
        StringRef shown = isa<yaml::ScalarNode>(value)
                              ? cast<yaml::ScalarNode>(value)->getValue(storage)
                              : describeNode(value);
        return errorAt(value, "'" + name +
                                  "' is a section: expected keys indented "
                                  "under it, got '" +
                                  shown + "'");
      }
      if (Error err = readMapping(inner, name))
        return err;
      continue;
    }

    // At the top level every key may be written flat by its full name, as
    // on a Megatron-LM command line.
    const KeyDef *def =
        section.empty() ? findKey(name) : findKeyInSection(section, name);
    if (!def)
      return unknownKey(keyNode, name, section);
    if (Error err = readKey(keyNode, name, value, *def))
      return err;
  }
  return Error::success();
}

Error YamlConfigReader::readKey(yaml::Node *keyNode, StringRef name,
                                yaml::Node *value, const KeyDef &def) {
  StringRef key = def.info.key;
  auto [it, inserted] = seen.try_emplace(key, location(keyNode));
  if (!inserted)
    return errorAt(keyNode, "duplicate key '" + name +
                                "'; it is already set at " + it->second);

  SmallString<32> storage;
  StringRef text;
  yaml::Node *where = value;
  if (isa<yaml::NullNode>(value)) {
    // An empty value has no position of its own; point at its key.
    text = "null";
    where = keyNode;
  } else if (auto *scalar = dyn_cast<yaml::ScalarNode>(value)) {
    text = scalar->getValue(storage);
  } else {
    return errorAt(value, name + ": expected a single value, got " +
                              describeNode(value));
  }
  if (std::optional<std::string> problem = def.set(config, text))
    return errorAt(where, name + ": " + *problem);
  config.keyOrigins[def.originKey()] = location(where);
  return Error::success();
}

Error YamlConfigReader::unknownKey(yaml::Node *keyNode, StringRef name,
                                   StringRef section) {
  if (!section.empty()) {
    if (isMappingSection(name))
      return errorAt(keyNode, "section '" + name + "' inside section '" +
                                  section +
                                  "'; sections belong at the top level");
    if (const KeyDef *elsewhere = findKey(name)) {
      if (elsewhere->info.section == "precision")
        return errorAt(keyNode, "'" + name +
                                    "' is a top-level key (precision: bf16), "
                                    "not part of section '" +
                                    section + "'");
      return errorAt(keyNode, "'" + name + "' belongs in section '" +
                                  elsewhere->info.section + "', not in '" +
                                  section + "'");
    }
  }
  std::string message =
      "unknown key '" + name.str() + "'" +
      (section.empty() ? std::string() : " in section '" + section.str() + "'");
  std::string suggestion = suggestKey(name, section);
  if (!suggestion.empty())
    message += "; did you mean '" + suggestion + "'?";
  else
    message += "; models/README.md lists every key";
  return errorAt(keyNode, message);
}

Expected<CompileConfig> config::parseYamlConfig(StringRef contents,
                                                StringRef fileName) {
  return YamlConfigReader(contents, fileName).read();
}

Expected<CompileConfig> megatron::parseCompileConfig(StringRef contents,
                                                     StringRef bufferName) {
  bool isJson = sys::path::extension(bufferName).equals_insensitive(".json") ||
                contents.ltrim().starts_with("{");
  if (isJson)
    return parseHuggingFaceConfig(contents, bufferName);
  return parseYamlConfig(contents, bufferName);
}

Expected<CompileConfig> megatron::loadCompileConfig(StringRef path) {
  ErrorOr<std::unique_ptr<MemoryBuffer>> buffer =
      MemoryBuffer::getFile(path, /*IsText=*/true);
  if (!buffer)
    return createStringError(buffer.getError(),
                             "cannot read model file '" + path +
                                 "': " + buffer.getError().message());
  return parseCompileConfig((*buffer)->getBuffer(), path);
}

//===----------------------------------------------------------------------===//
// Derived sizes.
//===----------------------------------------------------------------------===//

int64_t CompileConfig::paddedVocabSize() const {
  // Megatron-LM's _vocab_size_with_padding. Saturates to 0 instead of
  // overflowing on sizes validateCompileConfig would reject.
  int64_t vocab = model.vocabSize;
  int64_t divisibleBy = model.makeVocabSizeDivisibleBy;
  int64_t tp = parallel.tensorModelParallelSize;
  if (vocab <= 0 || divisibleBy <= 0 || tp <= 0)
    return vocab;
  int64_t multiple, rounded;
  if (MulOverflow(divisibleBy, tp, multiple) ||
      AddOverflow(vocab, multiple - 1, rounded))
    return 0;
  return rounded / multiple * multiple;
}

int64_t CompileConfig::virtualStagesPerRank() const {
  int64_t pp = parallel.pipelineModelParallelSize;
  if (parallel.virtualPipelineModelParallelSize > 0)
    return parallel.virtualPipelineModelParallelSize;
  int64_t perStage = parallel.numLayersPerVirtualPipelineStage;
  if (perStage > 0 && pp > 0 && model.numLayers % (pp * perStage) == 0)
    return model.numLayers / (pp * perStage);
  return 1;
}

int64_t CompileConfig::pipelineStageNumLayers(int64_t stage) const {
  int64_t stages = parallel.pipelineModelParallelSize;
  if (stages <= 0 || stage < 0 || stage >= stages)
    return 0;
  int64_t first = parallel.decoderFirstPipelineNumLayers;
  int64_t last = parallel.decoderLastPipelineNumLayers;
  if (stages > 1 && first && stage == 0)
    return first;
  if (stages > 1 && last && stage == stages - 1)
    return last;
  int64_t rest = model.numLayers - (stages > 1 ? first + last : 0);
  int64_t evenStages = stages - (stages > 1 && first) - (stages > 1 && last);
  return evenStages > 0 ? rest / evenStages : 0;
}
