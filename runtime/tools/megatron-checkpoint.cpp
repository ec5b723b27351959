// megatron-checkpoint: checks a checkpoint of megatron-train --save, exports
// its weights to one safetensors file with Hugging Face's names, and imports
// such a file as a checkpoint that any layout loads.
#include "core/Bundle.h"
#include "core/CommandLine.h"
#include "core/Safetensors.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/Checkpoint.h"
#include "train/Weights.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

namespace {

using mtrt::Error;
using namespace mtrt::train;

struct Command {
  std::string output, bundle;
  std::optional<int64_t> iteration, numAttentionHeads, numQueryGroups;
  bool help = false;
};

const std::vector<mtrt::Flag<Command>> &flags() {
  using S = const std::string &;
  static const std::vector<mtrt::Flag<Command>> table = {
      {"-o", "PATH",
       "export-hf: the safetensors file to write; import-hf: the --save "
       "directory to write",
       [](Command &c, S, S v) { c.output = v; }},
      {"--bundle", "FILE",
       "import-hf: a one-rank bundle of the model (megatron-compile without "
       "parallel flags), which names and shapes the parameters",
       [](Command &c, S, S v) { c.bundle = v; }},
      {"--iteration", "N",
       "the iteration to use (default: the newest, as --load takes it)",
       [](Command &c, S f, S v) { c.iteration = mtrt::parseIntFlag(f, v, 0); }},
      {"--num-attention-heads", "N",
       "export-hf: the model's heads, for a checkpoint whose manifest does "
       "not record them (older versions); GPT-2's c_attn needs them",
       [](Command &c, S f, S v) {
         c.numAttentionHeads = mtrt::parseIntFlag(f, v, 1);
       }},
      {"--num-query-groups", "G",
       "export-hf: the model's key/value groups, with --num-attention-heads "
       "(default: one a head)",
       [](Command &c, S f, S v) {
         c.numQueryGroups = mtrt::parseIntFlag(f, v, 1);
       }},
      {"--help", nullptr, "print this help and exit",
       [](Command &c, S, S) { c.help = true; }},
  };
  return table;
}

std::string usage() {
  return "usage: megatron-checkpoint verify DIR [--iteration N]\n"
         "       megatron-checkpoint export-hf DIR -o FILE [--iteration N]\n"
         "       megatron-checkpoint import-hf FILE --bundle B.mtb -o DIR\n\n"
         "DIR is a --save directory or one of its iter_NNNNNNN directories.\n"
         "verify checks the manifest and every file's size and SHA-256;\n"
         "export-hf writes the parameters, whole, to one safetensors file with\n"
         "Hugging Face's names and layout (vocabulary tables cut to vocab_size\n"
         "rows, GPT-2's c_attn columns as [q | k | v]), which megatron-train\n"
         "--init-from loads; import-hf writes such a file as the checkpoint of\n"
         "iteration 0 in DIR, which megatron-train --load loads into any\n"
         "layout.\n\nflags:\n" +
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

/// GPT-2's fused c_attn of the checkpoint, whose columns are stored per
/// query group: for each column of Hugging Face's [q | k | v], the stored
/// column that holds it.
std::vector<int64_t> qkvColumns(const CheckpointManifest &m,
                                const std::string &name,
                                const std::vector<int64_t> &shape) {
  const CheckpointState &s = m.state;
  int64_t columns = shape.empty() ? 0 : shape.back();
  if (s.numAttentionHeads <= 0)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "checkpoint '" + m.directory + "' holds GPT-2's fused '" +
                    name +
                    "', stored per query group, but its manifest records no "
                    "num_attention_heads (it was saved before manifests "
                    "recorded them), so its columns cannot be put back in "
                    "Hugging Face's [q | k | v] order; pass the model's "
                    "--num-attention-heads (and --num-query-groups if it "
                    "groups its keys and values)");
  std::optional<std::vector<int64_t>> from = fusedQkvColumnsFromHuggingFace(
      s.numAttentionHeads, s.numQueryGroups, columns);
  if (!from)
    throw Error(MTRT_STATUS_DATA_LOSS,
                "checkpoint '" + m.directory + "': '" + name + "' has " +
                    std::to_string(columns) +
                    " columns, which is not (num_attention_heads + 2 * "
                    "num_query_groups) * head_dim for the manifest's " +
                    std::to_string(s.numAttentionHeads) + " heads and " +
                    std::to_string(s.numQueryGroups) + " query groups");
  return *from;
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
    if (isFusedQkv(t.name))
      permuteColumns(values.back().data(),
                     static_cast<int64_t>(values.back().size()),
                     qkvColumns(m, t.name, t.shape), /*gather=*/false);
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

/// Writes the Hugging Face file `input` as the checkpoint of iteration 0 in
/// `output`: the parameters of the one-rank `bundlePath`, read as
/// megatron-train --init-from reads them (names, dtypes, GPT-2's c_attn
/// order, a tied lm_head), vocabulary tables of vocab_size rows (a run
/// keeps its own padding rows), and AdamW's moments at zero. Iteration 0
/// has no schedule or data order to continue, so any run loads it.
void importHf(const std::string &input, const std::string &bundlePath,
              const std::string &output) {
  mtrt::Bundle bundle = mtrt::Bundle::load(bundlePath);
  if (bundle.rankCount() > 1)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "--bundle: '" + bundlePath + "' is a bundle of " +
                    std::to_string(bundle.rankCount()) +
                    " ranks; import-hf reads whole tensors, so give it a "
                    "one-rank bundle of the model (megatron-compile without "
                    "the parallel flags): the checkpoint it writes loads into "
                    "any layout");
  mtrt::SafetensorsFile file = mtrt::SafetensorsFile::open(input);
  mtrt::host::ParameterStore store(bundle);
  {
    mtrt::host::ThreadPool pool(1);
    store.initialize(pool, 0);
  }
  WeightsLoadReport report = loadWeights(file, bundle, store);
  const mtrt::ModelConfig &model = bundle.model();
  std::vector<CheckpointTensor> tensors =
      storeCheckpointTensors(store, /*severalRanks=*/false);
  for (CheckpointTensor &t : tensors)
    if (t.vocabularyRows && model.vocabSize > 0 &&
        t.globalShape[0] > model.vocabSize)
      t.globalShape[0] = t.slice.shape[0] = model.vocabSize;
  CheckpointState state;
  state.optimizer = {{"name", "adamw"}};
  state.lossScale = {{"kind", "none"}, {"scale", 1.0}};
  state.dataPath = "(imported from " + input + ")";
  state.globalBatchSize = std::max<int64_t>(model.globalBatchSize, 1);
  state.microBatchesPerIteration = 1;
  recordBundle(state, bundle);
  // Hugging Face's tensors hold the unpadded vocabulary.
  state.paddedVocabSize = model.vocabSize;
  std::string dir = saveCheckpoint(output, state, tensors, nullptr);
  std::cout << "imported " << report.parameters << " parameters from '"
            << input << "' to '" << dir << "' (iteration 0)\n";
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
  if (p.size() != 2 ||
      (p[0] != "verify" && p[0] != "export-hf" && p[0] != "import-hf"))
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "expected a command (verify, export-hf or import-hf) and a "
                "directory or file; " +
                    usage());
  if (p[0] == "import-hf") {
    if (command.bundle.empty() || command.output.empty())
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "import-hf needs --bundle B.mtb (a one-rank bundle of the "
                  "model) and -o DIR (the --save directory to write)");
    importHf(p[1], command.bundle, command.output);
    return 0;
  }
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
  CheckpointState &state = manifest.state;
  if (command.numAttentionHeads) {
    int64_t groups = state.numQueryGroups ? state.numQueryGroups
                                          : state.numAttentionHeads;
    if (state.numAttentionHeads > 0 &&
        (state.numAttentionHeads != *command.numAttentionHeads ||
         groups != command.numQueryGroups.value_or(*command.numAttentionHeads)))
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "--num-attention-heads: checkpoint '" + dir + "' records " +
                      std::to_string(state.numAttentionHeads) + " heads in " +
                      std::to_string(groups) +
                      " query groups; leave the flags out");
    state.numAttentionHeads = *command.numAttentionHeads;
    state.numQueryGroups =
        command.numQueryGroups.value_or(*command.numAttentionHeads);
  }
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
