// Tests of the .bin/.idx reader and writer: Megatron-LM's own files, round
// trips, and damaged files rejected with the file and field named.
#include "core/Error.h"
#include "data/IndexedDataset.h"

#include "gtest/gtest.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>

using namespace mtrt;
using namespace mtrt::data;
namespace fs = std::filesystem;

namespace {

const std::string kMegatronDir =
    std::string(MTRT_TEST_DATA_DIR) + "/megatron-indexed";

/// A fresh directory under the test temporary directory, removed after.
class TempDir {
public:
  TempDir() {
    std::string pattern =
        (fs::temp_directory_path() / "mtrt-indexed-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string &name) const {
    return (fs::path(path_) / name).string();
  }

private:
  std::string path_;
};

std::string readBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeBytes(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// What Megatron-LM's IndexedDataset returned for its own files
/// (expected.json, written beside them by its reader).
TEST(IndexedDatasetTest, ReadsMegatronFilesAsItsReaderDoes) {
  std::ifstream in(kMegatronDir + "/expected.json");
  ASSERT_TRUE(in) << kMegatronDir;
  nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_EQ(expected.size(), 2u);
  for (const nlohmann::json &entry : expected) {
    SCOPED_TRACE(entry["prefix"].get<std::string>());
    IndexedDataset dataset(kMegatronDir + "/" +
                           entry["prefix"].get<std::string>());
    EXPECT_EQ(tokenTypeName(dataset.tokenType()),
              entry["dtype"].get<std::string>());
    ASSERT_EQ(dataset.sequenceCount(), entry["num_sequences"].get<int64_t>());
    EXPECT_EQ(dataset.documentIndices(),
              entry["document_indices"].get<std::vector<int64_t>>());
    for (int64_t s = 0; s < dataset.sequenceCount(); ++s) {
      EXPECT_EQ(dataset.sequenceLength(s),
                entry["sequence_lengths"][s].get<int64_t>());
      EXPECT_EQ(dataset.sequence(s),
                entry["sequences"][s].get<std::vector<int32_t>>());
    }
  }
}

/// The writer reproduces Megatron-LM's files byte for byte from the same
/// documents: the GPT-2 file's second document has two sequences.
TEST(IndexedDatasetTest, WritesMegatronFilesByteForByte) {
  TempDir dir;
  struct Case {
    const char *prefix;
    TokenType type;
    std::vector<std::vector<int32_t>> documents;
    std::vector<std::vector<int64_t>> lengths;
  };
  std::vector<Case> cases = {
      {"shared_gpt2_uint16",
       TokenType::UInt16,
       {{15496, 995, 50256}, {464, 2068, 7586, 21831, 18045, 625, 50256},
        {40, 716, 13, 50256}},
       {{}, {3, 4}, {}}},
      {"shared_vocab128k_int32",
       TokenType::Int32,
       {{100000, 5, 127999}, {70000, 70001}},
       {{}, {}}},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.prefix);
    std::string prefix = dir.file(c.prefix);
    IndexedDatasetWriter writer(prefix, c.type);
    for (size_t d = 0; d < c.documents.size(); ++d)
      writer.addDocument(c.documents[d], c.lengths[d]);
    EXPECT_FALSE(fs::exists(prefix + ".idx")) << "renamed before finish()";
    writer.finish();
    for (const char *suffix : {".bin", ".idx"})
      EXPECT_EQ(readBytes(prefix + suffix),
                readBytes(kMegatronDir + "/" + c.prefix + suffix))
          << suffix;
  }
}

TEST(IndexedDatasetTest, ChoosesTheTypeByVocabularySize) {
  EXPECT_EQ(tokenTypeForVocabulary(256), TokenType::UInt16);
  EXPECT_EQ(tokenTypeForVocabulary(50257), TokenType::UInt16);
  EXPECT_EQ(tokenTypeForVocabulary(65499), TokenType::UInt16);
  EXPECT_EQ(tokenTypeForVocabulary(65500), TokenType::Int32);
  EXPECT_EQ(tokenTypeForVocabulary(128256), TokenType::Int32);
}

TEST(IndexedDatasetTest, RoundTripsDocumentsAndReadsAcrossSequences) {
  TempDir dir;
  std::string prefix = dir.file("round");
  {
    IndexedDatasetWriter writer(prefix, TokenType::UInt16);
    writer.addDocument({1, 2, 3, 4, 5}, {2, 0, 3});
    writer.addDocument({});
    writer.addDocument({65535, 0});
    EXPECT_EQ(writer.documentCount(), 3);
    EXPECT_EQ(writer.tokenCount(), 7);
    writer.finish();
  }
  IndexedDataset dataset(prefix);
  EXPECT_EQ(dataset.documentCount(), 3);
  // The empty document has no sequence, as in Megatron-LM's builder.
  EXPECT_EQ(dataset.sequenceCount(), 4);
  EXPECT_EQ(dataset.documentIndices(), (std::vector<int64_t>{0, 3, 3, 4}));
  EXPECT_EQ(dataset.documentLength(0), 5);
  EXPECT_EQ(dataset.documentLength(1), 0);
  std::vector<int32_t> tokens(4);
  dataset.readDocument(0, 1, 4, tokens.data());
  EXPECT_EQ(tokens, (std::vector<int32_t>{2, 3, 4, 5}));
  EXPECT_EQ(dataset.sequence(3), (std::vector<int32_t>{65535, 0}));
  EXPECT_THROW(dataset.readDocument(0, 3, 3, tokens.data()), Error);
  EXPECT_THROW(dataset.sequence(4), Error);
}

TEST(IndexedDatasetTest, RefusesTokensOutsideTheType) {
  TempDir dir;
  IndexedDatasetWriter writer(dir.file("small"), TokenType::UInt16);
  try {
    writer.addDocument({1, 65536});
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("token id 65536 does not fit the "
                                         "uint16 tokens"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(writer.addDocument({1, 2}, {1}), Error);
}

TEST(IndexedDatasetTest, AbandonedWriterLeavesNoFiles) {
  TempDir dir;
  std::string prefix = dir.file("abandoned");
  {
    IndexedDatasetWriter writer(prefix, TokenType::Int32);
    writer.addDocument({1, 2, 3});
  }
  EXPECT_FALSE(fs::exists(prefix + ".bin.tmp"));
  EXPECT_FALSE(fs::exists(prefix + ".bin"));
}

/// Damages a copy of Megatron-LM's GPT-2 file and expects `message`.
void expectRejected(const std::string &idx, const std::string &bin,
                    const std::string &message) {
  TempDir dir;
  std::string prefix = dir.file("damaged");
  writeBytes(prefix + ".idx", idx);
  writeBytes(prefix + ".bin", bin);
  try {
    IndexedDataset dataset(prefix);
    FAIL() << "accepted; expected: " << message;
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos)
        << e.what();
  }
}

TEST(IndexedDatasetTest, RejectsDamagedFiles) {
  std::string idx = readBytes(kMegatronDir + "/shared_gpt2_uint16.idx");
  std::string bin = readBytes(kMegatronDir + "/shared_gpt2_uint16.bin");
  ASSERT_EQ(idx.size(), 114u);

  expectRejected(idx.substr(0, 20), bin, "fewer than its 34-byte header");
  std::string magic = idx;
  magic[0] = 'X';
  expectRejected(magic, bin, "does not start with the magic");
  std::string version = idx;
  version[9] = 2;
  expectRejected(version, bin, "index version 2, expected 1");
  std::string type = idx;
  type[17] = 9;
  expectRejected(type, bin, "token type code 9, expected 1 to 8");
  type[17] = 7;
  expectRejected(type, bin, "tokens of type float32 are not token ids");
  expectRejected(idx.substr(0, 113), bin,
                 "the header counts 4 sequences and 4 document boundaries, "
                 "which take 80 bytes after the header, but the file has 79");
  std::string huge = idx;
  huge[25] = 0x7f; // sequence count near 2^63
  expectRejected(huge, bin, "which take more than the");
  expectRejected(idx, bin.substr(0, 27),
                 "sequence 3 of 4 tokens at byte 20 lies outside the .bin "
                 "file of 27 bytes");
  std::string order = idx;
  order[34 + 48 + 8] = 5; // document boundary 1: 1 -> 5 > 4 sequences
  expectRejected(order, bin, "document boundary 1 is 5");
  std::string negative = idx;
  negative[34] = static_cast<char>(0xff);
  negative[35] = static_cast<char>(0xff);
  negative[36] = static_cast<char>(0xff);
  negative[37] = static_cast<char>(0xff);
  expectRejected(negative, bin, "sequence 0 of -1 tokens");
}

TEST(IndexedDatasetTest, NamesAMissingFile) {
  try {
    IndexedDataset dataset(kMegatronDir + "/no-such-prefix");
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_EQ(e.code(), MTRT_STATUS_NOT_FOUND);
    EXPECT_NE(std::string(e.what()).find("no-such-prefix.idx"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
