// megatron-checkpoint: checks a checkpoint of megatron-train --save, exports
// it as a directory transformers' from_pretrained loads (config.json,
// generation_config.json, safetensors shards), and imports a Hugging Face
// safetensors file as a checkpoint that any layout loads.
#include "core/Bundle.h"
#include "core/CommandLine.h"
#include "core/Safetensors.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/Checkpoint.h"
#include "train/HuggingFaceConfig.h"
#include "train/Weights.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

namespace {

using mtrt::Error;
using namespace mtrt::train;

/// transformers' default max_shard_size, "5GB".
constexpr uint64_t kDefaultMaxShardBytes = 5000000000ull;

/// "5GB", "500MB", "2GiB", "1000000": bytes, with transformers' decimal units
/// (KB, MB, GB) and binary ones (KiB, MiB, GiB).
uint64_t parseShardSize(const std::string &flag, const std::string &text) {
  size_t digits = 0;
  while (digits < text.size() &&
         std::isdigit(static_cast<unsigned char>(text[digits])))
    ++digits;
  std::string unit = text.substr(digits);
  static const std::pair<const char *, uint64_t> units[] = {
      {"", 1},
      {"B", 1},
      {"KB", 1000ull},
      {"MB", 1000000ull},
      {"GB", 1000000000ull},
      {"KiB", 1024ull},
      {"MiB", 1048576ull},
      {"GiB", 1073741824ull}};
  for (const auto &[name, scale] : units) {
    if (digits == 0 || digits > 12 || unit != name)
      continue;
    uint64_t value = std::stoull(text.substr(0, digits)) * scale;
    if (value > 0)
      return value;
  }
  throw Error(MTRT_STATUS_INVALID_ARGUMENT,
              flag +
                  ": expected a positive size such as 5GB, 500MB, 2GiB "
                  "or a number of bytes, got '" +
                  text + "'");
}

struct Command {
  std::string output, bundle;
  std::optional<int64_t> iteration, numAttentionHeads, numQueryGroups;
  uint64_t maxShardBytes = kDefaultMaxShardBytes;
  bool help = false;
};

const std::vector<mtrt::Flag<Command>> &flags() {
  using S = const std::string &;
  static const std::vector<mtrt::Flag<Command>> table = {
      {"-o", "DIR",
       "export-hf: the directory to write (created; files of the same "
       "names are replaced); import-hf: the --save directory to write",
       [](Command &c, S, S v) { c.output = v; }},
      {"--max-shard-size", "SIZE",
       "export-hf: the largest safetensors shard, as transformers' "
       "max_shard_size (default 5GB); a larger tensor gets a shard alone",
       [](Command &c, S f, S v) { c.maxShardBytes = parseShardSize(f, v); }},
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
         "       megatron-checkpoint export-hf DIR -o OUT [--iteration N]\n"
         "       megatron-checkpoint import-hf FILE --bundle B.mtb -o DIR\n\n"
         "DIR is a --save directory or one of its iter_NNNNNNN directories.\n"
         "verify checks the manifest and every file's size and SHA-256;\n"
         "export-hf writes the directory OUT that transformers' "
         "from_pretrained\n"
         "loads: config.json (the model's family, sizes, rope and norms),\n"
         "generation_config.json, and the parameters, whole, with Hugging\n"
         "Face's names and layout (vocabulary tables cut to vocab_size rows,\n"
         "GPT-2's c_attn columns as [q | k | v]) in model.safetensors, or in\n"
         "model-0000K-of-0000N.safetensors shards of at most --max-shard-size\n"
         "with model.safetensors.index.json; megatron-train --init-from loads\n"
         "a single model.safetensors. import-hf writes such a file as the\n"
         "checkpoint of iteration 0 in DIR, which megatron-train --load loads\n"
         "into any layout.\n\nflags:\n" +
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
    throw Error(MTRT_STATUS_NOT_FOUND, "'" + dir +
                                           "' holds no checkpoint (no " +
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

/// "model-00001-of-00003.safetensors", as transformers names its shards.
std::string shardName(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors",
                index + 1, count);
  return name;
}

void writeJson(const std::filesystem::path &path, const nlohmann::json &j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out.flush())
    throw Error(MTRT_STATUS_INTERNAL, "cannot write '" + path.string() + "'");
}

void exportHf(const CheckpointManifest &m, const std::string &output,
              uint64_t maxShardBytes) {
  namespace fs = std::filesystem;
  if (m.state.huggingFaceConfig.is_null())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "checkpoint '" + m.directory + "' records no config.json: " +
                    (m.state.huggingFaceConfigProblem.empty()
                         ? std::string("it was saved before checkpoints "
                                       "recorded one; load it with "
                                       "megatron-train --load and save it "
                                       "again (--train-iters at its "
                                       "iteration, --save)")
                         : m.state.huggingFaceConfigProblem));
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

  // Shards in name order, each up to maxShardBytes (a larger tensor alone),
  // as transformers' save_pretrained splits them.
  std::sort(tensors.begin(), tensors.end(),
            [](const auto &a, const auto &b) { return a.name < b.name; });
  std::vector<std::vector<mtrt::SafetensorsWriteTensor>> shards(1);
  uint64_t shardBytes = 0, totalBytes = 0;
  for (const mtrt::SafetensorsWriteTensor &t : tensors) {
    uint64_t bytes = sizeof(float);
    for (int64_t d : t.shape)
      bytes *= static_cast<uint64_t>(d);
    if (!shards.back().empty() && shardBytes + bytes > maxShardBytes) {
      shards.emplace_back();
      shardBytes = 0;
    }
    shards.back().push_back(t);
    shardBytes += bytes;
    totalBytes += bytes;
  }

  std::error_code error;
  fs::create_directories(output, error);
  if (error || !fs::is_directory(output))
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "-o: cannot make the directory '" + output + "'" +
                    (error ? ": " + error.message() : std::string()));
  const fs::path dir(output);
  // Files a previous export left that this one would not replace.
  for (const fs::directory_entry &old : fs::directory_iterator(dir)) {
    std::string name = old.path().filename().string();
    if (name == "model.safetensors.index.json" ||
        (name.rfind("model", 0) == 0 && name.size() > 12 &&
         name.substr(name.size() - 12) == ".safetensors"))
      fs::remove(old.path());
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"producer", "megatron-checkpoint"}};
  nlohmann::json weightMap = nlohmann::json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    std::string file =
        shards.size() == 1 ? "model.safetensors" : shardName(k, shards.size());
    mtrt::writeSafetensors((dir / file).string(), shards[k], metadata);
    for (const mtrt::SafetensorsWriteTensor &t : shards[k])
      weightMap[t.name] = file;
  }
  if (shards.size() > 1)
    writeJson(dir / "model.safetensors.index.json",
              {{"metadata", {{"total_size", totalBytes}}},
               {"weight_map", weightMap}});
  writeJson(dir / "config.json", m.state.huggingFaceConfig);
  writeJson(dir / "generation_config.json", huggingFaceGenerationConfig());
  std::cout << "exported " << tensors.size() << " tensors of iteration "
            << m.state.iteration << " from '" << m.directory << "' to '"
            << output << "' ("
            << m.state.huggingFaceConfig.value("model_type", "") << ", "
            << shards.size() << (shards.size() == 1 ? " shard" : " shards")
            << ")\n";
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
  std::cout << "imported " << report.parameters << " parameters from '" << input
            << "' to '" << dir << "' (iteration 0)\n";
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
              << manifest.state.iteration << ", " << layoutText(manifest.state)
              << ", " << manifest.tensors.size() << " tensors in "
              << manifest.files.size()
              << " files: every size and SHA-256 matches the manifest\n";
    return 0;
  }
  if (command.output.empty())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "export-hf needs -o DIR: the directory to write");
  CheckpointState &state = manifest.state;
  if (command.numAttentionHeads) {
    int64_t groups =
        state.numQueryGroups ? state.numQueryGroups : state.numAttentionHeads;
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
  exportHf(manifest, command.output, command.maxShardBytes);
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
