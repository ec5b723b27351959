// Tests of Megatron-LM's GPTDataset sampling over indexed datasets: epochs,
// the document, sample and shuffle indices, splits and blends, checked
// against expectations computed here from the definitions (windows of
// seq_length + 1 tokens at a stride of seq_length through the documents in
// document-index order) and by hand.
#include "core/Error.h"
#include "data/BlendedGptDataset.h"
#include "data/IndexedDataset.h"
#include "data/IndexedGptDataset.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <unistd.h>

using namespace mtrt;
using namespace mtrt::data;
namespace fs = std::filesystem;

namespace {

class GptSamplingTest : public ::testing::Test {
protected:
  void SetUp() override {
    std::string pattern =
        (fs::temp_directory_path() / "mtrt-sampling-XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// Documents of the given lengths whose tokens say where they are:
  /// base + 100 * document + position.
  std::shared_ptr<const IndexedDataset>
  write(const std::string &name, const std::vector<int64_t> &lengths,
        int32_t base = 0) {
    std::string prefix = dir_ + "/" + name;
    IndexedDatasetWriter writer(prefix, TokenType::Int32);
    for (size_t d = 0; d < lengths.size(); ++d) {
      std::vector<int32_t> tokens(static_cast<size_t>(lengths[d]));
      for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = base + static_cast<int32_t>(100 * d + i);
      writer.addDocument(tokens);
    }
    writer.finish();
    return std::make_shared<const IndexedDataset>(prefix);
  }

  std::string dir_;
};

std::vector<int32_t> tokensOf(const IndexedGptDataset &data, int64_t sample,
                              int64_t seqLength) {
  std::vector<int32_t> tokens(static_cast<size_t>(seqLength + 1));
  data.readTokens(sample, tokens.data());
  return tokens;
}

/// The expectation from the definition: the documents concatenated in
/// document-index order, and sample j the window [j * S, j * S + S + 1).
void expectWindows(const IndexedGptDataset &data, const IndexedDataset &set,
                   int64_t seqLength) {
  std::vector<int32_t> stream;
  for (int64_t document : data.documentIndex()) {
    std::vector<int32_t> tokens(
        static_cast<size_t>(set.documentLength(document)));
    set.readDocument(document, 0, set.documentLength(document),
                     tokens.data());
    stream.insert(stream.end(), tokens.begin(), tokens.end());
  }
  for (int64_t i = 0; i < data.size(); ++i) {
    int64_t j = data.shuffleIndex()[i];
    std::vector<int32_t> window(stream.begin() + j * seqLength,
                                stream.begin() + j * seqLength + seqLength +
                                    1);
    ASSERT_EQ(tokensOf(data, i, seqLength), window) << "sample " << i;
  }
}

std::map<int64_t, int> counts(const std::vector<int64_t> &values) {
  std::map<int64_t, int> c;
  for (int64_t v : values)
    ++c[v];
  return c;
}

TEST_F(GptSamplingTest, BuildsEnoughEpochsAndCutsWindowsThroughDocuments) {
  auto set = write("three", {5, 3, 7, 0}); // 15 tokens, an empty document
  // 10 samples of 4 tokens need 41 tokens: 3 epochs (45), which give
  // (45 - 1) / 4 = 11 samples; the last epoch gives 11 - 7 = 4 >= 80% of
  // the 3 per epoch, so it is shuffled with the others.
  IndexedGptDataset data(set, 0, 4, 4, 10, 1234, 0, "three");
  EXPECT_EQ(data.epochs(), 3);
  EXPECT_EQ(data.samplesPerEpoch(), 3);
  EXPECT_FALSE(data.separateFinalEpoch());
  EXPECT_EQ(data.size(), 11);
  EXPECT_EQ(counts(data.documentIndex()),
            (std::map<int64_t, int>{{0, 3}, {1, 3}, {2, 3}, {3, 3}}));
  std::vector<int64_t> shuffle = data.shuffleIndex();
  std::sort(shuffle.begin(), shuffle.end());
  std::vector<int64_t> all(11);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(shuffle, all);
  expectWindows(data, *set, 4);
  // The sample index's first entry, and the last: 11 * 4 = 44 tokens in,
  // the last token (offset 6) of the last document with tokens.
  EXPECT_EQ(data.sampleIndex().front(), std::make_pair(int64_t(0), int64_t(0)));
  EXPECT_EQ(data.sampleIndex().size(), 12u);

  std::vector<int32_t> inputs(4), labels(4), tokens = tokensOf(data, 5, 4);
  data.read(5, inputs.data(), labels.data());
  EXPECT_EQ(inputs, std::vector<int32_t>(tokens.begin(), tokens.end() - 1));
  EXPECT_EQ(labels, std::vector<int32_t>(tokens.begin() + 1, tokens.end()));
  EXPECT_THROW(data.readTokens(11, tokens.data()), Error);
}

TEST_F(GptSamplingTest, ShufflesASmallFinalEpochOnItsOwn) {
  auto set = write("three", {5, 3, 7});
  // 8 samples: 3 epochs again, but the last gives only 8 - 7 = 1 sample,
  // fewer than int(0.8 * 3) = 2.
  IndexedGptDataset data(set, 0, 3, 4, 8, 99, 0, "three");
  EXPECT_EQ(data.epochs(), 3);
  ASSERT_TRUE(data.separateFinalEpoch());
  const std::vector<int64_t> &documents = data.documentIndex();
  EXPECT_EQ(counts({documents.begin(), documents.begin() + 6}),
            (std::map<int64_t, int>{{0, 2}, {1, 2}, {2, 2}}));
  EXPECT_EQ(counts({documents.begin() + 6, documents.end()}),
            (std::map<int64_t, int>{{0, 1}, {1, 1}, {2, 1}}));
  // Samples of the first two epochs ((30 - 1) / 4 = 7) come first.
  const std::vector<int64_t> &shuffle = data.shuffleIndex();
  ASSERT_EQ(shuffle.size(), 11u);
  for (size_t i = 0; i < shuffle.size(); ++i)
    EXPECT_EQ(shuffle[i] < 7, i < 7) << i;
  expectWindows(data, *set, 4);
}

TEST_F(GptSamplingTest, OrderDependsOnlyOnTheSeed) {
  std::vector<int64_t> lengths(50, 9);
  auto set = write("fifty", lengths);
  IndexedGptDataset a(set, 0, 50, 8, 100, 7, 0, "a");
  IndexedGptDataset b(set, 0, 50, 8, 100, 7, 0, "b");
  IndexedGptDataset c(set, 0, 50, 8, 100, 8, 0, "c");
  EXPECT_EQ(a.documentIndex(), b.documentIndex());
  EXPECT_EQ(a.shuffleIndex(), b.shuffleIndex());
  EXPECT_NE(a.documentIndex(), c.documentIndex());
  EXPECT_NE(a.shuffleIndex(), c.shuffleIndex());
  expectWindows(c, *set, 8);
}

TEST_F(GptSamplingTest, RefusesDocumentsTooShortForOneSample) {
  auto set = write("short", {2, 2});
  try {
    IndexedGptDataset data(set, 0, 2, 4, 1, 1, 0, "the training split");
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(
                  "the training split has 2 documents of 4 tokens; a sample "
                  "needs seq_length + 1 = 5"),
              std::string::npos)
        << e.what();
  }
}

/// By hand: with weights 0.3 and 0.7, sample i goes to the dataset that
/// lags w * max(i, 1) - count the most.
TEST(GptBlendingTest, BuildsMegatronsBlendingIndices) {
  std::vector<int64_t> dataset, sample;
  buildBlendingIndices({0.3, 0.7}, 10, dataset, sample);
  EXPECT_EQ(dataset, (std::vector<int64_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(sample, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6}));
  // Ties go to the first dataset.
  buildBlendingIndices({0.5, 0.5}, 4, dataset, sample);
  EXPECT_EQ(dataset, (std::vector<int64_t>{0, 1, 0, 1}));
  // Each dataset is built for its share plus 0.5%, rounded up.
  EXPECT_EQ(blendedDatasetSamples(0.25, 1000), 252); // ceil(250 * 1.005)
  EXPECT_EQ(blendedDatasetSamples(0.75, 1000), 754); // ceil(750 * 1.005)
}

TEST(GptBlendingTest, ParsesDataPathLikeMegatron) {
  std::vector<BlendEntry> blend = parseDataBlend({"0.3", "a", "0.7", "b"});
  ASSERT_EQ(blend.size(), 2u);
  EXPECT_EQ(blend[0].weight, 0.3);
  EXPECT_EQ(blend[1].prefix, "b");
  EXPECT_EQ(parseDataBlend({"only"})[0].prefix, "only");
  EXPECT_THROW(parseDataBlend({"a", "b"}), Error);
  EXPECT_THROW(parseDataBlend({"0.3", "a", "0.7"}), Error);
  EXPECT_THROW(parseDataBlend({"-1", "a", "2", "b"}), Error);
  EXPECT_THROW(parseDataBlend({}), Error);
}

TEST_F(GptSamplingTest, SplitsByDocumentsAndBlendsByWeight) {
  std::vector<int64_t> lengths(10, 12);
  write("a", lengths, 0);
  write("b", lengths, 100000);
  // 8,1,1 of 10 documents: training reads documents 0-7 only.
  auto parts = buildGptDatasets({{1.0, dir_ + "/a"}}, "8,1,1", 6,
                                {40, 4, 0}, 5);
  ASSERT_TRUE(parts[0] && parts[1]);
  EXPECT_FALSE(parts[2]) << "no test samples were asked for";
  std::vector<int32_t> inputs(6), labels(6);
  for (int64_t i = 0; i < 40; ++i) {
    parts[0]->read(i, inputs.data(), labels.data());
    for (int32_t t : labels)
      EXPECT_LT(t / 100, 8) << "sample " << i;
  }
  for (int64_t i = 0; i < 4; ++i) {
    parts[1]->read(i, inputs.data(), labels.data());
    for (int32_t t : labels)
      EXPECT_EQ(t / 100, 8) << "validation sample " << i;
  }

  // A blend of 0.25 a and 0.75 b: every sample from one dataset, in the
  // proportions of the weights.
  auto blended = buildGptDatasets({{1.0, dir_ + "/a"}, {3.0, dir_ + "/b"}},
                                  "1,0,0", 6, {100, 0, 0}, 5);
  auto *blend = dynamic_cast<BlendedGptDataset *>(blended[0].get());
  ASSERT_TRUE(blend);
  int fromB = 0;
  for (int64_t i = 0; i < 100; ++i) {
    blended[0]->read(i, inputs.data(), labels.data());
    bool b = inputs[0] >= 100000;
    for (int32_t t : labels)
      EXPECT_EQ(t >= 100000, b) << "sample " << i << " mixes datasets";
    EXPECT_EQ(blend->datasetIndex()[i], b ? 1 : 0);
    fromB += b;
  }
  EXPECT_NEAR(fromB, 75, 1);
  EXPECT_THROW(blended[0]->read(100, inputs.data(), labels.data()), Error);
}

} // namespace
