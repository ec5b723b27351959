// Saving, finding, checking and loading sharded checkpoints.
#include "train/Checkpoint.h"
#include "train/HuggingFaceConfig.h"

#include "comm/Communicator.h"
#include "core/Bundle.h"
#include "core/DurableFile.h"
#include "core/Safetensors.h"
#include "core/Sha256.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <unistd.h>

namespace mtrt::train {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr const char kFormat[] = "mtrt-checkpoint";
constexpr int64_t kFormatVersion = 1;
constexpr const char kSlicesKey[] = "mtrt_checkpoint_slices";

std::string join(const std::string &dir, const std::string &name) {
  return (fs::path(dir) / name).string();
}

//===----------------------------------------------------------------------===//
// Crash injection (tests)
//===----------------------------------------------------------------------===//

/// Kills the process once the saves of this process have written
/// MTRT_CHECKPOINT_CRASH_AFTER_BYTES bytes: a write that crosses the limit
/// writes up to it first; every later step (a write, a rename) dies.
class CrashInjector {
public:
  static CrashInjector &instance() {
    static CrashInjector injector;
    return injector;
  }

  void write(DurableFile &file, const void *data, uint64_t size) {
    if (limit_ < 0) {
      file.write(data, size);
      return;
    }
    int64_t before = written_.fetch_add(static_cast<int64_t>(size));
    if (before + static_cast<int64_t>(size) <= limit_) {
      file.write(data, size);
      return;
    }
    if (before < limit_)
      file.write(data, static_cast<uint64_t>(limit_ - before));
    die();
  }

  /// Before a rename: dies if the limit was reached.
  void step() {
    if (limit_ >= 0 && written_.load() >= limit_)
      die();
  }

private:
  CrashInjector() {
    if (const char *text = std::getenv(kCrashAfterBytesVariable))
      limit_ = std::strtoll(text, nullptr, 10);
  }
  [[noreturn]] static void die() {
    std::fflush(nullptr);
    ::kill(::getpid(), SIGKILL);
    std::abort();
  }

  int64_t limit_ = -1;
  std::atomic<int64_t> written_{0};
};

void writeDurably(const std::string &path, const std::string &what,
                  const std::string &text) {
  DurableFile file(path, what);
  CrashInjector::instance().write(file, text.data(), text.size());
  CrashInjector::instance().step();
  file.commit();
}

//===----------------------------------------------------------------------===//
// Names and JSON
//===----------------------------------------------------------------------===//

/// The names of the grid's axes: [dp, tp]; a pipeline's [pp, dp, tp];
/// under context parallelism [dp, cp, tp], or [pp, dp, cp, tp] with a
/// pipeline; under expert parallelism over part of the data-parallel ranks
/// [edp, ep, tp] ("data", "expert", "tensor"), or with a pipeline
/// [pp, edp, ep, tp] (the bundle's grids, docs/BundleFormat.md).
std::vector<std::string> gridAxisNames(const CheckpointState &s) {
  const bool pipelined = s.pipelineModelParallelSize > 1;
  // Expert parallelism over part of the data-parallel ranks splits the
  // data axis in two: [edp, ep] in place of [dp] (docs/MoE.md).
  const bool expert =
      gridDataAxes(s.grid, pipelined, s.dataParallelSize).size() == 2;
  const char *second = expert ? "expert" : "context";
  switch (s.grid.size()) {
  case 2:
    return {"data", "tensor"};
  case 3:
    if (pipelined)
      return {"pipeline", "data", "tensor"};
    return {"data", second, "tensor"};
  case 4:
    return {"pipeline", "data", second, "tensor"};
  default:
    return {};
  }
}

/// Megatron-LM's mp_rank_TT_PPP, with _dp_DDD for data-parallel ranks other
/// than 0 (which hold pieces only with a distributed optimizer), and
/// _cp_CCC for context-parallel ranks other than 0 (which hold pieces only
/// with a distributed optimizer sharded over the data x context ranks).
std::string shardFileName(const CheckpointState &s, int64_t rank) {
  int64_t tp = 0, pp = 0, dp = 0, cp = 0;
  std::vector<std::string> names = gridAxisNames(s);
  if (!names.empty()) {
    std::vector<int64_t> c = gridCoordinates(s.grid, rank);
    for (size_t a = 0; a < names.size(); ++a) {
      if (names[a] == "pipeline")
        pp = c[a];
      else if (names[a] == "data")
        dp = c[a];
      else if (names[a] == "expert") // the data rank over [edp, ep]
        dp = dp * s.grid[a] + c[a];
      else if (names[a] == "tensor")
        tp = c[a];
      else if (names[a] == "context")
        cp = c[a];
    }
  }
  char name[96];
  int used = std::snprintf(name, sizeof(name), "mp_rank_%02lld_%03lld",
                           static_cast<long long>(tp),
                           static_cast<long long>(pp));
  if (dp != 0)
    used += std::snprintf(name + used, sizeof(name) - used, "_dp_%03lld",
                          static_cast<long long>(dp));
  if (cp != 0)
    used += std::snprintf(name + used, sizeof(name) - used, "_cp_%03lld",
                          static_cast<long long>(cp));
  std::snprintf(name + used, sizeof(name) - used, ".safetensors");
  return name;
}

Json sliceJson(const TensorSlice &slice) {
  Json j = {{"offsets", slice.offsets}, {"shape", slice.shape}};
  if (slice.flat)
    j["flat_range"] = {slice.flat->first, slice.flat->second};
  return j;
}

Json stateJson(const CheckpointState &s) {
  return {
      {"iteration", s.iteration},
      {"consumed_samples", s.consumedSamples},
      {"layout",
       {{"tensor_model_parallel_size", s.tensorModelParallelSize},
        {"pipeline_model_parallel_size", s.pipelineModelParallelSize},
        {"data_parallel_size", s.dataParallelSize},
        {"use_distributed_optimizer", s.distributedOptimizer},
        {"grid", s.grid},
        {"grid_axes", gridAxisNames(s)}}},
      {"bundle",
       {{"name", s.bundleName},
        {"sha256", s.bundleSha256},
        {"model", s.modelName},
        {"vocab_size", s.vocabSize},
        {"padded_vocab_size", s.paddedVocabSize},
        {"num_attention_heads", s.numAttentionHeads},
        {"num_query_groups", s.numQueryGroups},
        {"hugging_face_config", s.huggingFaceConfig},
        {"hugging_face_config_problem", s.huggingFaceConfigProblem}}},
      {"random",
       {{"generator", "counter-based, keyed on (seed, micro_step, element)"},
        {"seed", s.seed},
        {"micro_step", s.microStep}}},
      {"data",
       {{"path", s.dataPath},
        {"split", s.split},
        {"consumed_samples", s.consumedSamples},
        {"global_batch_size", s.globalBatchSize},
        {"micro_batches_per_iteration", s.microBatchesPerIteration}}},
      {"optimizer", s.optimizer},
      {"optimizer_step", s.optimizerStep},
      {"loss_scale", s.lossScale},
      {"master_weights", false},
  };
}

/// Reads a manifest's fields; every failure names the file and the field.
class ManifestReader {
public:
  explicit ManifestReader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string &where, const std::string &found,
                         const std::string &expected) const {
    throw Error(MTRT_STATUS_DATA_LOSS,
                "checkpoint manifest '" + file_ + "': " + where + ": found " +
                    found + ", expected " + expected +
                    " (the manifest is corrupted or of another format)");
  }

  const Json &at(const Json &object, const std::string &key,
                 const std::string &where) const {
    if (!object.is_object() || !object.contains(key))
      fail(where, "no \"" + key + "\"", "the key \"" + key + "\"");
    return object.at(key);
  }
  int64_t integer(const Json &object, const std::string &key,
                  const std::string &where, int64_t min = 0) const {
    const Json &v = at(object, key, where);
    if (!v.is_number_integer() || v.get<int64_t>() < min)
      fail(where + "." + key, v.dump(), "an integer >= " + std::to_string(min));
    return v.get<int64_t>();
  }
  std::string string(const Json &object, const std::string &key,
                     const std::string &where) const {
    const Json &v = at(object, key, where);
    if (!v.is_string())
      fail(where + "." + key, v.dump(), "a string");
    return v.get<std::string>();
  }
  std::vector<int64_t> integers(const Json &object, const std::string &key,
                                const std::string &where) const {
    const Json &v = at(object, key, where);
    std::vector<int64_t> out;
    if (!v.is_array())
      fail(where + "." + key, v.dump(), "an array of integers >= 0");
    for (const Json &e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0)
        fail(where + "." + key, v.dump(), "an array of integers >= 0");
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  TensorSlice slice(const Json &j, const std::string &where) const {
    TensorSlice s;
    s.offsets = integers(j, "offsets", where);
    s.shape = integers(j, "shape", where);
    if (j.contains("flat_range")) {
      std::vector<int64_t> r = integers(j, "flat_range", where);
      if (r.size() != 2)
        fail(where + ".flat_range", j["flat_range"].dump(), "[begin, end]");
      s.flat = std::make_pair(r[0], r[1]);
    }
    return s;
  }

private:
  std::string file_;
};

CheckpointState readState(const ManifestReader &r, const Json &j) {
  CheckpointState s;
  s.iteration = r.integer(j, "iteration", "manifest");
  s.consumedSamples = r.integer(j, "consumed_samples", "manifest");
  const Json &layout = r.at(j, "layout", "manifest");
  s.tensorModelParallelSize =
      r.integer(layout, "tensor_model_parallel_size", "layout", 1);
  s.pipelineModelParallelSize =
      r.integer(layout, "pipeline_model_parallel_size", "layout", 1);
  s.dataParallelSize = r.integer(layout, "data_parallel_size", "layout", 1);
  const Json &distributed = r.at(layout, "use_distributed_optimizer", "layout");
  if (!distributed.is_boolean())
    r.fail("layout.use_distributed_optimizer", distributed.dump(), "a boolean");
  s.distributedOptimizer = distributed.get<bool>();
  s.grid = r.integers(layout, "grid", "layout");
  const Json &bundle = r.at(j, "bundle", "manifest");
  s.bundleName = r.string(bundle, "name", "bundle");
  s.bundleSha256 = r.string(bundle, "sha256", "bundle");
  s.modelName = r.string(bundle, "model", "bundle");
  s.vocabSize = r.integer(bundle, "vocab_size", "bundle");
  s.paddedVocabSize = r.integer(bundle, "padded_vocab_size", "bundle");
  if (bundle.contains("num_attention_heads"))
    s.numAttentionHeads = r.integer(bundle, "num_attention_heads", "bundle");
  if (bundle.contains("num_query_groups"))
    s.numQueryGroups = r.integer(bundle, "num_query_groups", "bundle");
  if (bundle.contains("hugging_face_config")) {
    s.huggingFaceConfig = bundle["hugging_face_config"];
    if (!s.huggingFaceConfig.is_object() && !s.huggingFaceConfig.is_null())
      r.fail("bundle.hugging_face_config", s.huggingFaceConfig.dump(),
             "an object or null");
  }
  if (bundle.contains("hugging_face_config_problem"))
    s.huggingFaceConfigProblem =
        r.string(bundle, "hugging_face_config_problem", "bundle");
  const Json &random = r.at(j, "random", "manifest");
  s.seed = static_cast<uint64_t>(r.integer(random, "seed", "random"));
  s.microStep = static_cast<uint64_t>(r.integer(random, "micro_step", "random"));
  const Json &data = r.at(j, "data", "manifest");
  s.dataPath = r.string(data, "path", "data");
  s.split = r.string(data, "split", "data");
  s.globalBatchSize = r.integer(data, "global_batch_size", "data", 1);
  s.microBatchesPerIteration =
      r.integer(data, "micro_batches_per_iteration", "data", 1);
  s.optimizer = r.at(j, "optimizer", "manifest");
  if (!s.optimizer.is_object())
    r.fail("optimizer", s.optimizer.dump(), "an object");
  s.optimizerStep = r.integer(j, "optimizer_step", "manifest");
  s.lossScale = r.at(j, "loss_scale", "manifest");
  return s;
}

std::string jsonText(const Json &j) { return j.dump(1, ' ') + "\n"; }

} // namespace

bool startsRun(const CheckpointState &state) {
  return state.iteration == 0 && state.optimizerStep == 0 &&
         !state.optimizer.contains("lr");
}

std::string iterationDirectoryName(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld",
                static_cast<long long>(iteration));
  return name;
}

//===----------------------------------------------------------------------===//
// Saving
//===----------------------------------------------------------------------===//

void recordBundle(CheckpointState &state, const Bundle &bundle) {
  const ModelConfig &model = bundle.model();
  state.bundleName = bundle.name();
  state.bundleSha256 = bundle.sha256Hex();
  state.modelName = model.name;
  state.vocabSize = model.vocabSize;
  state.paddedVocabSize = model.paddedVocabSize;
  state.numAttentionHeads = model.numAttentionHeads;
  state.numQueryGroups = model.numQueryGroups;
  // A model no transformers class describes still trains and saves; only
  // export-hf needs the config, and says why there is none.
  try {
    state.huggingFaceConfig = huggingFaceConfig(bundle);
    state.huggingFaceConfigProblem.clear();
  } catch (const Error &e) {
    state.huggingFaceConfig = nullptr;
    state.huggingFaceConfigProblem = e.what();
  }
}

std::string saveCheckpoint(const std::string &saveDir,
                           const CheckpointState &state,
                           const std::vector<CheckpointTensor> &tensors,
                           comm::Communicator *world) {
  const std::string name = iterationDirectoryName(state.iteration);
  const std::string finalDir = join(saveDir, name);
  const std::string partialDir = finalDir + ".partial";
  const std::string what = "saving checkpoint '" + finalDir + "'";
  const int rank = world ? world->rank() : 0;
  const int ranks = world ? world->size() : 1;
  CrashInjector &crash = CrashInjector::instance();
  auto systemFail = [&](const std::string &step, const std::error_code &ec) {
    throw Error(statusCodeForErrno(ec.value()),
                what + ": " + step + ": " + ec.message());
  };
  const std::string label =
      "checkpoint save of iteration " + std::to_string(state.iteration);
  comm::CallInfo info{label, state.iteration};

  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(saveDir, ec);
    if (ec)
      systemFail("cannot create the --save directory '" + saveDir + "'", ec);
    if (fs::exists(finalDir, ec))
      throw Error(MTRT_STATUS_ALREADY_EXISTS,
                  what + ": the directory already exists, and an existing "
                         "checkpoint is never overwritten; move or remove "
                         "it, or pass another --save directory");
    // A .partial directory is what a save that died left; no complete
    // checkpoint ever has that name.
    fs::remove_all(partialDir, ec);
    if (ec)
      systemFail("cannot remove the unfinished '" + partialDir +
                     "' of an interrupted save",
                 ec);
    fs::create_directory(partialDir, ec);
    if (ec)
      systemFail("cannot create '" + partialDir + "'", ec);
    syncDirectory(saveDir, what);
  }
  if (world)
    world->barrier(info);

  // This rank's shard.
  std::vector<SafetensorsWriteTensor> mine;
  Json slices = Json::object();
  for (const CheckpointTensor &t : tensors) {
    if (!t.save)
      continue;
    SafetensorsWriteTensor w;
    w.name = t.name;
    w.shape = t.slice.flat ? std::vector<int64_t>{t.slice.numElements()}
                           : t.slice.shape;
    w.data = t.data;
    mine.push_back(std::move(w));
    Json s = sliceJson(t.slice);
    s["global_shape"] = t.globalShape;
    s["vocabulary_rows"] = t.vocabularyRows;
    slices[t.name] = std::move(s);
  }
  // Per rank: [has a file, bytes, digest as 4 doubles' bits].
  double summary[6] = {0, 0, 0, 0, 0, 0};
  if (!mine.empty()) {
    std::string file = join(partialDir, shardFileName(state, rank));
    std::map<std::string, std::string> metadata = {
        {"format", "pt"},
        {"producer", "megatron-train"},
        {"mtrt_checkpoint_rank", std::to_string(rank)},
        {kSlicesKey, slices.dump()}};
    DurableFile out(file, what);
    Sha256Stream hash;
    uint64_t bytes = 0;
    streamSafetensors(mine, metadata, [&](const void *data, uint64_t size) {
      crash.write(out, data, size);
      hash.update(data, size);
      bytes += size;
    });
    crash.step();
    out.commit();
    Sha256Digest digest = hash.finish();
    summary[0] = 1;
    summary[1] = static_cast<double>(bytes);
    std::memcpy(&summary[2], digest.data(), digest.size());
  }
  std::vector<double> all(static_cast<size_t>(6 * ranks));
  if (world)
    world->allGather(summary, all.data(), 6, info);
  else
    std::copy(summary, summary + 6, all.begin());

  if (rank == 0) {
    Json files = Json::array();
    Json table = Json::object();
    for (int r = 0; r < ranks; ++r) {
      const double *s = &all[static_cast<size_t>(6 * r)];
      if (s[0] == 0)
        continue;
      std::string fileName = shardFileName(state, r);
      Sha256Digest digest;
      std::memcpy(digest.data(), &s[2], digest.size());
      files.push_back(
          {{"name", fileName},
           {"rank", r},
           {"coordinates", state.grid.empty() ? std::vector<int64_t>()
                                              : gridCoordinates(state.grid, r)},
           {"bytes", static_cast<uint64_t>(s[1])},
           {"sha256", toHex(digest)}});
      // The shard's own header says what it holds.
      SafetensorsFile shard =
          SafetensorsFile::open(join(partialDir, fileName));
      Json held = Json::parse(shard.metadata().at(kSlicesKey));
      for (auto &[tensorName, slice] : held.items()) {
        Json &entry = table[tensorName];
        entry["global_shape"] = slice["global_shape"];
        entry["vocabulary_rows"] = slice["vocabulary_rows"];
        Json piece = {{"file", fileName},
                      {"offsets", slice["offsets"]},
                      {"shape", slice["shape"]}};
        if (slice.contains("flat_range"))
          piece["flat_range"] = slice["flat_range"];
        entry["shards"].push_back(std::move(piece));
      }
    }
    Json manifest = {{"format", kFormat}, {"format_version", kFormatVersion}};
    manifest.update(stateJson(state));
    manifest["files"] = std::move(files);
    manifest["tensors"] = std::move(table);
    manifest["manifest_sha256"] = toHex(sha256(manifest.dump().data(),
                                               manifest.dump().size()));
    writeDurably(join(partialDir, kCheckpointManifestFile), what,
                 jsonText(manifest));
    // The iteration directory appears whole or not at all.
    crash.step();
    std::error_code ec;
    fs::rename(partialDir, finalDir, ec);
    if (ec)
      systemFail("cannot rename '" + partialDir + "' to '" + finalDir + "'",
                 ec);
    syncDirectory(saveDir, what);
    // Last: the pointer that Megatron-LM's tools read.
    writeDurably(join(saveDir, kLatestCheckpointFile), what,
                 std::to_string(state.iteration));
  }
  if (world)
    world->barrier(info);
  return finalDir;
}

//===----------------------------------------------------------------------===//
// Finding and reading
//===----------------------------------------------------------------------===//

namespace {

/// The iteration of "iter_NNNNNNN" (at least 7 digits), or -1.
int64_t iterationOfDirectory(const std::string &name) {
  if (name.size() < 12 || name.compare(0, 5, "iter_") != 0)
    return -1;
  int64_t value = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || value > (INT64_MAX - 9) / 10)
      return -1;
    value = value * 10 + (name[i] - '0');
  }
  return value;
}

} // namespace

std::optional<std::string> findLatestCheckpoint(const std::string &dir,
                                                std::vector<std::string> &notes) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return std::nullopt;
  int64_t newest = -1;
  for (const fs::directory_entry &e : fs::directory_iterator(dir, ec)) {
    std::error_code entryError;
    if (e.is_directory(entryError))
      newest = std::max(newest,
                        iterationOfDirectory(e.path().filename().string()));
  }
  if (ec)
    throw Error(statusCodeForErrno(ec.value()),
                "--load: cannot list '" + dir + "': " + ec.message());
  std::string latestPath = join(dir, kLatestCheckpointFile);
  std::ifstream latest(latestPath);
  if (!latest) {
    if (newest < 0)
      return std::nullopt;
    notes.push_back("note: '" + latestPath + "' is missing; loading the "
                    "newest iteration directory, " +
                    iterationDirectoryName(newest));
    return join(dir, iterationDirectoryName(newest));
  }
  std::string text((std::istreambuf_iterator<char>(latest)),
                   std::istreambuf_iterator<char>());
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  int64_t iteration = -1;
  if (!text.empty() && text.size() < 19 &&
      text.find_first_not_of("0123456789") == std::string::npos)
    iteration = std::stoll(text);
  if (iteration < 0)
    throw Error(MTRT_STATUS_DATA_LOSS,
                "--load: '" + latestPath + "' holds \"" + text.substr(0, 40) +
                    "\", expected an iteration number (the file is "
                    "corrupted); write the iteration to load into it");
  std::string chosen = join(dir, iterationDirectoryName(iteration));
  if (newest > iteration) {
    notes.push_back("note: '" + latestPath + "' names iteration " +
                    std::to_string(iteration) + ", but " +
                    iterationDirectoryName(newest) +
                    " is complete (a save was interrupted before it updated "
                    "the latest file); loading iteration " +
                    std::to_string(newest));
    return join(dir, iterationDirectoryName(newest));
  }
  if (!fs::is_directory(chosen, ec))
    throw Error(MTRT_STATUS_DATA_LOSS,
                "--load: '" + latestPath + "' names iteration " +
                    std::to_string(iteration) + " but '" + chosen +
                    "' does not exist; restore it or correct the file");
  return chosen;
}

CheckpointManifest readCheckpointManifest(const std::string &iterationDir) {
  std::string path = join(iterationDir, kCheckpointManifestFile);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(MTRT_STATUS_NOT_FOUND,
                "checkpoint manifest '" + path + "': cannot open it (" +
                    std::strerror(errno) + ")");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  ManifestReader r(path);
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception &e) {
    // nlohmann quotes the bytes it stopped at, which may not be text.
    std::string reason = e.what();
    for (char &c : reason)
      if (static_cast<unsigned char>(c) < 32 ||
          static_cast<unsigned char>(c) > 126)
        c = '?';
    r.fail("the file", "invalid JSON (" + reason + ")", "a JSON object");
  }
  if (!j.is_object())
    r.fail("the file", "a JSON " + std::string(j.type_name()), "an object");
  std::string stored = r.string(j, "manifest_sha256", "manifest");
  j.erase("manifest_sha256");
  std::string dumped = j.dump();
  std::string actual = toHex(sha256(dumped.data(), dumped.size()));
  if (actual != stored)
    r.fail("manifest_sha256", "the contents' SHA-256 " + actual,
           "the recorded " + stored);
  if (r.string(j, "format", "manifest") != kFormat)
    r.fail("format", j["format"].dump(), std::string("\"") + kFormat + "\"");
  int64_t version = r.integer(j, "format_version", "manifest");
  if (version != kFormatVersion)
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                "checkpoint manifest '" + path + "': format_version " +
                    std::to_string(version) + ", this runtime reads " +
                    std::to_string(kFormatVersion));

  CheckpointManifest m;
  m.directory = iterationDir;
  m.state = readState(r, j);
  std::set<std::string> fileNames;
  const Json &files = r.at(j, "files", "manifest");
  if (!files.is_array())
    r.fail("files", files.dump().substr(0, 60), "an array");
  for (const Json &f : files) {
    CheckpointFile file;
    file.name = r.string(f, "name", "files[]");
    if (file.name.empty() || file.name.find('/') != std::string::npos ||
        file.name[0] == '.')
      r.fail("files[].name", "\"" + file.name + "\"",
             "a file name inside the iteration directory");
    file.rank = r.integer(f, "rank", "files[" + file.name + "]");
    file.coordinates = r.integers(f, "coordinates", "files[" + file.name + "]");
    file.bytes = static_cast<uint64_t>(
        r.integer(f, "bytes", "files[" + file.name + "]"));
    file.sha256 = r.string(f, "sha256", "files[" + file.name + "]");
    if (!fileNames.insert(file.name).second)
      r.fail("files", "\"" + file.name + "\" twice", "each file once");
    m.files.push_back(std::move(file));
  }
  const Json &tensors = r.at(j, "tensors", "manifest");
  if (!tensors.is_object())
    r.fail("tensors", tensors.dump().substr(0, 60), "an object");
  for (const auto &[name, t] : tensors.items()) {
    std::string where = "tensors[\"" + name + "\"]";
    CheckpointTensorEntry entry;
    entry.globalShape = r.integers(t, "global_shape", where);
    entry.vocabularyRows = r.at(t, "vocabulary_rows", where).is_boolean() &&
                           t["vocabulary_rows"].get<bool>();
    const Json &shards = r.at(t, "shards", where);
    if (!shards.is_array() || shards.empty())
      r.fail(where + ".shards", shards.dump().substr(0, 60),
             "a non-empty array");
    int64_t total = 1, covered = 0;
    for (int64_t d : entry.globalShape)
      if (__builtin_mul_overflow(total, d, &total))
        r.fail(where + ".global_shape", t["global_shape"].dump(),
               "a shape whose size fits in 64 bits");
    for (const Json &s : shards) {
      CheckpointShard shard;
      shard.file = r.string(s, "file", where + ".shards[]");
      if (!fileNames.count(shard.file))
        r.fail(where + ".shards[].file", "\"" + shard.file + "\"",
               "one of the files listed in \"files\"");
      shard.slice = r.slice(s, where + ".shards[]");
      std::string bad = checkSlice(shard.slice, entry.globalShape);
      if (!bad.empty())
        r.fail(where + ".shards[] in " + shard.file, bad,
               "a slice inside the tensor");
      for (const CheckpointShard &other : entry.shards)
        if (slicesOverlap(other.slice, shard.slice))
          r.fail(where + ".shards[] in " + shard.file,
                 shard.slice.str() + ", which overlaps " + other.slice.str() +
                     " in " + other.file,
                 "shards that do not overlap");
      covered += shard.slice.numElements();
      entry.shards.push_back(std::move(shard));
    }
    if (covered != total)
      r.fail(where + ".shards", std::to_string(covered) + " elements",
             std::to_string(total) + ", the global shape's (every element "
                                     "in exactly one shard)");
    m.tensors.emplace(name, std::move(entry));
  }
  return m;
}

void verifyCheckpointFiles(const CheckpointManifest &manifest,
                           const std::vector<std::string> *only) {
  const std::string fix = "; restore the file, or move '" +
                          manifest.directory +
                          "' away to load the checkpoint before it";
  for (const CheckpointFile &f : manifest.files) {
    if (only && std::find(only->begin(), only->end(), f.name) == only->end())
      continue;
    std::string path = join(manifest.directory, f.name);
    std::error_code ec;
    uint64_t size = fs::file_size(path, ec);
    if (ec)
      throw Error(MTRT_STATUS_DATA_LOSS,
                  "checkpoint file '" + path + "': " + ec.message() +
                      "; the manifest lists it with " +
                      std::to_string(f.bytes) +
                      " bytes (the checkpoint is incomplete)" + fix);
    if (size != f.bytes)
      throw Error(MTRT_STATUS_DATA_LOSS,
                  "checkpoint file '" + path + "': found " +
                      std::to_string(size) + " bytes, the manifest records " +
                      std::to_string(f.bytes) +
                      (size < f.bytes ? " (the file is truncated)"
                                      : " (the file is corrupted)") +
                      fix);
    std::string digest = toHex(sha256OfFile(path));
    if (digest != f.sha256)
      throw Error(MTRT_STATUS_DATA_LOSS,
                  "checkpoint file '" + path + "': found SHA-256 " + digest +
                      ", the manifest records " + f.sha256 +
                      " (the file is corrupted)" + fix);
  }
}

//===----------------------------------------------------------------------===//
// Loading
//===----------------------------------------------------------------------===//

namespace {

/// The checkpoint's files, opened once each and checked against the
/// manifest's shards.
class ShardReader {
public:
  explicit ShardReader(const CheckpointManifest &m) : manifest_(m) {}

  /// The data of `shard` of tensor `name`: F32, of the slice's size.
  const float *data(const std::string &name, const CheckpointShard &shard,
                    std::vector<float> &buffer) {
    auto it = open_.find(shard.file);
    if (it == open_.end())
      it = open_
               .emplace(shard.file, SafetensorsFile::open(
                                        join(manifest_.directory, shard.file)))
               .first;
    const SafetensorsFile &file = it->second;
    const SafetensorsTensor &t = file.tensor(name);
    if (t.dtype != SafetensorsDType::F32 ||
        t.numElements != static_cast<uint64_t>(shard.slice.numElements()))
      throw Error(MTRT_STATUS_DATA_LOSS,
                  "checkpoint file '" + file.name() + "': tensor \"" + name +
                      "\" is " + safetensorsDTypeName(t.dtype) + " of " +
                      std::to_string(t.numElements) +
                      " elements, the manifest's slice " + shard.slice.str() +
                      " needs F32 of " +
                      std::to_string(shard.slice.numElements()));
    buffer.resize(t.numElements);
    file.convert(t, buffer.data());
    return buffer.data();
  }

private:
  const CheckpointManifest &manifest_;
  std::map<std::string, SafetensorsFile> open_;
};

std::string shapeText(const std::vector<int64_t> &shape) {
  return shapeString(shape);
}

} // namespace

void loadCheckpointTensors(const CheckpointManifest &manifest,
                           std::vector<CheckpointTensor> &targets,
                           bool verifyEveryFile) {
  const std::string where = "--load: checkpoint '" + manifest.directory + "'";
  // Names and global shapes first, all of them, before anything is read.
  std::set<std::string> wanted;
  std::vector<std::string> needed;
  for (const CheckpointTensor &t : targets) {
    wanted.insert(t.name);
    auto it = manifest.tensors.find(t.name);
    if (it == manifest.tensors.end())
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  where + " has no tensor \"" + t.name +
                      "\"; it was saved from another model (bundle '" +
                      manifest.state.bundleName + "', model '" +
                      manifest.state.modelName + "')");
    const CheckpointTensorEntry &e = it->second;
    bool same = e.globalShape == t.globalShape;
    if (!same && t.vocabularyRows && e.globalShape.size() == t.globalShape.size()) {
      same = e.globalShape[0] >= manifest.state.vocabSize;
      for (size_t d = 1; d < t.globalShape.size(); ++d)
        same &= e.globalShape[d] == t.globalShape[d];
    }
    if (!same)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  where + ": tensor \"" + t.name + "\" is " +
                      shapeText(e.globalShape) + " there and " +
                      shapeText(t.globalShape) +
                      " in this bundle; it was saved from another model");
    for (const CheckpointShard &s : e.shards)
      if (slicesOverlap(s.slice, t.slice) &&
          std::find(needed.begin(), needed.end(), s.file) == needed.end())
        needed.push_back(s.file);
  }
  for (const auto &entry : manifest.tensors)
    if (!wanted.count(entry.first))
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  where + " holds the tensor \"" + entry.first +
                      "\", which this bundle does not have; it was saved "
                      "from another model (bundle '" +
                      manifest.state.bundleName + "')");
  verifyCheckpointFiles(manifest, verifyEveryFile ? nullptr : &needed);

  ShardReader reader(manifest);
  std::vector<float> buffer;
  for (CheckpointTensor &t : targets) {
    const CheckpointTensorEntry &e = manifest.tensors.at(t.name);
    int64_t copied = 0;
    for (const CheckpointShard &s : e.shards) {
      if (!slicesOverlap(s.slice, t.slice))
        continue;
      const float *source = reader.data(t.name, s, buffer);
      copied += copySliceOverlap(s.slice, source, t.slice, t.data);
    }
    int64_t expected = elementsWithin(t.slice, e.globalShape);
    if (copied != expected)
      throw Error(MTRT_STATUS_DATA_LOSS,
                  where + ": tensor \"" + t.name + "\": its shards gave " +
                      std::to_string(copied) + " of the " +
                      std::to_string(expected) + " elements of " +
                      t.slice.str());
  }
}

std::vector<float> readWholeTensor(const CheckpointManifest &manifest,
                                   const std::string &name) {
  auto it = manifest.tensors.find(name);
  if (it == manifest.tensors.end())
    throw Error(MTRT_STATUS_NOT_FOUND, "checkpoint '" + manifest.directory +
                                           "' has no tensor \"" + name + "\"");
  const CheckpointTensorEntry &e = it->second;
  TensorSlice whole = wholeTensor(e.globalShape);
  std::vector<float> values(static_cast<size_t>(whole.numElements()));
  std::vector<std::string> files;
  for (const CheckpointShard &s : e.shards)
    files.push_back(s.file);
  verifyCheckpointFiles(manifest, &files);
  ShardReader reader(manifest);
  std::vector<float> buffer;
  for (const CheckpointShard &s : e.shards)
    copySliceOverlap(s.slice, reader.data(name, s, buffer), whole,
                     values.data());
  return values;
}

} // namespace mtrt::train
