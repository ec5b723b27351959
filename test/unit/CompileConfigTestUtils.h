//===- CompileConfigTestUtils.h - Helpers for model-file units -*- C++ -*-===//
//
// Shared by CompileConfigTest, HuggingFaceConfigTest and
// ValidateCompileConfigTest: reading inline model files and turning results
// into the message text the tests compare.
//
//===----------------------------------------------------------------------===//

#ifndef MEGATRON_TEST_UNIT_COMPILECONFIGTESTUTILS_H
#define MEGATRON_TEST_UNIT_COMPILECONFIGTESTUTILS_H

#include "megatron/Frontend/CompileConfig.h"

#include "gtest/gtest.h"

#include <string>

namespace megatron::testing {

using llvm::StringRef;

inline std::string modelPath(StringRef file) {
  return (StringRef(MEGATRON_SOURCE_DIR) + "/models/" + file).str();
}

inline std::string message(llvm::Error err) {
  return err ? llvm::toString(std::move(err)) : "<success>";
}

template <typename T> std::string message(llvm::Expected<T> value) {
  return value ? "<success>" : llvm::toString(value.takeError());
}

inline CompileConfig parse(StringRef text, StringRef name = "x.yaml") {
  llvm::Expected<CompileConfig> config = parseCompileConfig(text, name);
  EXPECT_TRUE(bool(config)) << message(config.takeError());
  return config ? std::move(*config) : CompileConfig();
}

/// A small valid model; tests append or override what they check.
inline constexpr StringRef kSmall = "model:\n"
                                    "  num_layers: 4\n"
                                    "  hidden_size: 64\n"
                                    "  num_attention_heads: 4\n"
                                    "  seq_length: 32\n"
                                    "  vocab_size: 100\n";

/// kSmall with `overrides` applied as command-line flags, then validated.
inline std::string validateSmall(
    std::initializer_list<std::pair<StringRef, StringRef>> overrides) {
  CompileConfig config = parse(kSmall);
  for (auto [key, value] : overrides)
    if (llvm::Error err = applyOverride(config, key, value))
      return "override failed: " + message(std::move(err));
  return message(validateCompileConfig(config));
}

} // namespace megatron::testing

#endif // MEGATRON_TEST_UNIT_COMPILECONFIGTESTUTILS_H
