// The command-line mechanism of the runtime's tools: flag tables, parsing of
// `--flag value` and `--flag=value`, suggestions for unknown flags, usage text.
// Each tool keeps its own table and what its flags mean.
#ifndef MTRT_SRC_CORE_COMMANDLINE_H
#define MTRT_SRC_CORE_COMMANDLINE_H

#include "core/Error.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mtrt {

/// One entry of a tool's flag table; `set` stores the value into the tool's
/// options (`flag` is the name as given, for messages).
template <typename Options> struct Flag {
  const char *name;
  const char *metavar; // nullptr: takes no value
  const char *help;
  std::function<void(Options &, const std::string &flag,
                     const std::string &value)>
      set;
};

/// What parseCommandLine leaves to the tool.
struct ParsedCommandLine {
  /// Arguments that are not flags, in order.
  std::vector<std::string> positional;
  /// The names of the flags given, in order.
  std::vector<std::string> given;
  /// `-h` was given.
  bool shortHelp = false;
};

/// Levenshtein distance (for suggestions).
size_t editDistance(const std::string &a, const std::string &b);

/// "unknown flag FLAG; did you mean NEAREST? (TOOL --help lists the flags)":
/// NEAREST is the first of `candidates` at the least edit distance, offered
/// only within max(3, |FLAG| / 3) edits.
std::string unknownFlagMessage(const std::string &flag,
                               const std::vector<std::string> &candidates,
                               const std::string &tool);

/// `text` as an integer >= `min`; INVALID_ARGUMENT naming `flag` otherwise.
int64_t parseIntFlag(const std::string &flag, const std::string &text,
                     int64_t min);

/// One usage line: "  NAME METAVAR" padded to `column` (or on a line of its
/// own when longer), then the help.
std::string flagUsageLine(const char *name, const char *metavar,
                          const char *help, size_t column);

namespace detail {

/// An argument that starts with '-': its name and, after '=', its value.
struct FlagArgument {
  std::string name, value;
  bool inlineValue = false;
};
FlagArgument splitFlagArgument(const std::string &arg);
/// Whether `arg` is positional (not a flag).
bool isPositional(const std::string &arg);
/// Throws when a flag without a value has one (`--flag=value`), or when the
/// value of one that takes a value is missing; otherwise takes that value
/// from the next argument when it was not inline.
void takeFlagValue(const std::vector<std::string> &args, size_t &i,
                   const char *metavar, FlagArgument &flag);

} // namespace detail

/// Parses the arguments after the program name against `flags`, applying
/// each flag to `options` as it comes. `unknownFlag(name)` throws the tool's
/// error for a name the table lacks (unknownFlagMessage gives the usual
/// one). Throws Error (INVALID_ARGUMENT) for a value given to a flag that
/// takes none and for a missing value.
template <typename Options>
ParsedCommandLine
parseCommandLine(const std::vector<std::string> &args,
                 const std::vector<Flag<Options>> &flags, Options &options,
                 const std::function<void(const std::string &)> &unknownFlag) {
  ParsedCommandLine parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &arg = args[i];
    if (arg == "-h") {
      parsed.shortHelp = true;
      continue;
    }
    if (detail::isPositional(arg)) {
      parsed.positional.push_back(arg);
      continue;
    }
    detail::FlagArgument given = detail::splitFlagArgument(arg);
    const Flag<Options> *flag = nullptr;
    for (const Flag<Options> &f : flags)
      if (given.name == f.name)
        flag = &f;
    if (!flag) {
      unknownFlag(given.name);
      throw Error(MTRT_STATUS_INVALID_ARGUMENT, "unknown flag " + given.name);
    }
    detail::takeFlagValue(args, i, flag->metavar, given);
    flag->set(options, given.name, given.value);
    parsed.given.push_back(given.name);
  }
  return parsed;
}

/// The names in a flag table, for unknownFlagMessage.
template <typename Options>
std::vector<std::string> flagNames(const std::vector<Flag<Options>> &flags) {
  std::vector<std::string> names;
  for (const Flag<Options> &f : flags)
    names.push_back(f.name);
  return names;
}

/// The usage lines of a flag table, the help starting at `column`.
template <typename Options>
std::string flagUsage(const std::vector<Flag<Options>> &flags, size_t column) {
  std::string text;
  for (const Flag<Options> &f : flags)
    text += flagUsageLine(f.name, f.metavar, f.help, column);
  return text;
}

} // namespace mtrt

#endif // MTRT_SRC_CORE_COMMANDLINE_H
