// Reading documents in batches, tokenizing them on several threads and
// writing them in input order.
#include "data/Preprocess.h"

#include "core/Error.h"
#include "data/IndexedDataset.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace mtrt::data {

namespace {

namespace fs = std::filesystem;

/// Documents tokenized between two writes.
constexpr size_t kBatchDocuments = 1024;

[[noreturn]] void invalid(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

bool isJsonLines(const std::string &path) {
  std::string extension = fs::path(path).extension().string();
  return extension == ".json" || extension == ".jsonl";
}

/// One input document: where it came from and its text per key.
struct Document {
  std::string file;
  int64_t line = 0; // 0 for a whole text file
  std::string raw;  // the JSON line or the file's text
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> tokens;
  std::string error;
};

std::string where(const Document &d) {
  return "'" + d.file + "'" +
         (d.line ? " line " + std::to_string(d.line) : std::string());
}

/// Parses a JSON line into the texts of the keys; errors go to d.error, so
/// that the first one in input order is reported whatever the workers.
void extractTexts(Document &d, const std::vector<std::string> &keys) {
  if (d.line == 0) {
    d.texts = {std::move(d.raw)};
    return;
  }
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(d.raw);
  } catch (const nlohmann::json::exception &e) {
    std::string what = e.what();
    d.error = where(d) + ": not JSON (" + what +
              "); each line of a .jsonl input is one JSON object";
    return;
  }
  if (!object.is_object()) {
    d.error = where(d) + ": found a JSON " + std::string(object.type_name()) +
              ", expected an object such as {\"text\": \"...\"}";
    return;
  }
  for (const std::string &key : keys) {
    auto it = object.find(key);
    if (it == object.end()) {
      std::string present;
      for (auto &[name, value] : object.items())
        present += (present.empty() ? "" : ", ") + name;
      d.error = where(d) + ": no key \"" + key + "\" (the object has: " +
                (present.empty() ? std::string("nothing") : present) +
                "); choose the keys to read with --json-keys";
      return;
    }
    if (!it->is_string()) {
      d.error = where(d) + ": \"" + key + "\" is a JSON " +
                std::string(it->type_name()) + ", expected a string";
      return;
    }
    d.texts.push_back(it->get<std::string>());
  }
}

void tokenize(Document &d, Tokenizer &tokenizer,
              const std::vector<std::string> &keys) {
  extractTexts(d, keys);
  if (!d.error.empty())
    return;
  d.tokens.resize(d.texts.size());
  for (size_t k = 0; k < d.texts.size(); ++k) {
    try {
      d.tokens[k] = tokenizer.encode(d.texts[k]);
    } catch (const Error &e) {
      d.error = where(d) + ", \"" + keys[k] + "\": " + e.what();
      return;
    }
  }
  d.raw.clear();
  d.texts.clear();
}

/// A one-line progress bar on stderr: bytes read of the inputs' total.
class ProgressBar {
public:
  ProgressBar(bool enabled, int64_t totalBytes)
      : enabled_(enabled && isatty(STDERR_FILENO)), total_(totalBytes),
        start_(std::chrono::steady_clock::now()) {}
  ~ProgressBar() {
    if (drawn_)
      std::cerr << "\r\033[K" << std::flush;
  }
  /// Redraws at most every 100 ms, unless `force` (the last update).
  void update(int64_t bytes, int64_t documents, bool force = false) {
    if (!enabled_)
      return;
    auto now = std::chrono::steady_clock::now();
    if (!force && drawn_ && now - last_ < std::chrono::milliseconds(100))
      return;
    last_ = now;
    drawn_ = true;
    double fraction =
        total_ > 0 ? std::min(1.0, static_cast<double>(bytes) / total_) : 1.0;
    double seconds = std::chrono::duration<double>(now - start_).count();
    constexpr int kWidth = 30;
    int filled = static_cast<int>(fraction * kWidth);
    char rate[64];
    std::snprintf(rate, sizeof(rate), "%.1f MB/s",
                  seconds > 0 ? bytes / seconds / 1e6 : 0.0);
    std::cerr << "\r[" << std::string(filled, '#')
              << std::string(kWidth - filled, '.') << "] "
              << static_cast<int>(fraction * 100) << "% " << documents
              << " documents, " << rate << "\033[K" << std::flush;
  }

private:
  bool enabled_, drawn_ = false;
  int64_t total_;
  std::chrono::steady_clock::time_point start_, last_;
};

void checkOutputs(const PreprocessOptions &options,
                  const std::vector<std::string> &prefixes) {
  fs::path dir = fs::path(options.outputPrefix).parent_path();
  if (dir.empty())
    dir = ".";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(MTRT_STATUS_NOT_FOUND,
                "--output-prefix: the directory '" + dir.string() +
                    "' does not exist; create it first");
  if (::access(dir.c_str(), W_OK) != 0)
    throw Error(MTRT_STATUS_PERMISSION_DENIED,
                "--output-prefix: cannot write to the directory '" +
                    dir.string() + "' (" + std::strerror(errno) +
                    "); choose a prefix in a writable directory");
  if (options.force)
    return;
  for (const std::string &prefix : prefixes)
    for (const char *suffix : {".bin", ".idx"})
      if (fs::exists(prefix + suffix, ec))
        throw Error(MTRT_STATUS_ALREADY_EXISTS,
                    "'" + prefix + suffix +
                        "' exists; megatron-preprocess does not overwrite "
                        "it: choose another --output-prefix, or pass --force "
                        "to replace it");
}

/// Tokenizes `batch` on up to `workers` threads (each with its tokenizer)
/// and throws the first document's error in input order.
void tokenizeBatch(std::vector<Document> &batch,
                   std::vector<std::unique_ptr<Tokenizer>> &tokenizers,
                   const std::vector<std::string> &keys) {
  size_t workers = std::min(tokenizers.size(), batch.size());
  if (workers <= 1) {
    for (Document &d : batch)
      tokenize(d, *tokenizers[0], keys);
  } else {
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (size_t w = 0; w < workers; ++w)
      threads.emplace_back([&, w] {
        for (size_t i = next++; i < batch.size(); i = next++)
          tokenize(batch[i], *tokenizers[w], keys);
      });
    for (std::thread &t : threads)
      t.join();
  }
  for (const Document &d : batch)
    if (!d.error.empty())
      invalid(d.error);
}

} // namespace

std::vector<std::string> outputPrefixes(const PreprocessOptions &options) {
  std::vector<std::string> prefixes;
  for (const std::string &key : options.jsonKeys)
    prefixes.push_back(options.outputPrefix + "_" + key + "_document");
  return prefixes;
}

PreprocessSummary preprocess(const PreprocessOptions &options) {
  if (options.inputs.empty())
    invalid("no input: give --input FILE (JSONL with a \"text\" key per "
            "line, or a plain text file)");
  if (options.outputPrefix.empty())
    invalid("--output-prefix is required: where the .bin/.idx files go");
  if (options.jsonKeys.empty())
    invalid("--json-keys: give at least one key");
  if (options.workers < 1)
    invalid("--workers: found " + std::to_string(options.workers) +
            ", expected an integer >= 1");
  bool anyText = false;
  int64_t totalBytes = 0;
  for (const std::string &input : options.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(input, ec))
      throw Error(MTRT_STATUS_NOT_FOUND,
                  "--input: '" + input + "' is not a readable file");
    totalBytes += static_cast<int64_t>(fs::file_size(input, ec));
    anyText |= !isJsonLines(input);
  }
  if (anyText && (options.jsonKeys.size() != 1 ||
                  options.jsonKeys[0] != "text"))
    invalid("--json-keys applies to JSON inputs (*.json, *.jsonl); a plain "
            "text input is one document of the key \"text\"");
  std::vector<std::unique_ptr<Tokenizer>> tokenizers;
  tokenizers.push_back(makeTokenizer(options.tokenizer));
  for (int64_t w = 1; w < options.workers; ++w)
    tokenizers.push_back(tokenizers[0]->clone());
  const Tokenizer &tokenizer = *tokenizers[0];

  std::vector<std::string> prefixes = outputPrefixes(options);
  checkOutputs(options, prefixes);
  TokenType type = tokenTypeForVocabulary(tokenizer.vocabSize());
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const std::string &prefix : prefixes)
    writers.push_back(std::make_unique<IndexedDatasetWriter>(prefix, type));

  PreprocessSummary summary;
  ProgressBar bar(options.progressBar, totalBytes);
  int64_t bytesRead = 0;
  std::vector<Document> batch;
  auto flush = [&](bool last) {
    tokenizeBatch(batch, tokenizers, options.jsonKeys);
    for (Document &d : batch) {
      for (size_t k = 0; k < d.tokens.size(); ++k) {
        std::vector<int32_t> &tokens = d.tokens[k];
        // As Megatron-LM: an empty document has no sequence and no end.
        if (!tokens.empty() && options.appendEod)
          tokens.push_back(tokenizer.eod());
        writers[k]->addDocument(tokens, tokens.empty()
                                            ? std::vector<int64_t>{}
                                            : std::vector<int64_t>{
                                                  static_cast<int64_t>(
                                                      tokens.size())});
        summary.tokens += static_cast<int64_t>(tokens.size());
      }
      ++summary.documents;
    }
    batch.clear();
    bar.update(bytesRead, summary.documents, last);
  };
  for (const std::string &input : options.inputs) {
    std::ifstream in(input, std::ios::binary);
    if (!in)
      throw Error(MTRT_STATUS_NOT_FOUND, "--input: cannot open '" + input +
                                             "' (" + std::strerror(errno) +
                                             ")");
    if (!isJsonLines(input)) {
      Document d;
      d.file = input;
      std::ostringstream text;
      text << in.rdbuf();
      d.raw = text.str();
      bytesRead += static_cast<int64_t>(d.raw.size());
      batch.push_back(std::move(d));
    } else {
      std::string line;
      int64_t lineNumber = 0;
      while (std::getline(in, line)) {
        ++lineNumber;
        bytesRead += static_cast<int64_t>(line.size()) + 1;
        if (line.find_first_not_of(" \t\r") == std::string::npos)
          continue;
        Document d;
        d.file = input;
        d.line = lineNumber;
        d.raw = std::move(line);
        batch.push_back(std::move(d));
        if (batch.size() == kBatchDocuments)
          flush(false);
      }
    }
    if (in.bad())
      throw Error(MTRT_STATUS_DATA_LOSS,
                  "--input: reading '" + input + "' failed");
  }
  flush(true);
  for (auto &writer : writers)
    writer->finish();
  summary.bytes = bytesRead;
  return summary;
}

} // namespace mtrt::data
