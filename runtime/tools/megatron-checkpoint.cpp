// megatron-checkpoint: checks a checkpoint of megatron-train --save, and
// exports its weights to one safetensors file with Hugging Face's names.
#include "core/CommandLine.h"
#include "core/Safetensors.h"
#include "train/Checkpoint.h"

#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

namespace {

using mtrt::Error;
using namespace mtrt::train;

struct Command {
  std::string output;
  std::optional<int64_t> iteration;
  bool help = false;
};

const std::vector<mtrt::Flag<Command>> &flags() {
  using S = const std::string &;
  static const std::vector<mtrt::Flag<Command>> table = {
      {"-o", "FILE", "export-hf: the safetensors file to write",
       [](Command &c, S, S v) { c.output = v; }},
      {"--iteration", "N",
       "the iteration to use (default: the newest, as --load takes it)",
       [](Command &c, S f, S v) { c.iteration = mtrt::parseIntFlag(f, v, 0); }},
      {"--help", nullptr, "print this help and exit",
       [](Command &c, S, S) { c.help = true; }},
  };
  return table;
}

std::string usage() {
  return "usage: megatron-checkpoint verify DIR [--iteration N]\n"
         "       megatron-checkpoint export-hf DIR -o FILE [--iteration N]\n\n"
         "DIR is a --save directory or one of its iter_NNNNNNN directories.\n"
         "verify checks the manifest and every file's size and SHA-256;\n"
         "export-hf writes the parameters, whole, to one safetensors file with\n"
         "Hugging Face's names (vocabulary tables cut to vocab_size rows),\n"
         "which megatron-train --init-from loads into any layout.\n\nflags:\n" +
         mtrt::flagUsage(flags(), 20);
}

/// The iteration directory that DIR and --iteration name.
std::string iterationDirectory(const std::string &dir,
                               std::optional<int64_t> iteration) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(dir) / kCheckpointManifestFile)) {
    if (iteration)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "--iteration: '" + dir +
                      "' is already an iteration directory; give its parent");
    return dir;
  }
  if (iteration) {
    std::string chosen =
        (fs::path(dir) / iterationDirectoryName(*iteration)).string();
    if (!fs::is_directory(chosen))
      throw Error(MTRT_STATUS_NOT_FOUND,
                  "--iteration: '" + dir + "' has no checkpoint of iteration " +
                      std::to_string(*iteration) + " ('" + chosen +
                      "' does not exist)");
    return chosen;
  }
  std::vector<std::string> notes;
  std::optional<std::string> found = findLatestCheckpoint(dir, notes);
  for (const std::string &note : notes)
    std::cerr << note << "\n";
  if (!found)
    throw Error(MTRT_STATUS_NOT_FOUND,
                "'" + dir + "' holds no checkpoint (no " +
                    std::string(kLatestCheckpointFile) +
                    " and no iter_NNNNNNN directory)");
  return *found;
}

std::string layoutText(const CheckpointState &s) {
  return "TP" + std::to_string(s.tensorModelParallelSize) + " PP" +
         std::to_string(s.pipelineModelParallelSize) + " DP" +
         std::to_string(s.dataParallelSize);
}

void exportHf(const CheckpointManifest &m, const std::string &output) {
  const std::string prefix = "model/";
  std::vector<std::vector<float>> values;
  std::vector<mtrt::SafetensorsWriteTensor> tensors;
  for (const auto &[name, entry] : m.tensors) {
    if (name.compare(0, prefix.size(), prefix) != 0)
      continue;
    mtrt::SafetensorsWriteTensor t;
    t.name = name.substr(prefix.size());
    t.shape = entry.globalShape;
    values.push_back(readWholeTensor(m, name));
    // Hugging Face's tables have vocab_size rows: the padding goes.
    if (entry.vocabularyRows && !t.shape.empty() &&
        t.shape[0] > m.state.vocabSize && m.state.vocabSize > 0)
      t.shape[0] = m.state.vocabSize;
    tensors.push_back(std::move(t));
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    tensors[i].data = values[i].data();
  if (tensors.empty())
    throw Error(MTRT_STATUS_NOT_FOUND,
                "checkpoint '" + m.directory + "' holds no model/ tensors");
  mtrt::writeSafetensors(output, tensors,
                         {{"format", "pt"}, {"producer", "megatron-checkpoint"}});
  std::cout << "exported " << tensors.size() << " tensors of iteration "
            << m.state.iteration << " from '" << m.directory << "' to '"
            << output << "'\n";
}

int run(int argc, char **argv) {
  Command command;
  std::vector<std::string> args(argv + 1, argv + argc);
  mtrt::ParsedCommandLine parsed = mtrt::parseCommandLine<Command>(
      args, flags(), command, [](const std::string &flag) {
        throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                    mtrt::unknownFlagMessage(flag, mtrt::flagNames(flags()),
                                             "megatron-checkpoint"));
      });
  if (command.help || parsed.shortHelp) {
    std::cout << usage();
    return 0;
  }
  const std::vector<std::string> &p = parsed.positional;
  if (p.size() != 2 || (p[0] != "verify" && p[0] != "export-hf"))
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "expected a command (verify or export-hf) and a directory; " +
                    usage());
  std::string dir = iterationDirectory(p[1], command.iteration);
  CheckpointManifest manifest = readCheckpointManifest(dir);
  if (p[0] == "verify") {
    verifyCheckpointFiles(manifest);
    std::cout << "checkpoint '" << dir << "': iteration "
              << manifest.state.iteration << ", "
              << layoutText(manifest.state) << ", "
              << manifest.tensors.size() << " tensors in "
              << manifest.files.size()
              << " files: every size and SHA-256 matches the manifest\n";
    return 0;
  }
  if (command.output.empty())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "export-hf needs -o FILE: the safetensors file to write");
  exportHf(manifest, command.output);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const Error &e) {
    std::cerr << "megatron-checkpoint: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception &e) {
    std::cerr << "megatron-checkpoint: internal error: " << e.what() << "\n";
    return 2;
  }
}
