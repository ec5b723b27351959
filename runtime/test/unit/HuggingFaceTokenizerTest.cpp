// Tests of HuggingFaceTokenizer against the `tokenizers` library's ids and
// decodings for tokenizer.json files shaped like Llama 3's, Qwen2.5's,
// Llama 2's and Mistral's (test/tokenizer/Inputs, made by
// make-tokenizers.py on a machine with tokenizers 0.23), and of the message
// of every field it refuses.
#include "data/HuggingFaceTokenizer.h"
#include "core/Error.h"
#include "data/Tokenizer.h"

#include "gtest/gtest.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

using namespace mtrt;
using namespace mtrt::data;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kInputs = MTRT_TEST_TOKENIZER_DIR;

std::string readText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

json readJson(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return json::parse(in);
}

class HuggingFaceTokenizerFamilyTest
    : public ::testing::TestWithParam<const char *> {};

TEST_P(HuggingFaceTokenizerFamilyTest, EncodesCornerCasesAsTokenizersDoes) {
  std::string dir = kInputs + "/" + GetParam();
  HuggingFaceTokenizer tokenizer(dir);
  json expected = readJson(dir + "/ids.json");
  ASSERT_GT(expected["cases"].size(), 30u);
  for (const json &entry : expected["cases"]) {
    std::string text = entry[0].get<std::string>();
    EXPECT_EQ(tokenizer.encode(text), entry[1].get<std::vector<int32_t>>())
        << "text: " << json(text).dump();
  }
}

TEST_P(HuggingFaceTokenizerFamilyTest, EncodesAndDecodesTextsAsTokenizersDoes) {
  std::string dir = kInputs + "/" + GetParam();
  HuggingFaceTokenizer tokenizer(dir);
  json expected = readJson(dir + "/ids.json");
  std::unique_ptr<Tokenizer> copy = tokenizer.clone();
  for (auto [key, path] : {std::pair<std::string, std::string>{
                               "corpus", kInputs + "/../../../data/"
                                                   "corpus.txt"},
                           {"unicode", kInputs + "/unicode.txt"}}) {
    std::string text = readText(path);
    auto ids = expected[key]["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(copy->encode(text), ids) << key;
    const json &decoded = expected[key]["decoded"];
    EXPECT_EQ(tokenizer.decode(ids),
              decoded.is_null() ? text : decoded.get<std::string>())
        << key;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, HuggingFaceTokenizerFamilyTest,
    ::testing::Values("llama3", "qwen2.5", "llama2", "mistral"),
    [](const auto &info) {
      std::string name = info.param;
      name.erase(std::remove(name.begin(), name.end(), '.'), name.end());
      return name;
    });

TEST(HuggingFaceTokenizerTest, EndOfDocumentAndVocabularyComeFromTheFiles) {
  HuggingFaceTokenizer llama3(kInputs + "/llama3");
  // 2000 BPE tokens, then the 11 added ones; eos_token <|end_of_text|>.
  EXPECT_EQ(llama3.vocabSize(), 2011);
  EXPECT_EQ(llama3.eod(), 2001);
  EXPECT_EQ(llama3.typeName(), "HuggingFaceTokenizer");
  HuggingFaceTokenizer mistral(kInputs + "/mistral");
  EXPECT_EQ(mistral.vocabSize(), 2000);
  EXPECT_EQ(mistral.eod(), 2);
  // The factory reads Megatron-LM's flags.
  TokenizerOptions options;
  options.type = "HuggingFaceTokenizer";
  options.tokenizerModel = kInputs + "/qwen2.5/tokenizer.json";
  EXPECT_EQ(makeTokenizer(options)->eod(), 2000);
}

/// A copy of the Llama 3 or Llama 2 directory with tokenizer.json (and
/// tokenizer_config.json) changed.
class HuggingFaceTokenizerRefusalTest : public ::testing::Test {
protected:
  void SetUp() override {
    std::string pattern =
        (fs::temp_directory_path() / "mtrt-hftok-XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// The message of loading `family` after `edit`.
  std::string refusal(const char *family,
                      const std::function<void(json &, json &)> &edit) {
    json tokenizer = readJson(kInputs + "/" + family + "/tokenizer.json");
    json config = readJson(kInputs + "/" + family + "/tokenizer_config.json");
    edit(tokenizer, config);
    std::ofstream(dir_ + "/tokenizer.json") << tokenizer.dump();
    if (!config.is_null())
      std::ofstream(dir_ + "/tokenizer_config.json") << config.dump();
    else
      fs::remove(dir_ + "/tokenizer_config.json");
    try {
      HuggingFaceTokenizer tokenizer(dir_);
    } catch (const Error &e) {
      return e.what();
    }
    return "(loaded)";
  }
  std::string file() const { return "'" + dir_ + "/tokenizer.json': "; }

  std::string dir_;
};

const char *const kRefused =
    ", which HuggingFaceTokenizer does not implement: it would tokenize "
    "differently from the tokenizers library (docs/Tokenizers.md lists what "
    "it reads)";

TEST_F(HuggingFaceTokenizerRefusalTest, NamesEachFieldItDoesNotImplement) {
  EXPECT_EQ(refusal("llama3",
                    [](json &t, json &) {
                      t["normalizer"] = {{"type", "Lowercase"}};
                    }),
            file() + "normalizer.type is \"Lowercase\"" + kRefused);
  EXPECT_EQ(refusal("llama3",
                    [](json &t, json &) {
                      t["pre_tokenizer"]["pretokenizers"][0]["behavior"] =
                          "Removed";
                    }),
            file() + "pre_tokenizer.pretokenizers[0].behavior is \"Removed\"" +
                kRefused);
  EXPECT_EQ(
      refusal(
          "llama3",
          [](json &t, json &) {
            t["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Whitespace"}};
          }),
      file() + "pre_tokenizer.pretokenizers[1].type is \"Whitespace\"" +
          kRefused);
  EXPECT_EQ(refusal("llama3",
                    [](json &t, json &) {
                      t["post_processor"] = {{"type", "RobertaProcessing"}};
                    }),
            file() + "post_processor.type is \"RobertaProcessing\"" + kRefused);
  EXPECT_EQ(refusal("llama3",
                    [](json &t, json &) {
                      t["decoder"] = {{"type", "WordPiece"}};
                    }),
            file() + "decoder.type is \"WordPiece\"" + kRefused);
  EXPECT_EQ(refusal("llama3",
                    [](json &t, json &) {
                      t["truncation"] = {{"max_length", 512}};
                    }),
            file() + "truncation is {\"max_length\":512}" + kRefused);
  EXPECT_EQ(
      refusal(
          "llama2",
          [](json &t, json &) {
            t["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
          }),
      file() + "normalizer.normalizers[1].pattern is {\"Regex\":\" +\"}" +
          kRefused);
  EXPECT_EQ(
      refusal("llama3",
              [](json &t, json &) { t["added_tokens"][0]["lstrip"] = true; }),
      file() + "added_tokens[0].lstrip is true, which "
               "HuggingFaceTokenizer does not implement: it would "
               "tokenize differently from the tokenizers library "
               "(docs/Tokenizers.md)");
}

TEST_F(HuggingFaceTokenizerRefusalTest, NamesModelsAndFlagsItDoesNotImplement) {
  const std::string tail =
      "; HuggingFaceTokenizer reads the BPE models of Llama 3, Qwen2.5, Llama "
      "2 and Mistral (docs/Tokenizers.md), and would tokenize this file "
      "differently from the tokenizers library";
  EXPECT_EQ(refusal("llama3",
                    [](json &t, json &) { t["model"]["type"] = "WordPiece"; }),
            file() +
                "model.type is \"WordPiece\" (not implemented: only "
                "\"BPE\")" +
                tail);
  EXPECT_EQ(
      refusal("llama3", [](json &t, json &) { t["model"]["dropout"] = 0.1; }),
      file() +
          "model.dropout is 0.1 (not implemented: BPE dropout "
          "samples different merges at random; only null)" +
          tail);
  EXPECT_EQ(refusal("llama3",
                    [](json &t, json &) {
                      t["model"]["continuing_subword_prefix"] = "##";
                    }),
            file() +
                "model.continuing_subword_prefix is \"##\" (not "
                "implemented: only null or \"\")" +
                tail);
}

TEST_F(HuggingFaceTokenizerRefusalTest, NamesMalformedEntriesAndMissingFiles) {
  EXPECT_EQ(refusal("llama3",
                    [](json &t, json &) { t["model"]["merges"][0] = "a b c"; }),
            file() + "model.merges[0] is \"a b c\", expected two tokens "
                     "separated by one space");
  EXPECT_EQ(refusal("llama3",
                    [](json &t, json &) {
                      t["model"]["merges"][1] = json::array({"zz", "q"});
                    }),
            file() + "model.merges[1] [\"zz\",\"q\"] joins tokens that "
                     "model.vocab lacks");
  EXPECT_EQ(
      refusal("llama3", [](json &, json &c) { c["eos_token"] = "<|nope|>"; }),
      "'" + dir_ +
          "/tokenizer_config.json': eos_token \"<|nope|>\" is "
          "not a token of '" +
          dir_ + "/tokenizer.json'");
  EXPECT_EQ(refusal("llama3", [](json &, json &c) { c = nullptr; }),
            "--tokenizer-model: cannot open '" + dir_ +
                "/tokenizer_config.json' (No such file or directory); its "
                "eos_token is the end of document (Megatron-LM's eod, "
                "--append-eod); copy the model's tokenizer_config.json next "
                "to tokenizer.json");
}

TEST(HuggingFaceTokenizerTest, RejectsInvalidUtf8WithItsOffset) {
  HuggingFaceTokenizer tokenizer(kInputs + "/qwen2.5");
  try {
    tokenizer.encode("ab\xFF"
                     "cd");
    FAIL() << "invalid UTF-8 was encoded";
  } catch (const Error &e) {
    EXPECT_EQ(e.code(), MTRT_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(e.what(), "invalid UTF-8 at byte 2 of the text; "
                           "HuggingFaceTokenizer reads UTF-8 text (convert "
                           "the file, e.g. with iconv)");
  }
}

TEST(HuggingFaceTokenizerTest, FlagsNameWhatIsMissing) {
  TokenizerOptions options;
  options.type = "HuggingFaceTokenizer";
  try {
    makeTokenizer(options);
    FAIL();
  } catch (const Error &e) {
    EXPECT_STREQ(e.what(), "--tokenizer-type HuggingFaceTokenizer needs "
                           "--tokenizer-model DIR, the model's directory "
                           "with tokenizer.json and tokenizer_config.json");
  }
  options.type = "GPT2BPETokenizer";
  options.tokenizerModel = kInputs + "/llama3";
  try {
    makeTokenizer(options);
    FAIL();
  } catch (const Error &e) {
    EXPECT_STREQ(e.what(), "--tokenizer-model is for --tokenizer-type "
                           "HuggingFaceTokenizer (found --tokenizer-type "
                           "GPT2BPETokenizer)");
  }
}

} // namespace
