// Tests of the trainer's data path and command line: splits, windows,
// shuffling, the byte tokenizer, flags.
#include "BundleTestBuilder.h"

#include "train/ByteTokenizer.h"
#include "train/GptDataset.h"
#include "train/TrainFlags.h"

#include <algorithm>
#include <numeric>
#include <set>

using namespace mtrt;
using namespace mtrt::test;
using namespace mtrt::train;

namespace {

std::shared_ptr<std::vector<int32_t>> counting(int32_t n) {
  auto tokens = std::make_shared<std::vector<int32_t>>(n);
  std::iota(tokens->begin(), tokens->end(), 0);
  return tokens;
}

TEST(TrainerDataTest, SplitsAsMegatron) {
  auto r = splitRanges(parseSplit("969,30,1"), 1000);
  EXPECT_EQ(r[0], std::make_pair(int64_t(0), int64_t(969)));
  EXPECT_EQ(r[1], std::make_pair(int64_t(969), int64_t(999)));
  EXPECT_EQ(r[2], std::make_pair(int64_t(999), int64_t(1000)));
  // Shares are relative; missing parts are 0; rounding leaves no gap.
  r = splitRanges(parseSplit("2,1"), 10);
  EXPECT_EQ(r[0].second, 7);
  EXPECT_EQ(r[1], std::make_pair(int64_t(7), int64_t(10)));
  EXPECT_EQ(r[2].first, r[2].second);
  for (const char *bad : {"", "a,b", "1,2,3,4", "-1,2", "0,1", "1,,2"})
    expectError([&] { parseSplit(bad); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"--split: found '" + std::string(bad) + "'", "e.g. 969,30,1"});
}

TEST(TrainerDataTest, WindowsOverlapByOneToken) {
  // Tokens 10..49 (a range inside the stream), seq 4: windows of 5 tokens at
  // a stride of 4, (40 - 1) / 4 = 9 of them.
  GptDataset data(counting(60), 10, 50, 4, 1, false, "part");
  EXPECT_EQ(data.windowsPerEpoch(), 9);
  std::vector<int32_t> inputs(4), labels(4);
  data.read(0, inputs.data(), labels.data());
  EXPECT_EQ(inputs, (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(labels, (std::vector<int32_t>{11, 12, 13, 14}));
  data.read(1, inputs.data(), labels.data());
  EXPECT_EQ(inputs.front(), 14); // the last label of window 0
  data.read(8, inputs.data(), labels.data());
  EXPECT_EQ(labels.back(), 46); // stays inside [10, 50)
  data.read(9, inputs.data(), labels.data());
  EXPECT_EQ(inputs.front(), 10); // unshuffled: epoch 2 starts over
  expectError([] { GptDataset(counting(8), 0, 4, 4, 1, false, "the part"); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"the part has 4 tokens; a sample needs seq_length + 1 = 5"});
}

TEST(TrainerDataTest, ShufflesEachEpochAsAPermutation) {
  GptDataset data(counting(1001), 0, 1001, 10, 1234, true, "part");
  int64_t n = data.windowsPerEpoch();
  ASSERT_EQ(n, 100);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t s = 0; s < n; ++s)
    epoch0.push_back(data.windowOf(s));
  for (int64_t s = n; s < 2 * n; ++s)
    epoch1.push_back(data.windowOf(s));
  for (const auto *epoch : {&epoch0, &epoch1}) {
    std::set<int64_t> seen(epoch->begin(), epoch->end());
    EXPECT_EQ(seen.size(), static_cast<size_t>(n)); // each window once
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), n - 1);
  }
  EXPECT_NE(epoch0, epoch1); // a new order each epoch
  std::vector<int64_t> sorted(epoch0);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(epoch0, sorted); // actually shuffled

  // The order is a function of the seed alone, also when read out of order.
  GptDataset same(counting(1001), 0, 1001, 10, 1234, true, "part");
  EXPECT_EQ(same.windowOf(n + 5), epoch1[5]);
  EXPECT_EQ(same.windowOf(3), epoch0[3]);
  GptDataset other(counting(1001), 0, 1001, 10, 1235, true, "part");
  std::vector<int64_t> otherEpoch0;
  for (int64_t s = 0; s < n; ++s)
    otherEpoch0.push_back(other.windowOf(s));
  EXPECT_NE(otherEpoch0, epoch0);
}

TEST(TrainerDataTest, ByteTokenizerRoundTripsAndEscapes) {
  std::string text("a\x00\xff\n", 4);
  std::vector<int32_t> tokens = ByteTokenizer::encode(text);
  EXPECT_EQ(tokens, (std::vector<int32_t>{97, 0, 255, 10}));
  EXPECT_EQ(ByteTokenizer::decode(tokens), text);
  EXPECT_EQ(ByteTokenizer::decode({65, 300, -1}), "A??");
  EXPECT_EQ(escapeForDisplay(std::string("a\x00\x1b[\\\n\xff", 7)),
            "a\\x00\\x1b[\\\\\n\\xff");
  EXPECT_EQ(escapeForDisplay("caf\xc3\xa9 \xe2\x82\xac"),
            "caf\xc3\xa9 \xe2\x82\xac");
  EXPECT_EQ(escapeForDisplay("\xc3"), "\\xc3");          // truncated sequence
  EXPECT_EQ(escapeForDisplay("\xc0\xaf"), "\\xc0\\xaf"); // overlong
}

std::vector<std::string> argv(std::initializer_list<const char *> args) {
  return std::vector<std::string>(args.begin(), args.end());
}

TEST(TrainerDataTest, ParsesMegatronFlags) {
  TrainCommand c = parseTrainCommand(argv({"gpt.mtb",
                                           "--data-path",
                                           "corpus.txt",
                                           "--train-iters",
                                           "300",
                                           "--lr=6e-4",
                                           "--min-lr",
                                           "6e-5",
                                           "--lr-decay-style",
                                           "cosine",
                                           "--lr-warmup-fraction",
                                           "0.01",
                                           "--seed",
                                           "7",
                                           "--clip-grad",
                                           "0.5",
                                           "--threads",
                                           "2",
                                           "--log-jsonl",
                                           "m.jsonl",
                                           "--sample-tokens",
                                           "64",
                                           "--sample-prompt",
                                           "Once",
                                           "--split",
                                           "98,2,0",
                                           "--no-progress-bar"}));
  EXPECT_EQ(c.bundlePath, "gpt.mtb");
  EXPECT_EQ(c.dataPath, std::vector<std::string>{"corpus.txt"});
  EXPECT_EQ(c.options.trainIters, 300);
  EXPECT_EQ(c.options.lr, 6e-4);
  EXPECT_EQ(c.options.minLr, 6e-5);
  EXPECT_EQ(c.options.lrDecayStyle, host::LrDecayStyle::Cosine);
  EXPECT_EQ(c.options.lrWarmupFraction, 0.01);
  EXPECT_EQ(c.options.seed, 7u);
  EXPECT_EQ(c.options.clipGrad, 0.5);
  EXPECT_EQ(c.options.threads, 2u);
  EXPECT_EQ(c.options.logJsonl, "m.jsonl");
  EXPECT_EQ(c.sampleTokens, 64);
  EXPECT_EQ(c.samplePrompt, "Once");
  EXPECT_EQ(c.options.split, "98,2,0");
  EXPECT_FALSE(c.options.progressBar);
  // Megatron-LM's defaults (beta2 is GPT practice's 0.95).
  EXPECT_EQ(c.options.weightDecay, 0.01);
  EXPECT_EQ(c.options.adamBeta1, 0.9);
  EXPECT_EQ(c.options.adamBeta2, 0.95);
  EXPECT_EQ(c.options.adamEps, 1e-8);
  EXPECT_EQ(c.options.evalInterval, 1000);
  EXPECT_EQ(c.options.evalIters, 100);
  EXPECT_TRUE(parseTrainCommand(argv({"--help"})).help);
  EXPECT_NE(trainUsage().find("--lr-warmup-iters N"), std::string::npos);
}

TEST(TrainerDataTest, ParsesMegatronDataAndTokenizerFlags) {
  std::vector<std::string> args = {
      "--data-path", "0.3", "a_text_document", "0.7", "b_text_document",
      "gpt.mtb", "--train-iters", "5", "--lr", "1e-3", "--tokenizer-type",
      "GPT2BPETokenizer", "--vocab-file", "e.json", "--merge-file", "v.bpe",
      "--micro-batch-size", "4", "--fp16", "--loss-scale", "1024"};
  TrainCommand c = parseTrainCommand(args);
  EXPECT_EQ(c.bundlePath, "gpt.mtb");
  EXPECT_EQ(c.dataPath, (std::vector<std::string>{"0.3", "a_text_document",
                                                  "0.7", "b_text_document"}));
  EXPECT_TRUE(dataPathIsIndexed(c.dataPath));
  EXPECT_EQ(c.options.tokenizer.type, "GPT2BPETokenizer");
  EXPECT_EQ(c.options.tokenizer.vocabFile, "e.json");
  EXPECT_EQ(c.options.tokenizer.mergeFile, "v.bpe");
  EXPECT_EQ(c.options.microBatchSize, 4);
  EXPECT_TRUE(c.fp16);
  EXPECT_EQ(c.lossScale, 1024.0);
  // --fp16 trains with a static scale of 1024 here (any backend).
  checkPrecisionFlags(c);
  ASSERT_TRUE(c.options.lossScaling.has_value());
  EXPECT_EQ(c.options.lossScaling->staticScale, 1024.0);
  checkPrecisionMatchesBundle(c, "g.mtb", "fp16");
  expectError([&] { checkPrecisionMatchesBundle(c, "g.mtb", "fp32"); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"--fp16: bundle 'g.mtb' is compiled for precision fp32",
               "recompile it with megatron-compile --fp16, or drop --fp16"});
  c.fp16 = false;
  expectError([&] { checkPrecisionMatchesBundle(c, "g.mtb", "fp16"); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"bundle 'g.mtb' is compiled for precision fp16",
               "pass --fp16"});
  expectError([&] { checkPrecisionFlags(c); }, MTRT_STATUS_INVALID_ARGUMENT,
              {"--loss-scale applies to --fp16 training only"});
  c.given.clear();
  c.lossScale.reset();
  c.bf16 = true;
  checkPrecisionFlags(c); // the host runs a bf16 bundle's types too
  c.backend = "cuda";
  checkPrecisionFlags(c);
  expectError([&] { checkPrecisionMatchesBundle(c, "g.mtb", "fp32"); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"--bf16: bundle 'g.mtb' is compiled for precision fp32"});
  checkPrecisionMatchesBundle(c, "g.mtb", "bf16");
  expectError([&] { dataPathIsIndexed({"missing_text_document.bin"}); },
              MTRT_STATUS_NOT_FOUND,
              {"'missing_text_document.bin' is neither a text file nor the "
               "prefix of a .bin/.idx pair",
               "pass PREFIX_text_document"});
  expectError([&] { dataPathIsIndexed({"nothing-here"}); },
              MTRT_STATUS_NOT_FOUND,
              {"is neither a text file nor the prefix of a .bin/.idx pair"});
}

TEST(TrainerDataTest, FlagErrorsSayWhatAndHow) {
  auto base = [](std::initializer_list<const char *> extra) {
    std::vector<std::string> a = {
        "b.mtb", "--data-path", "c.txt", "--train-iters", "10", "--lr", "1e-3"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expectError(
      [&] {
        parseTrainCommand(base({"--lr-warmup-iter", "5"}));
      },
      MTRT_STATUS_INVALID_ARGUMENT,
      {"unknown flag --lr-warmup-iter", "did you mean --lr-warmup-iters?",
       "megatron-train --help"});
  expectError(
      [&] {
        parseTrainCommand(base({"--seq-length", "4"}));
      },
      MTRT_STATUS_INVALID_ARGUMENT,
      {"--seq-length is fixed when the bundle is compiled",
       "megatron-compile"});
  expectError(
      [&] {
        parseTrainCommand(base({"--exit-interval", "5"}));
      },
      MTRT_STATUS_INVALID_ARGUMENT, {"--exit-interval is not supported"});
  expectError(
      [&] {
        parseTrainCommand(base({"--save-interval", "0", "--save", "ckpt"}));
      },
      MTRT_STATUS_INVALID_ARGUMENT,
      {"--save-interval: found 0, expected an integer >= 1"});
  expectError(
      [&] {
        parseTrainCommand(base({"--clip-grad", "one"}));
      },
      MTRT_STATUS_INVALID_ARGUMENT,
      {"--clip-grad: found 'one', expected a number"});
  expectError(
      [&] {
        parseTrainCommand(base({"--train-iters", "0"}));
      },
      MTRT_STATUS_INVALID_ARGUMENT,
      {"--train-iters: found 0, expected an integer >= 1"});
  expectError(
      [&] {
        parseTrainCommand(base({"--lr-decay-style", "cos"}));
      },
      MTRT_STATUS_INVALID_ARGUMENT,
      {"--lr-decay-style: found 'cos'", "constant, linear or cosine"});
  expectError([&] { parseTrainCommand(base({"--seed"})); },
              MTRT_STATUS_INVALID_ARGUMENT, {"--seed needs a value: --seed N"});
  expectError(
      [&] {
        parseTrainCommand(argv({"--data-path", "c.txt"}));
      },
      MTRT_STATUS_INVALID_ARGUMENT, {"no bundle given"});
  expectError(
      [&] {
        parseTrainCommand(argv({"b.mtb", "--data-path", "c", "--lr", "1"}));
      },
      MTRT_STATUS_INVALID_ARGUMENT, {"--train-iters is required"});
  expectError(
      [&] {
        parseTrainCommand(
            argv({"b.mtb", "--train-iters", "5", "--data-path", "c"}));
      },
      MTRT_STATUS_INVALID_ARGUMENT, {"--lr is required"});
  EXPECT_EQ(editDistance("--lr-warmup-iter", "--lr-warmup-iters"), 1u);
}

} // namespace
