//===- megatron-model-file-fuzzer.cpp - libFuzzer target for model files --===//
//
// Feeds arbitrary bytes to the model-file reader, as YAML and as a Hugging
// Face config.json, then validates what parses and computes the sizes later
// stages derive from it. Every error must come back as an llvm::Error: a
// crash, a sanitizer report or a hang here is a bug in lib/Frontend.
//
// The first line doubles as a command-line override ("key=value"), so the
// value parsers and the misspelt-key suggestions behind the tool's flags are
// fuzzed too.
//
//===----------------------------------------------------------------------===//

#include "megatron/Frontend/CompileConfig.h"

#include "llvm/Support/Error.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

using namespace llvm;
using namespace megatron;

/// What a driver does with a configuration that parsed: validate it, then,
/// if valid, derive the sizes the model builder uses.
static void exercise(CompileConfig &config, StringRef overrideLine) {
  auto [key, value] = overrideLine.split('=');
  // A failed override leaves the configuration as it was.
  consumeError(applyOverride(config, key, value));

  if (Error error = validateCompileConfig(config)) {
    consumeError(std::move(error));
    return;
  }
  // Validation promises these are defined and fit in 64 bits.
  volatile int64_t sink = config.paddedVocabSize();
  sink = config.globalBatchSize();
  sink = config.parallel.worldSize();
  sink = config.model.headDim() * config.model.queryGroups();
  sink = config.model.ffnSize();
  sink = config.model.maxPositions();
  // Stages are bounded by nothing but 64 bits; the first and last few cover
  // every case of the uneven split.
  int64_t stages = config.parallel.pipelineModelParallelSize;
  for (int64_t stage = 0; stage < std::min<int64_t>(stages, 4); ++stage)
    sink = config.pipelineStageNumLayers(stage);
  for (int64_t stage = std::max<int64_t>(stages - 4, 0); stage < stages;
       ++stage)
    sink = config.pipelineStageNumLayers(stage);
  (void)sink;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  StringRef contents(reinterpret_cast<const char *>(data), size);
  StringRef overrideLine = contents.split('\n').first;
  // The name picks the reader, except that text starting with '{' is always
  // JSON; trying both names reaches both readers with every input.
  for (StringRef bufferName : {"fuzz.yaml", "config.json"}) {
    Expected<CompileConfig> config = parseCompileConfig(contents, bufferName);
    if (!config) {
      consumeError(config.takeError());
      continue;
    }
    exercise(*config, overrideLine);
  }
  return 0;
}
