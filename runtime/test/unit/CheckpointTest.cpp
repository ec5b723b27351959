// Tests of sharded checkpoints: saving over ranks, finding the newest,
// loading into another cut, and refusing damaged or tampered checkpoints.
#include "train/Checkpoint.h"

#include "SafetensorsTestUtil.h"
#include "comm/RunRanks.h"
#include "core/Sha256.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace mtrt;
using namespace mtrt::train;
using mtrt::test::TempDir;

namespace {

namespace fs = std::filesystem;

CheckpointState stateAt(int64_t iteration) {
  CheckpointState s;
  s.iteration = iteration;
  s.consumedSamples = iteration * 8;
  s.seed = 1234;
  s.microStep = static_cast<uint64_t>(iteration);
  s.optimizerStep = iteration;
  s.optimizer = {{"name", "adamw"}, {"lr", 1e-3}};
  s.lossScale = {{"kind", "none"}, {"scale", 1.0}};
  s.dataPath = "corpus.txt";
  s.split = "969,30,1";
  s.globalBatchSize = 8;
  s.microBatchesPerIteration = 1;
  s.bundleName = "test.mtb";
  s.modelName = "test";
  s.vocabSize = 4;
  s.paddedVocabSize = 4;
  return s;
}

/// A [4, 6] table (vocabulary rows) whose values are 100 * row + column,
/// and a [3] vector 0.5, 1.5, 2.5.
struct Model {
  std::vector<float> table, vector;
  Model() {
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 6; ++c)
        table.push_back(static_cast<float>(100 * r + c));
    vector = {0.5f, 1.5f, 2.5f};
  }
  std::vector<CheckpointTensor> whole() {
    CheckpointTensor t{"model/table", {4, 6}, wholeTensor({4, 6}),
                       table.data(), true, true};
    CheckpointTensor v{"model/vector", {3}, wholeTensor({3}), vector.data(),
                       true, false};
    return {t, v};
  }
};

std::string readText(const std::string &path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

/// Rewrites a manifest through `edit`, with a correct manifest_sha256.
void editManifest(const std::string &dir,
                  const std::function<void(nlohmann::json &)> &edit) {
  std::string path = dir + "/checkpoint.json";
  nlohmann::json j = nlohmann::json::parse(readText(path));
  j.erase("manifest_sha256");
  edit(j);
  std::string text = j.dump();
  j["manifest_sha256"] = toHex(sha256(text.data(), text.size()));
  std::ofstream(path) << j.dump(1);
}

TEST(CheckpointTest, SavesFindsAndLoadsIntoAnotherCut) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  Model model;
  std::string saved = saveCheckpoint(dir.path(), stateAt(50), model.whole(),
                                     nullptr);
  EXPECT_EQ(saved, dir.file("iter_0000050"));
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{
                               "iter_0000050",
                               "latest_checkpointed_iteration.txt"}));
  EXPECT_EQ(readText(dir.file("latest_checkpointed_iteration.txt")), "50");
  std::vector<std::string> notes;
  EXPECT_EQ(findLatestCheckpoint(dir.path(), notes), saved);
  EXPECT_TRUE(notes.empty());

  CheckpointManifest m = readCheckpointManifest(saved);
  EXPECT_EQ(m.state.iteration, 50);
  EXPECT_EQ(m.state.consumedSamples, 400);
  ASSERT_EQ(m.files.size(), 1u);
  EXPECT_EQ(m.files[0].name, "mp_rank_00_000.safetensors");
  verifyCheckpointFiles(m);

  // Loaded as two row halves of a table padded to 6 rows: the padding rows
  // keep their values.
  std::vector<float> top(18, -1), bottom(18, -1), vector(3, -1);
  std::vector<CheckpointTensor> targets = {
      {"model/table", {6, 6}, TensorSlice{{0, 0}, {3, 6}, std::nullopt},
       top.data(), true, true},
      {"model/table", {6, 6}, TensorSlice{{3, 0}, {3, 6}, std::nullopt},
       bottom.data(), true, true},
      {"model/vector", {3}, wholeTensor({3}), vector.data(), true, false}};
  loadCheckpointTensors(m, targets, true);
  EXPECT_EQ(std::vector<float>(top.begin(), top.end()),
            std::vector<float>(model.table.begin(), model.table.begin() + 18));
  EXPECT_EQ(std::vector<float>(bottom.begin(), bottom.begin() + 6),
            std::vector<float>(model.table.begin() + 18, model.table.end()));
  EXPECT_EQ(std::vector<float>(bottom.begin() + 6, bottom.end()),
            std::vector<float>(12, -1));
  EXPECT_EQ(vector, model.vector);
  EXPECT_EQ(readWholeTensor(m, "model/vector"), model.vector);
}

TEST(CheckpointTest, RanksSaveTheirShardsAndReplicasNothing) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  Model model;
  // Grid [2, 2]: the tensor ranks hold column halves of the table; the
  // second data-parallel row of ranks holds replicas that do not save.
  comm::InProcessWorld world(4);
  std::vector<std::exception_ptr> errors =
      comm::runRanks(world, [&](comm::Communicator &c) {
        int64_t dp = c.rank() / 2, tp = c.rank() % 2;
        std::vector<float> half;
        for (int r = 0; r < 4; ++r)
          for (int col = 0; col < 3; ++col)
            half.push_back(model.table[static_cast<size_t>(r * 6 + tp * 3 + col)]);
        std::vector<float> vector = model.vector;
        std::vector<CheckpointTensor> tensors = {
            {"model/table", {4, 6}, TensorSlice{{0, 3 * tp}, {4, 3}, std::nullopt},
             half.data(), dp == 0, true},
            {"model/vector", {3}, wholeTensor({3}), vector.data(),
             dp == 0 && tp == 0, false}};
        CheckpointState state = stateAt(2);
        state.grid = {2, 2};
        state.tensorModelParallelSize = state.dataParallelSize = 2;
        saveCheckpoint(dir.path(), state, tensors, &c);
      });
  for (const std::exception_ptr &e : errors)
    ASSERT_FALSE(e) << world.abortReason();
  CheckpointManifest m = readCheckpointManifest(dir.file("iter_0000002"));
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.files[0].name, "mp_rank_00_000.safetensors");
  EXPECT_EQ(m.files[1].name, "mp_rank_01_000.safetensors");
  EXPECT_EQ(m.files[1].coordinates, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(m.tensors.at("model/table").shards.size(), 2u);
  EXPECT_EQ(readWholeTensor(m, "model/table"), model.table);
}

TEST(CheckpointTest, NeverOverwritesAndReplacesAnInterruptedSave) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  Model model;
  saveCheckpoint(dir.path(), stateAt(5), model.whole(), nullptr);
  std::string before = readText(dir.file("iter_0000005/checkpoint.json"));
  EXPECT_MTRT_ERROR(
      saveCheckpoint(dir.path(), stateAt(5), model.whole(), nullptr),
      MTRT_STATUS_ALREADY_EXISTS,
      "saving checkpoint '" + dir.file("iter_0000005") +
          "': the directory already exists, and an existing checkpoint is "
          "never overwritten; move or remove it, or pass another --save "
          "directory");
  EXPECT_EQ(readText(dir.file("iter_0000005/checkpoint.json")), before);

  // What a killed save leaves: a .partial directory, never loaded, replaced
  // by the next save of that iteration.
  fs::create_directory(dir.file("iter_0000006.partial"));
  std::ofstream(dir.file("iter_0000006.partial/mp_rank_00_000.safetensors"))
      << "half";
  std::vector<std::string> notes;
  EXPECT_EQ(findLatestCheckpoint(dir.path(), notes), dir.file("iter_0000005"));
  saveCheckpoint(dir.path(), stateAt(6), model.whole(), nullptr);
  EXPECT_EQ(dir.entries(),
            (std::vector<std::string>{"iter_0000005", "iter_0000006",
                                      "latest_checkpointed_iteration.txt"}));
  verifyCheckpointFiles(readCheckpointManifest(dir.file("iter_0000006")));
}

TEST(CheckpointTest, FindsTheNewestCompleteCheckpoint) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::vector<std::string> notes;
  EXPECT_EQ(findLatestCheckpoint(dir.file("missing"), notes), std::nullopt);
  EXPECT_EQ(findLatestCheckpoint(dir.path(), notes), std::nullopt);
  Model model;
  saveCheckpoint(dir.path(), stateAt(2), model.whole(), nullptr);
  saveCheckpoint(dir.path(), stateAt(4), model.whole(), nullptr);
  // A save that died after renaming its directory, before the latest file.
  std::ofstream(dir.file("latest_checkpointed_iteration.txt")) << "2";
  EXPECT_EQ(findLatestCheckpoint(dir.path(), notes), dir.file("iter_0000004"));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0], "note: '" + dir.file("latest_checkpointed_iteration.txt") +
                          "' names iteration 2, but iter_0000004 is complete "
                          "(a save was interrupted before it updated the "
                          "latest file); loading iteration 4");
  std::ofstream(dir.file("latest_checkpointed_iteration.txt")) << "x7";
  EXPECT_MTRT_ERROR(findLatestCheckpoint(dir.path(), notes),
                    MTRT_STATUS_DATA_LOSS,
                    "--load: '" +
                        dir.file("latest_checkpointed_iteration.txt") +
                        "' holds \"x7\", expected an iteration number (the "
                        "file is corrupted); write the iteration to load "
                        "into it");
  std::ofstream(dir.file("latest_checkpointed_iteration.txt")) << "9";
  EXPECT_MTRT_ERROR(findLatestCheckpoint(dir.path(), notes),
                    MTRT_STATUS_DATA_LOSS,
                    "--load: '" +
                        dir.file("latest_checkpointed_iteration.txt") +
                        "' names iteration 9 but '" + dir.file("iter_0000009") +
                        "' does not exist; restore it or correct the file");
}

class CheckpointDamageTest : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    path_ = saveCheckpoint(dir_.path(), stateAt(3), model_.whole(), nullptr);
  }
  std::string manifestError() {
    std::optional<Error> e =
        test::errorOf([&] { readCheckpointManifest(path_); });
    return e ? e->what() : "no error";
  }
  TempDir dir_;
  Model model_;
  std::string path_;
};

TEST_F(CheckpointDamageTest, TruncatedOrCorruptedShardsAreNamed) {
  std::string shard = path_ + "/mp_rank_00_000.safetensors";
  CheckpointManifest m = readCheckpointManifest(path_);
  std::string fix = "; restore the file, or move '" + path_ +
                    "' away to load the checkpoint before it";
  uint64_t size = fs::file_size(shard);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 3));
    f.put('\x7f');
  }
  std::optional<Error> e = test::errorOf([&] { verifyCheckpointFiles(m); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), MTRT_STATUS_DATA_LOSS);
  EXPECT_NE(std::string(e->what()).find("checkpoint file '" + shard +
                                        "': found SHA-256 "),
            std::string::npos)
      << e->what();
  fs::resize_file(shard, size - 1);
  EXPECT_MTRT_ERROR(verifyCheckpointFiles(m), MTRT_STATUS_DATA_LOSS,
                    "checkpoint file '" + shard + "': found " +
                        std::to_string(size - 1) +
                        " bytes, the manifest records " +
                        std::to_string(size) + " (the file is truncated)" +
                        fix);
  fs::remove(shard);
  e = test::errorOf([&] { verifyCheckpointFiles(m); });
  ASSERT_TRUE(e);
  EXPECT_NE(std::string(e->what()).find("checkpoint file '" + shard + "': "),
            std::string::npos);
}

TEST_F(CheckpointDamageTest, TamperedManifestsAreRefused) {
  std::string file = path_ + "/checkpoint.json";
  std::string prefix = "checkpoint manifest '" + file + "': ";
  std::string suffix = " (the manifest is corrupted or of another format)";
  {
    std::string text = readText(file);
    // The manifest says iteration 3; make it 4 without fixing the hash.
    text[text.find("\"iteration\": 3") + 13] = '4';
    std::ofstream(file) << text;
    std::string message = manifestError();
    std::string start = prefix + "manifest_sha256: found the contents' "
                                 "SHA-256 ";
    EXPECT_EQ(message.substr(0, start.size()), start) << message;
    EXPECT_NE(message.find(", expected the recorded "), std::string::npos);
  }
  auto table = [](nlohmann::json &j) -> nlohmann::json & {
    return j["tensors"]["model/table"]["shards"][0];
  };
  editManifest(path_, [&](nlohmann::json &j) { table(j)["shape"] = {4, 5}; });
  EXPECT_EQ(manifestError(),
            prefix + "tensors[\"model/table\"].shards: found 20 elements, "
                     "expected 24, the global shape's (every element in "
                     "exactly one shard)" + suffix);
  editManifest(path_, [&](nlohmann::json &j) {
    table(j)["shape"] = {4, 6};
    nlohmann::json copy = table(j);
    j["tensors"]["model/table"]["shards"].push_back(copy);
  });
  EXPECT_EQ(manifestError(),
            prefix + "tensors[\"model/table\"].shards[] in "
                     "mp_rank_00_000.safetensors: found offsets [0, 0] shape "
                     "[4, 6], which overlaps offsets [0, 0] shape [4, 6] in "
                     "mp_rank_00_000.safetensors, expected shards that do "
                     "not overlap" + suffix);
  editManifest(path_, [&](nlohmann::json &j) {
    j["tensors"]["model/table"]["shards"].erase(1);
    table(j)["offsets"] = {1, 0};
  });
  EXPECT_EQ(manifestError(),
            prefix + "tensors[\"model/table\"].shards[] in "
                     "mp_rank_00_000.safetensors: found dimension 0 [1, 1 + "
                     "4) is not inside [0, 4) of the global shape [4, 6], "
                     "expected a slice inside the tensor" + suffix);
  editManifest(path_, [&](nlohmann::json &j) {
    table(j)["offsets"] = {0, 0};
    table(j)["file"] = "../elsewhere.safetensors";
  });
  EXPECT_EQ(manifestError(),
            prefix + "tensors[\"model/table\"].shards[].file: found "
                     "\"../elsewhere.safetensors\", expected one of the files "
                     "listed in \"files\"" + suffix);
  editManifest(path_, [&](nlohmann::json &j) {
    table(j)["file"] = "mp_rank_00_000.safetensors";
    j["files"][0]["name"] = "../x";
  });
  EXPECT_EQ(manifestError(),
            prefix + "files[].name: found \"../x\", expected a file name "
                     "inside the iteration directory" + suffix);
}

TEST_F(CheckpointDamageTest, CheckpointsOfAnotherModelAreRefused) {
  CheckpointManifest m = readCheckpointManifest(path_);
  std::string where = "--load: checkpoint '" + path_ + "'";
  std::vector<float> buffer(64);
  std::vector<CheckpointTensor> missing = {
      {"model/table", {4, 6}, wholeTensor({4, 6}), buffer.data(), true, true},
      {"model/other", {3}, wholeTensor({3}), buffer.data(), true, false}};
  EXPECT_MTRT_ERROR(loadCheckpointTensors(m, missing, true),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    where + " has no tensor \"model/other\"; it was saved "
                            "from another model (bundle 'test.mtb', model "
                            "'test')");
  std::vector<CheckpointTensor> fewer = {
      {"model/table", {4, 6}, wholeTensor({4, 6}), buffer.data(), true, true}};
  EXPECT_MTRT_ERROR(loadCheckpointTensors(m, fewer, true),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    where + " holds the tensor \"model/vector\", which this "
                            "bundle does not have; it was saved from another "
                            "model (bundle 'test.mtb')");
  std::vector<CheckpointTensor> reshaped = {
      {"model/table", {4, 6}, wholeTensor({4, 6}), buffer.data(), true, true},
      {"model/vector", {4}, wholeTensor({4}), buffer.data(), true, false}};
  EXPECT_MTRT_ERROR(loadCheckpointTensors(m, reshaped, true),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    where + ": tensor \"model/vector\" is [3] there and [4] "
                            "in this bundle; it was saved from another model");
}

} // namespace
