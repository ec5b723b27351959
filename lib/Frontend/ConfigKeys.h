//===- ConfigKeys.h - The key table shared by the readers -------*- C++ -*-===//
//
// Private to lib/Frontend: the YAML reader, the Hugging Face reader and
// applyOverride all set keys through this one table, so a model-file key, its
// command-line flag and a mapped Hugging Face field can never disagree on
// what a value means or which values are allowed.
//
//===----------------------------------------------------------------------===//

#ifndef MEGATRON_LIB_FRONTEND_CONFIGKEYS_H
#define MEGATRON_LIB_FRONTEND_CONFIGKEYS_H

#include "megatron/Frontend/CompileConfig.h"

#include <optional>
#include <string>

namespace megatron::config {

/// Parses `value` into the key's field. Returns the reason when the value is
/// not allowed, e.g. "expected a positive integer, got 'twelve'"; the caller
/// adds where it was written and which key.
using KeySetter = std::optional<std::string> (*)(CompileConfig &,
                                                 llvm::StringRef value);

struct KeyDef {
  ConfigKeyInfo info;
  KeySetter set;
  /// For Megatron-LM's flag forms (`swiglu`, `bf16`, ...): the key whose
  /// value they set, under which their origin is recorded so validation
  /// errors point at them.
  llvm::StringRef aliasOf = "";

  llvm::StringRef originKey() const {
    return aliasOf.empty() ? info.key : aliasOf;
  }
};

/// The sections of a model file that hold a mapping of keys. `precision` is a
/// single top-level value, not one of these.
bool isMappingSection(llvm::StringRef name);

/// The key named `key` (snake_case), in any section.
const KeyDef *findKey(llvm::StringRef key);

/// The key written as `name` inside section `section`: its full name, or the
/// name without the section's prefix (`granularity` in `recompute:`).
const KeyDef *findKeyInSection(llvm::StringRef section, llvm::StringRef name);

/// The known key closest to `name` (including common Hugging Face and
/// shorthand names), or "" when nothing is close. Inside `section`, its short
/// names are candidates too.
std::string suggestKey(llvm::StringRef name, llvm::StringRef section = "");

/// "--tensor-model-parallel-size" for "tensor_model_parallel_size".
std::string flagName(llvm::StringRef key);

/// "expected <what>, got '<value>'" (or "got nothing" for an empty value).
std::string expected(llvm::StringRef what, llvm::StringRef value);

/// A Hugging Face config.json: GPT2Config, LlamaConfig, MistralConfig,
/// Qwen2Config or Qwen3Config.
llvm::Expected<CompileConfig> parseHuggingFaceConfig(llvm::StringRef contents,
                                                     llvm::StringRef fileName);

/// A model file in this project's YAML format (models/README.md).
llvm::Expected<CompileConfig> parseYamlConfig(llvm::StringRef contents,
                                              llvm::StringRef fileName);

} // namespace megatron::config

#endif // MEGATRON_LIB_FRONTEND_CONFIGKEYS_H
