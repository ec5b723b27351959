// megatron-preprocess: tokenizes text or JSONL into Megatron-LM's indexed
// datasets.
#include "core/Error.h"
#include "data/IndexedDataset.h"
#include "data/PreprocessFlags.h"

#include <iostream>

namespace {

int run(int argc, char **argv) {
  using namespace mtrt::data;
  PreprocessCommand command =
      parsePreprocessCommand(std::vector<std::string>(argv + 1, argv + argc));
  if (command.help) {
    std::cout << preprocessUsage();
    return 0;
  }
  PreprocessSummary summary = preprocess(command.options);
  for (const std::string &prefix : outputPrefixes(command.options))
    std::cout << "wrote " << prefix << ".bin and .idx\n";
  std::cout << summary.documents << " documents, " << summary.tokens
            << " tokens from " << summary.bytes << " bytes ("
            << command.options.tokenizer.type << ")\n";
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const mtrt::Error &e) {
    std::cout.flush();
    std::cerr << "megatron-preprocess: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc &) {
    std::cerr << "megatron-preprocess: error: out of memory\n";
    return 1;
  } catch (const std::exception &e) {
    std::cerr << "megatron-preprocess: internal error: " << e.what() << "\n";
    return 2;
  }
}
