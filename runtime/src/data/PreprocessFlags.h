// megatron-preprocess's command line: Megatron-LM's
// tools/preprocess_data.py flag names, parsed into PreprocessOptions.
#ifndef MTRT_SRC_DATA_PREPROCESSFLAGS_H
#define MTRT_SRC_DATA_PREPROCESSFLAGS_H

#include "data/Preprocess.h"

#include <string>
#include <vector>

namespace mtrt::data {

struct PreprocessCommand {
  PreprocessOptions options;
  bool help = false;
};

/// Parses the arguments after the program name. --input and --json-keys
/// take one or more values (up to the next flag), as in Megatron-LM. Throws
/// Error (INVALID_ARGUMENT) naming the flag, the value and what was
/// expected.
PreprocessCommand parsePreprocessCommand(const std::vector<std::string> &args);

std::string preprocessUsage();

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_PREPROCESSFLAGS_H
