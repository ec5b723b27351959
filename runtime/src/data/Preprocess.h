// megatron-preprocess: text or JSONL documents, tokenized, into indexed
// datasets, as Megatron-LM's tools/preprocess_data.py does.
#ifndef MTRT_SRC_DATA_PREPROCESS_H
#define MTRT_SRC_DATA_PREPROCESS_H

#include "data/Tokenizer.h"

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace mtrt::data {

struct PreprocessOptions {
  /// Files to read, in order. A file named *.json or *.jsonl holds one JSON
  /// object per line (one document each); any other file is one document
  /// of plain text.
  std::vector<std::string> inputs;
  /// Each key's dataset goes to <outputPrefix>_<key>_document.{bin,idx}.
  std::string outputPrefix;
  /// The JSON keys whose strings are tokenized; a text file's document
  /// counts as the key "text".
  std::vector<std::string> jsonKeys = {"text"};
  bool appendEod = false;
  /// Threads that tokenize; the output does not depend on it.
  int64_t workers = 1;
  TokenizerOptions tokenizer;
  /// Overwrite existing outputs.
  bool force = false;
  /// A progress bar on stderr, drawn only when stderr is a terminal.
  bool progressBar = true;
};

/// The <prefix>_<key>_document path prefix of each key's dataset.
std::vector<std::string> outputPrefixes(const PreprocessOptions &options);

/// What was written.
struct PreprocessSummary {
  int64_t documents = 0, tokens = 0, bytes = 0;
};

/// Reads every input, tokenizes each document's keys with `workers`
/// threads, and writes one dataset per key. Checks before reading: that the
/// inputs exist, that the outputs do not (unless force) and that their
/// directory is writable. Throws Error naming the file, the line and the
/// fix: a line that is not JSON or not an object, a missing key, a value
/// that is not a string, text that is not UTF-8. Nothing is left under the
/// output names when it fails.
PreprocessSummary preprocess(const PreprocessOptions &options);

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_PREPROCESS_H
