// megatron-train: trains a compiled bundle on a text corpus on the CPU.
#include "core/Bundle.h"
#include "train/ByteTokenizer.h"
#include "train/TrainFlags.h"
#include "train/Trainer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

namespace {

std::string readCorpus(const std::string &path) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    throw mtrt::Error(MTRT_STATUS_NOT_FOUND,
                      "--data-path: cannot open '" + path + "' (" +
                          std::strerror(errno) +
                          "); give the path of a text file");
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad())
    throw mtrt::Error(MTRT_STATUS_DATA_LOSS,
                      "--data-path: reading '" + path + "' failed");
  return text.str();
}

int run(int argc, char **argv) {
  using namespace mtrt::train;
  TrainCommand command =
      parseTrainCommand(std::vector<std::string>(argv + 1, argv + argc));
  if (command.help) {
    std::cout << trainUsage();
    return 0;
  }
  mtrt::Bundle bundle = mtrt::Bundle::load(command.bundlePath);
  std::string corpus = readCorpus(command.dataPath);
  Trainer trainer(bundle, corpus, command.dataPath, command.options);
  trainer.train(std::cout);
  if (command.sampleTokens > 0) {
    std::string prompt = command.samplePrompt ? *command.samplePrompt
                                              : trainer.corpus().substr(0, 32);
    std::string text = trainer.sample(prompt, command.sampleTokens);
    std::cout << " greedy sample (" << command.sampleTokens << " tokens) after "
              << command.options.trainIters << " iterations, prompt \""
              << escapeForDisplay(prompt) << "\":\n"
              << escapeForDisplay(text) << "\n";
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const mtrt::Error &e) {
    std::cout.flush();
    std::cerr << "megatron-train: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc &) {
    std::cout.flush();
    std::cerr << "megatron-train: error: out of memory; use a smaller model "
                 "or global batch\n";
    return 1;
  } catch (const std::exception &e) {
    std::cout.flush();
    std::cerr << "megatron-train: internal error: " << e.what() << "\n";
    return 2;
  }
}
