// Sharded training checkpoints: a directory per iteration of per-rank
// safetensors shards and a manifest (docs/Checkpoints.md), saved atomically
// and loaded into any layout.
#ifndef MTRT_SRC_TRAIN_CHECKPOINT_H
#define MTRT_SRC_TRAIN_CHECKPOINT_H

#include "core/TensorSlice.h"
#include "host/HostTensor.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mtrt {
class Bundle;
} // namespace mtrt

namespace mtrt::comm {
class Communicator;
} // namespace mtrt::comm

namespace mtrt::host {
class ParameterStore;
} // namespace mtrt::host

namespace mtrt::train {

/// The file of a --save directory that names its newest checkpoint, as in
/// Megatron-LM: the iteration in decimal.
inline constexpr const char kLatestCheckpointFile[] =
    "latest_checkpointed_iteration.txt";
/// The manifest in each iteration directory.
inline constexpr const char kCheckpointManifestFile[] = "checkpoint.json";
/// The test-only variable that kills the saving process (SIGKILL) once the
/// save has written that many bytes (tools/crash tests, docs/Checkpoints.md).
inline constexpr const char kCrashAfterBytesVariable[] =
    "MTRT_CHECKPOINT_CRASH_AFTER_BYTES";

/// "iter_0000050", Megatron-LM's directory name for iteration 50.
std::string iterationDirectoryName(int64_t iteration);

/// A rank's piece of one checkpoint tensor ("model/<parameter>",
/// "optimizer/exp_avg/<parameter>", "optimizer/exp_avg_sq/<parameter>"),
/// in the global index space of the tensor.
struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> globalShape;
  TensorSlice slice;
  /// slice.numElements() floats: read when saving, written when loading.
  float *data = nullptr;
  /// Whether this rank writes it; replicas of a piece that another rank
  /// writes do not.
  bool save = true;
  /// Dimension 0 counts vocabulary entries padded past vocab_size: a
  /// checkpoint of another padding loads its rows that exist in both.
  bool vocabularyRows = false;
};

/// Everything a checkpoint records besides its tensors.
struct CheckpointState {
  int64_t iteration = 0;
  int64_t consumedSamples = 0;
  uint64_t seed = 0;
  /// The counter-based generator's position: the number of train_step
  /// micro-batches run (dropout keys on it).
  uint64_t microStep = 0;
  int64_t optimizerStep = 0;
  /// {"name": "adamw", "lr": ..., ...}: what a resumed run must match.
  nlohmann::json optimizer;
  /// {"kind": "none", "scale": 1.0}: the loss scaler's state.
  nlohmann::json lossScale;
  std::string dataPath, split;
  int64_t globalBatchSize = 0;
  int64_t microBatchesPerIteration = 0;

  int64_t tensorModelParallelSize = 1;
  int64_t pipelineModelParallelSize = 1;
  int64_t dataParallelSize = 1;
  bool distributedOptimizer = false;
  /// The bundle's grid ([dp, tp]); empty for one rank.
  std::vector<int64_t> grid;

  std::string bundleName, bundleSha256, modelName;
  int64_t vocabSize = 0, paddedVocabSize = 0;
  /// The attention's heads and key/value groups, which order GPT-2's fused
  /// c_attn columns (export-hf restores Hugging Face's order with them); 0
  /// in manifests written before they were recorded.
  int64_t numAttentionHeads = 0, numQueryGroups = 0;
  /// transformers' config.json of the model (train/HuggingFaceConfig.h),
  /// which export-hf writes; null in manifests written before it was
  /// recorded, or when no transformers class describes the model, and then
  /// huggingFaceConfigProblem says why.
  nlohmann::json huggingFaceConfig;
  std::string huggingFaceConfigProblem;
};

/// Records in `state` which bundle and model it belongs to: the bundle's
/// name and SHA-256, the model's name, vocabulary (and padded size) and
/// attention heads and key/value groups, and transformers' config.json.
void recordBundle(CheckpointState &state, const Bundle &bundle);

/// One file of a checkpoint and what the manifest records of it.
struct CheckpointFile {
  std::string name;
  int64_t rank = 0;
  std::vector<int64_t> coordinates;
  uint64_t bytes = 0;
  std::string sha256;
};

struct CheckpointShard {
  std::string file;
  TensorSlice slice;
};

struct CheckpointTensorEntry {
  std::vector<int64_t> globalShape;
  bool vocabularyRows = false;
  std::vector<CheckpointShard> shards;
};

/// A checkpoint's manifest, read and checked.
struct CheckpointManifest {
  /// The iteration directory.
  std::string directory;
  CheckpointState state;
  std::vector<CheckpointFile> files;
  std::map<std::string, CheckpointTensorEntry> tensors;
};

struct OptimizerConfig;

class DataParallelBuffer;
class DistributedOptimizer;

/// The tensors of a rank's checkpoint over `store` (f32): each parameter's
/// value and AdamW moments ("model/", "optimizer/exp_avg/",
/// "optimizer/exp_avg_sq/" + its name), in the global index space, saved
/// only by one replica of each piece when `severalRanks` (and only by the
/// pipeline rank that holds it). With `distributed` (and its `buffer`), the
/// moments are the distributed optimizer's range, as flat pieces. Shared by
/// megatron-train and the C API's sessions. Throws UNIMPLEMENTED for an f64
/// store.
std::vector<CheckpointTensor>
storeCheckpointTensors(host::ParameterStore &store, bool severalRanks,
                       DistributedOptimizer *distributed = nullptr,
                       DataParallelBuffer *buffer = nullptr);
/// The manifest's "optimizer" object: AdamW's and the schedule's
/// hyper-parameters under megatron-train's names.
nlohmann::json optimizerState(const OptimizerConfig &config);
/// "" when `saved` and `current` (optimizerState objects) agree, else each
/// difference with the megatron-train flag that sets it.
std::string optimizerDifferences(const nlohmann::json &saved,
                                 const nlohmann::json &current);

/// Whether a checkpoint starts a run rather than continuing one: an import
/// (megatron-checkpoint import-hf) is of iteration 0 and records no optimizer
/// hyper-parameters; with no data order, dropout stream or schedule to
/// continue, any seed and hyper-parameters may load it.
bool startsRun(const CheckpointState &state);

/// Saves `tensors` and `state` as `saveDir`/iter_NNNNNNN, collectively over
/// `world` (nullptr: one rank), whose rank 0 leads: it creates
/// iter_NNNNNNN.partial (removing one left by an interrupted save), every
/// rank writes its shard there (temporary name, fsync, rename), rank 0
/// writes the manifest from the shards' headers, renames the directory to
/// iter_NNNNNNN, fsyncs `saveDir` and then replaces
/// latest_checkpointed_iteration.txt the same way. An existing
/// iter_NNNNNNN is never touched: the save fails (ALREADY_EXISTS) naming
/// it. Returns the iteration directory. Throws Error naming the file and
/// the step that failed.
std::string saveCheckpoint(const std::string &saveDir,
                           const CheckpointState &state,
                           const std::vector<CheckpointTensor> &tensors,
                           comm::Communicator *world);

/// What --load DIR loads: the iteration directory of the newest complete
/// checkpoint, or nullopt when DIR holds none (missing, or without a latest
/// file and iteration directories). latest_checkpointed_iteration.txt names
/// it, unless a newer iter_NNNNNNN exists (a save interrupted after its
/// directory was complete, before the latest file was replaced): that one
/// is taken and a line in `notes` says so. Throws Error (DATA_LOSS) for a
/// latest file that is not an iteration number or names a missing
/// directory.
std::optional<std::string> findLatestCheckpoint(const std::string &dir,
                                                std::vector<std::string> &notes);

/// Reads and checks iterationDir/checkpoint.json: its own SHA-256, its
/// schema, and that every tensor's shards lie in it, name listed files and
/// tile it exactly. Throws Error (NOT_FOUND, DATA_LOSS) naming the file.
CheckpointManifest readCheckpointManifest(const std::string &iterationDir);

/// Checks each listed file's size and SHA-256 against the manifest
/// (`only`: just those files). Throws Error (DATA_LOSS, NOT_FOUND) naming
/// the file, what was found and what the manifest records.
void verifyCheckpointFiles(const CheckpointManifest &manifest,
                           const std::vector<std::string> *only = nullptr);

/// Fills every target from the checkpoint, whatever layout either has: the
/// checkpoint must hold each target's tensor, with the same global shape
/// (vocabulary tables may differ in padded rows), and no tensor that no
/// target asks for. The files read are verified first, and all of them
/// when `verifyEveryFile`. Elements of a target that the checkpoint does
/// not have (padding rows it lacks) keep their values. Throws Error naming
/// the checkpoint, the tensor and the fix; targets may be partly written
/// then.
void loadCheckpointTensors(const CheckpointManifest &manifest,
                           std::vector<CheckpointTensor> &targets,
                           bool verifyEveryFile);

/// The whole tensor `name` of the checkpoint (shards assembled), e.g. for
/// an export. Verifies the files it reads.
std::vector<float> readWholeTensor(const CheckpointManifest &manifest,
                                   const std::string &name);

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_CHECKPOINT_H
