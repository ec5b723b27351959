// Tests of the training loop: determinism, falling loss, evaluation, logs,
// sampling, and its checks.
#include "BundleTestBuilder.h"

#include "host/ParameterStore.h"
#include "train/Trainer.h"
#include "train/TrainingLog.h"

#include <cmath>
#include <fstream>
#include <sstream>

using namespace mtrt;
using namespace mtrt::test;
using namespace mtrt::train;

namespace {

constexpr int64_t V = 256, H = 16, B = 4, S = 16;

/// A corpus with strong bigram structure.
std::string corpus() {
  std::string text;
  for (int i = 0; i < 120; ++i)
    text += "the cat sat on the mat; the dog ate the hat. ";
  return text;
}

Bundle bigram(int64_t globalBatch = 8, int64_t vocab = V) {
  return Bundle::parseManifest(
      "bigram.mtb", bigramManifest(vocab, H, B, S, globalBatch).dump());
}

TrainerOptions options() {
  TrainerOptions o;
  o.trainIters = 60;
  o.lr = 3e-2;
  o.minLr = 3e-3;
  o.lrWarmupIters = 5;
  o.lrDecayStyle = host::LrDecayStyle::Cosine;
  o.logInterval = 20;
  o.evalInterval = 0;
  o.threads = 2;
  o.progressBar = false;
  return o;
}

std::vector<double> losses(const Trainer &trainer) {
  std::vector<double> out;
  for (const IterationRecord &r : trainer.history())
    out.push_back(r.loss);
  return out;
}

TEST(TrainerTest, SameSeedGivesBitIdenticalLosses) {
  Bundle bundle = bigram();
  std::ostringstream log1, log2, log3;
  Trainer a(bundle, corpus(), "corpus", options());
  a.train(log1);
  TrainerOptions serial = options();
  serial.threads = 1;
  Trainer b(bundle, corpus(), "corpus", serial);
  b.train(log2);
  ASSERT_EQ(losses(a).size(), 60u);
  EXPECT_EQ(losses(a), losses(b)); // exact, whatever the thread count
  for (size_t i = 0; i < a.history().size(); ++i)
    EXPECT_EQ(a.history()[i].gradNorm, b.history()[i].gradNorm);

  TrainerOptions other = options();
  other.seed = 99;
  Trainer c(bundle, corpus(), "corpus", other);
  c.train(log3);
  EXPECT_NE(losses(a), losses(c));
}

TEST(TrainerTest, LossFallsOnASyntheticCorpus) {
  Bundle bundle = bigram();
  Trainer trainer(bundle, corpus(), "corpus", options());
  std::ostringstream log;
  trainer.train(log);
  std::vector<double> l = losses(trainer);
  // Starts near ln(256) (near-uniform logits), ends far below.
  EXPECT_NEAR(l.front(), std::log(256.0), 0.1);
  EXPECT_LT(l.back(), 0.6 * l.front());
  EXPECT_EQ(trainer.microBatchesPerIteration(), 2);
  for (const IterationRecord &r : trainer.history()) {
    EXPECT_TRUE(std::isfinite(r.gradNorm));
    EXPECT_GT(r.tokensPerSecond, 0);
  }
}

TEST(TrainerTest, FollowsTheLearningRateSchedule) {
  Bundle bundle = bigram();
  Trainer trainer(bundle, corpus(), "corpus", options());
  std::ostringstream log;
  trainer.train(log);
  const auto &h = trainer.history();
  // Iteration i uses the rate after i - 1 completed iterations.
  EXPECT_EQ(h[0].learningRate, 0.0);
  EXPECT_DOUBLE_EQ(h[1].learningRate, 3e-2 / 5);
  EXPECT_DOUBLE_EQ(h[5].learningRate, 3e-2);
  EXPECT_DOUBLE_EQ(h[59].learningRate,
                   host::learningRate(trainer.schedule(), 59));
  EXPECT_LT(h[59].learningRate, 4e-3);
}

TEST(TrainerTest, LogsInMegatronStyleAndToJsonl) {
  TempFile jsonl(".jsonl");
  TrainerOptions o = options();
  o.trainIters = 10;
  o.logInterval = 5;
  o.evalInterval = 5;
  o.evalIters = 2;
  o.split = "90,10,0";
  o.logJsonl = jsonl.path();
  Bundle bundle = bigram();
  Trainer trainer(bundle, corpus(), "corpus", o);
  std::ostringstream log;
  trainer.train(log);
  std::string text = log.str();
  EXPECT_NE(text.find(" iteration        5/      10 | consumed samples: 40 |"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("| global batch size: 8 | lm loss: "), std::string::npos);
  EXPECT_NE(text.find(" validation loss at iteration 10 | lm loss value: "),
            std::string::npos);
  EXPECT_EQ(text.find("at the end of training"), std::string::npos);

  std::ifstream in(jsonl.path());
  std::string line;
  std::vector<Json> records;
  while (std::getline(in, line))
    records.push_back(Json::parse(line));
  ASSERT_EQ(records.size(), 12u); // 10 iterations, 2 evaluations
  EXPECT_EQ(records[0]["iteration"], 1);
  EXPECT_EQ(records[0]["loss"].get<double>(), trainer.history()[0].loss);
  for (const char *key : {"lr", "grad_norm", "tokens_per_second"})
    EXPECT_TRUE(records[0].contains(key)) << key;
  EXPECT_TRUE(records[5].contains("eval_loss"));
  EXPECT_EQ(records[11]["eval_loss"].get<double>(), trainer.evaluate());
}

TEST(TrainerTest, FormatsTheIterationLine) {
  EXPECT_EQ(TrainingLog::formatIteration(10, 300, 80, 12.34, 5e-4, 8, 4.1234564,
                                         1.2344, 12345.4),
            " iteration       10/     300 | consumed samples: 80 | elapsed "
            "time per iteration (ms): 12.3 | learning rate: 5.000E-04 | "
            "global batch size: 8 | lm loss: 4.123456E+00 | grad norm: 1.234 "
            "| tokens per second: 12345 |");
  // --fp16 adds Megatron-LM's loss scale and skipped/nan counts; a skipped
  // last step has no grad norm.
  EXPECT_EQ(TrainingLog::formatIteration(10, 300, 80, 12.34, 5e-4, 8,
                                         4.1234564, 1.2344, 12345.4,
                                         LossScaleLine{65536, 3, 1}),
            " iteration       10/     300 | consumed samples: 80 | elapsed "
            "time per iteration (ms): 12.3 | learning rate: 5.000E-04 | "
            "global batch size: 8 | lm loss: 4.123456E+00 | loss scale: "
            "65536.0 | grad norm: 1.234 | number of skipped iterations:   3 "
            "| number of nan iterations:   1 | tokens per second: 12345 |");
  EXPECT_EQ(TrainingLog::formatIteration(1, 300, 8, 1, 0, 8, 0, NAN, 2,
                                         LossScaleLine{2, 1, 0}),
            " iteration        1/     300 | consumed samples: 8 | elapsed "
            "time per iteration (ms): 1.0 | learning rate: 0.000E+00 | "
            "global batch size: 8 | lm loss: 0.000000E+00 | loss scale: 2.0 "
            "| number of skipped iterations:   1 | number of nan iterations: "
            "  0 | tokens per second: 2 |");
  // A mixture of experts: Megatron-LM's load_balancing_loss and z_loss
  // after the lm loss.
  EXPECT_EQ(TrainingLog::formatIteration(
                10, 300, 80, 12.34, 5e-4, 8, 4.1234564, 1.2344, 12345.4,
                std::nullopt,
                {{"load_balancing_loss", 1.0123456}, {"z_loss", 2.5}}),
            " iteration       10/     300 | consumed samples: 80 | elapsed "
            "time per iteration (ms): 12.3 | learning rate: 5.000E-04 | "
            "global batch size: 8 | lm loss: 4.123456E+00 | "
            "load_balancing_loss: 1.012346E+00 | z_loss: 2.500000E+00 | grad "
            "norm: 1.234 | tokens per second: 12345 |");
  EXPECT_EQ(languageModelLoss(5.5, {{"aux_loss", 0.5}, {"z_loss", 2}}), 5.0);
  EXPECT_EQ(languageModelLoss(5.5, {}), 5.5);
}

TEST(TrainerTest, GreedySampleContinuesTheLearnedPattern) {
  TrainerOptions o = options();
  o.trainIters = 80;
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "abcd";
  Bundle bundle = bigram();
  Trainer trainer(bundle, text, "abcd", o);
  std::ostringstream log;
  trainer.train(log);
  EXPECT_EQ(trainer.sample("ab", 10), "abcdabcdabcd");
  // A prompt longer than the window keeps its last seq_length bytes.
  EXPECT_EQ(trainer.sample(text.substr(0, 41), 3).substr(41), "bcd");
}

TEST(TrainerTest, RejectsWhatCannotWork) {
  Bundle bundle = bigram();
  TrainerOptions o = options();
  expectError([&] { Trainer(bigram(8, 128), corpus(), "c", o); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"model.vocab_size is 128", "at least 256"});
  expectError([&] { Trainer(bundle, "too short", "tiny.txt", o); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"the training split of 'tiny.txt' (--split 969,30,1)",
               "a sample needs seq_length + 1 = 17"});
  o.evalInterval = 10;
  o.split = "100,0,0";
  expectError([&] { Trainer(bundle, corpus(), "c", o); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"the validation split of 'c'", "--eval-iters 0"});
  o = options();
  o.lrWarmupIters = 60;
  expectError(
      [&] { Trainer(bundle, corpus(), "c", o); }, MTRT_STATUS_INVALID_ARGUMENT,
      {"--lr-warmup-iters: found 60", "fewer than --lr-decay-iters (60)"});
  o = options();
  o.globalBatchSize = 6;
  expectError([&] { Trainer(bundle, corpus(), "c", o); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"--global-batch-size: found 6", "multiple of micro-batch size"});
  o = options();
  o.minLr = 1;
  expectError([&] { Trainer(bundle, corpus(), "c", o); },
              MTRT_STATUS_INVALID_ARGUMENT, {"--min-lr: found 1"});

  Json m = bigramManifest(V, H, B, S, 8);
  m["model"]["tensor_model_parallel_size"] = 2;
  Bundle parallel = Bundle::parseManifest("tp2.mtb", m.dump());
  expectError(
      [&] { Trainer(parallel, corpus(), "c", options()); },
      MTRT_STATUS_UNIMPLEMENTED,
      {"compiled for tensor x pipeline x data parallel sizes 2 x 1 x 1"});

  m = bigramManifest(V, H, B, S, 8);
  m["functions"].erase(2); // predict_step
  Bundle noPredict = Bundle::parseManifest("np.mtb", m.dump());
  Trainer trainer(noPredict, corpus(), "c", options());
  expectError(
      [&] { trainer.sample("the", 3); }, MTRT_STATUS_NOT_FOUND,
      {"--sample-tokens needs the bundle's predict_step", "'np.mtb' has none"});
}

// A pipeline bundle samples through its stages' predict functions (format
// version 11); one written before them is refused, naming the fix.
TEST(TrainerTest, SamplingNeedsThePipelineStagesPredictFunctions) {
  std::ifstream in(std::string(MTRT_TEST_DATA_DIR) +
                   "/manifests/gpt-pp-tied-dp.json");
  std::stringstream text;
  text << in.rdbuf();
  Json m = Json::parse(text.str());
  EXPECT_EQ(samplingRefusal(Bundle::parseManifest("pp.mtb", m.dump())), "");
  for (Json &stage : m["pipeline"]["stages"])
    stage.erase("predict");
  m["version"] = 10;
  std::string refusal =
      samplingRefusal(Bundle::parseManifest("old-pp.mtb", m.dump()));
  for (const char *part :
       {"sampling from bundle 'old-pp.mtb': its pipeline stage 0 has no "
        "predict function (the bundle was written before format version 11)",
        "recompile it with megatron-compile, or pass --sample-tokens 0"})
    EXPECT_NE(refusal.find(part), std::string::npos) << refusal;
}

TEST(TrainerTest, InitializesParametersAsTheManifestSays) {
  Bundle bundle = bigram();
  Trainer a(bundle, corpus(), "c", options());
  Trainer b(bundle, corpus(), "c", options());
  host::ParameterStore &pa = a.parameters(), &pb = b.parameters();
  const host::Tensor &table = pa.value(0);
  double sum = 0, squares = 0;
  for (int64_t i = 0; i < table.numElements(); ++i) {
    double x = table.data<float>()[i];
    sum += x;
    squares += x * x;
    EXPECT_EQ(x, pb.value(0).data<float>()[i]);
  }
  double n = static_cast<double>(table.numElements());
  EXPECT_NEAR(sum / n, 0, 0.003);
  EXPECT_NEAR(std::sqrt(squares / n), 0.02, 0.002); // std of the manifest
  for (int64_t i = 0; i < pa.value(2).numElements(); ++i)
    EXPECT_EQ(pa.value(2).data<float>()[i], 0.0f); // "zeros"
  // Parameter index keys the stream: two parameters differ.
  EXPECT_NE(pa.value(0).data<float>()[0], pa.value(1).data<float>()[0]);
}

} // namespace
