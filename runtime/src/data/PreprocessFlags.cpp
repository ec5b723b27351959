// The flag table of megatron-preprocess and its parser.
#include "data/PreprocessFlags.h"

#include "core/CommandLine.h"

#include <algorithm>
#include <sstream>

namespace mtrt::data {

namespace {

[[noreturn]] void invalid(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

using Flag = mtrt::Flag<PreprocessCommand>;

/// Flags of several values arrive one by one (see gatherValues).
const std::vector<Flag> &flags() {
  using C = PreprocessCommand;
  using S = const std::string &;
  static const std::vector<Flag> table = {
      {"--input", "FILE...",
       "inputs: *.json / *.jsonl with one JSON object per line, or plain "
       "text files (one document each)",
       [](C &c, S, S v) { c.options.inputs.push_back(v); }},
      {"--output-prefix", "PREFIX",
       "writes PREFIX_<key>_document.bin and .idx (required)",
       [](C &c, S, S v) { c.options.outputPrefix = v; }},
      {"--json-keys", "KEY...", "keys of the JSON objects to tokenize "
                                "(default text)",
       [](C &c, S, S v) { c.options.jsonKeys.push_back(v); }},
      {"--tokenizer-type", "TYPE",
       "GPT2BPETokenizer, HuggingFaceTokenizer or ByteTokenizer "
       "(required)",
       [](C &c, S, S v) { c.options.tokenizer.type = v; }},
      {"--vocab-file", "FILE", "GPT-2's encoder.json (GPT2BPETokenizer)",
       [](C &c, S, S v) { c.options.tokenizer.vocabFile = v; }},
      {"--merge-file", "FILE", "GPT-2's vocab.bpe (GPT2BPETokenizer)",
       [](C &c, S, S v) { c.options.tokenizer.mergeFile = v; }},
      {"--tokenizer-model", "DIR",
       "a Hugging Face model directory: its tokenizer.json and "
       "tokenizer_config.json (HuggingFaceTokenizer)",
       [](C &c, S, S v) { c.options.tokenizer.tokenizerModel = v; }},
      {"--append-eod", nullptr,
       "end every non-empty document with the tokenizer's end-of-document "
       "token",
       [](C &c, S, S) { c.options.appendEod = true; }},
      {"--workers", "N",
       "threads that tokenize (default 1); the output is the same for "
       "every N",
       [](C &c, S f, S v) { c.options.workers = parseIntFlag(f, v, 1); }},
      {"--force", nullptr, "overwrite existing outputs",
       [](C &c, S, S) { c.options.force = true; }},
      {"--no-progress-bar", nullptr,
       "never draw the progress bar (drawn only when stderr is a terminal)",
       [](C &c, S, S) { c.options.progressBar = false; }},
      {"--help", nullptr, "print this help and exit",
       [](C &c, S, S) { c.help = true; }},
  };
  return table;
}

/// "--input a b --workers 2" -> "--input=a --input=b --workers 2": the
/// values after a flag of several values, up to the next flag.
std::vector<std::string> gatherValues(const std::vector<std::string> &args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &arg = args[i];
    if (arg != "--input" && arg != "--json-keys") {
      out.push_back(arg);
      continue;
    }
    size_t j = i + 1;
    while (j < args.size() && !(args[j].size() > 1 && args[j][0] == '-'))
      out.push_back(arg + "=" + args[j++]);
    if (j == i + 1)
      invalid(arg + " expects a value");
    i = j - 1;
  }
  return out;
}

} // namespace

PreprocessCommand parsePreprocessCommand(const std::vector<std::string> &args) {
  PreprocessCommand command;
  command.options.jsonKeys.clear();
  ParsedCommandLine parsed = parseCommandLine(
      gatherValues(args), flags(), command, [](const std::string &flag) {
        invalid(unknownFlagMessage(flag, flagNames(flags()),
                                   "megatron-preprocess"));
      });
  command.help |= parsed.shortHelp;
  if (command.help)
    return command;
  if (!parsed.positional.empty())
    invalid("unexpected argument '" + parsed.positional[0] +
            "'; inputs are given with --input");
  PreprocessOptions &o = command.options;
  if (o.jsonKeys.empty())
    o.jsonKeys = {"text"};
  for (size_t k = 0; k < o.jsonKeys.size(); ++k)
    if (std::count(o.jsonKeys.begin(), o.jsonKeys.end(), o.jsonKeys[k]) > 1)
      invalid("--json-keys: '" + o.jsonKeys[k] + "' is given twice");
  if (o.inputs.empty())
    invalid("--input is required: the JSONL or text files to tokenize");
  if (o.outputPrefix.empty())
    invalid("--output-prefix is required: where the .bin/.idx files go");
  if (std::find(parsed.given.begin(), parsed.given.end(),
                "--tokenizer-type") == parsed.given.end())
    invalid("--tokenizer-type is required: GPT2BPETokenizer (with "
            "--vocab-file and --merge-file), HuggingFaceTokenizer (with "
            "--tokenizer-model) or ByteTokenizer");
  return command;
}

std::string preprocessUsage() {
  std::ostringstream s;
  s << "usage: megatron-preprocess --input FILE... --output-prefix PREFIX "
       "--tokenizer-type TYPE [flags]\n\n"
       "Tokenizes documents into Megatron-LM's indexed dataset "
       "(PREFIX_<key>_document.bin\nand .idx), which megatron-train "
       "--data-path PREFIX_text_document reads.\n\nflags:\n";
  s << flagUsage(flags(), 30);
  return s.str();
}

} // namespace mtrt::data
