// The flag table of megatron-train and its parser.
#include "train/TrainFlags.h"

#include "core/CommandLine.h"
#include "data/IndexedDataset.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <sys/stat.h>
#include <tuple>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <sstream>

namespace mtrt::train {

namespace {

[[noreturn]] void invalid(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

double parseNumber(const std::string &flag, const std::string &text) {
  errno = 0;
  char *end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(value))
    invalid(flag + ": found '" + text + "', expected a number (e.g. " + flag +
            " 6e-4)");
  return value;
}

using Flag = mtrt::Flag<TrainCommand>;

const std::vector<Flag> &flags() {
  using C = TrainCommand;
  using S = const std::string &;
  static const std::vector<Flag> table = {
      {"--data-path", "PATH...",
       "a text file, the prefix of a .bin/.idx dataset "
       "(megatron-preprocess), or a blend of weights and prefixes "
       "(0.3 a 0.7 b) (required)",
       [](C &c, S, S v) { c.dataPath.push_back(v); }},
      {"--tokenizer-type", "TYPE",
       "ByteTokenizer (default), GPT2BPETokenizer or HuggingFaceTokenizer: "
       "tokenizes a text --data-path and the sample prompt",
       [](C &c, S, S v) { c.options.tokenizer.type = v; }},
      {"--vocab-file", "FILE", "GPT-2's encoder.json (GPT2BPETokenizer)",
       [](C &c, S, S v) { c.options.tokenizer.vocabFile = v; }},
      {"--merge-file", "FILE", "GPT-2's vocab.bpe (GPT2BPETokenizer)",
       [](C &c, S, S v) { c.options.tokenizer.mergeFile = v; }},
      {"--tokenizer-model", "DIR",
       "a Hugging Face model directory: its tokenizer.json and "
       "tokenizer_config.json (HuggingFaceTokenizer)",
       [](C &c, S, S v) { c.options.tokenizer.tokenizerModel = v; }},
      {"--micro-batch-size", "N",
       "samples per micro-batch; fixed when the bundle is compiled, so it "
       "must equal the bundle's",
       [](C &c, S f, S v) {
         c.options.microBatchSize = parseIntFlag(f, v, 1);
       }},
      {"--bf16", nullptr,
       "bf16 mixed precision, on a bundle compiled with --bf16: its types "
       "say which values are bf16 (the host backend rounds them as the "
       "GPU stores them)",
       [](C &c, S, S) { c.bf16 = true; }},
      {"--fp16", nullptr,
       "fp16 mixed precision with loss scaling, on a bundle compiled with "
       "--fp16 (the host computes in float32 with the loss scaling; the "
       "cuda backend likewise, for now)",
       [](C &c, S, S) { c.fp16 = true; }},
      {"--loss-scale", "S",
       "static loss scale of --fp16 training (default: dynamic scaling)",
       [](C &c, S f, S v) { c.lossScale = parseNumber(f, v); }},
      {"--initial-loss-scale", "S",
       "first scale of dynamic loss scaling (default 2^32)",
       [](C &c, S f, S v) { c.lossScaler.initialScale = parseNumber(f, v); }},
      {"--min-loss-scale", "S",
       "the dynamic loss scale never backs off below S (default 1)",
       [](C &c, S f, S v) { c.lossScaler.minScale = parseNumber(f, v); }},
      {"--loss-scale-window", "N",
       "clean iterations before the dynamic loss scale doubles (default "
       "1000)",
       [](C &c, S f, S v) { c.lossScaler.window = parseIntFlag(f, v, 1); }},
      {"--hysteresis", "N",
       "overflowing iterations before the dynamic loss scale halves "
       "(default 2)",
       [](C &c, S f, S v) { c.lossScaler.hysteresis = parseIntFlag(f, v, 1); }},
      {"--plot-dir", "DIR",
       "after training, draw loss.png, learning-rate.png and throughput.png "
       "into DIR",
       [](C &c, S f, S v) {
         if (v.empty())
           invalid(f + ": expected a directory");
         c.plotDir = v;
       }},
      {"--split", "W,W,W",
       "train/validation/test shares of the corpus (default 969,30,1)",
       [](C &c, S, S v) { c.options.split = v; }},
      {"--train-iters", "N", "iterations to train (required)",
       [](C &c, S f, S v) { c.options.trainIters = parseIntFlag(f, v, 1); }},
      {"--global-batch-size", "N",
       "samples per iteration (default: the bundle's); a multiple of the "
       "micro-batch size",
       [](C &c, S f, S v) {
         c.options.globalBatchSize = parseIntFlag(f, v, 1);
       }},
      {"--seed", "N", "seed of initialization and data order (default 1234)",
       [](C &c, S f, S v) {
         c.options.seed = static_cast<uint64_t>(parseIntFlag(f, v, 0));
       }},
      {"--lr", "LR", "peak learning rate (required)",
       [](C &c, S f, S v) { c.options.lr = parseNumber(f, v); }},
      {"--min-lr", "LR", "learning rate at the end of decay (default 0)",
       [](C &c, S f, S v) { c.options.minLr = parseNumber(f, v); }},
      {"--lr-decay-style", "STYLE",
       "constant, linear or cosine (default linear)",
       [](C &c, S f, S v) {
         if (v == "constant")
           c.options.lrDecayStyle = host::LrDecayStyle::Constant;
         else if (v == "linear")
           c.options.lrDecayStyle = host::LrDecayStyle::Linear;
         else if (v == "cosine")
           c.options.lrDecayStyle = host::LrDecayStyle::Cosine;
         else
           invalid(f + ": found '" + v +
                   "', expected constant, linear or cosine");
       }},
      {"--lr-decay-iters", "N", "iterations of decay (default --train-iters)",
       [](C &c, S f, S v) { c.options.lrDecayIters = parseIntFlag(f, v, 1); }},
      {"--lr-warmup-iters", "N", "iterations of linear warmup (default 0)",
       [](C &c, S f, S v) { c.options.lrWarmupIters = parseIntFlag(f, v, 0); }},
      {"--lr-warmup-fraction", "F",
       "warmup as a fraction of --lr-decay-iters (instead of "
       "--lr-warmup-iters)",
       [](C &c, S f, S v) { c.options.lrWarmupFraction = parseNumber(f, v); }},
      {"--lr-warmup-init", "LR", "learning rate warmup starts from (default 0)",
       [](C &c, S f, S v) { c.options.lrWarmupInit = parseNumber(f, v); }},
      {"--weight-decay", "WD",
       "AdamW weight decay, not applied to biases and norms (default 0.01)",
       [](C &c, S f, S v) { c.options.weightDecay = parseNumber(f, v); }},
      {"--adam-beta1", "B", "AdamW beta1 (default 0.9)",
       [](C &c, S f, S v) { c.options.adamBeta1 = parseNumber(f, v); }},
      {"--adam-beta2", "B", "AdamW beta2 (default 0.95)",
       [](C &c, S f, S v) { c.options.adamBeta2 = parseNumber(f, v); }},
      {"--adam-eps", "EPS", "AdamW epsilon (default 1e-8)",
       [](C &c, S f, S v) { c.options.adamEps = parseNumber(f, v); }},
      {"--clip-grad", "NORM",
       "clip gradients to this global L2 norm, 0 to disable (default 1.0)",
       [](C &c, S f, S v) { c.options.clipGrad = parseNumber(f, v); }},
      {"--log-interval", "N", "iterations between log lines (default 100)",
       [](C &c, S f, S v) { c.options.logInterval = parseIntFlag(f, v, 1); }},
      {"--eval-interval", "N",
       "iterations between evaluations, 0 to disable (default 1000)",
       [](C &c, S f, S v) { c.options.evalInterval = parseIntFlag(f, v, 0); }},
      {"--eval-iters", "N",
       "global batches of the validation split per evaluation (default 100)",
       [](C &c, S f, S v) { c.options.evalIters = parseIntFlag(f, v, 0); }},
      {"--log-jsonl", "PATH",
       "also write each iteration's metrics as a JSON line to PATH",
       [](C &c, S, S v) { c.options.logJsonl = v; }},
      {"--init-from", "FILE",
       "after the seeded initialization, load every parameter from a "
       "safetensors file with Hugging Face's GPT-2 or Llama names",
       [](C &c, S f, S v) {
         if (v.empty())
           invalid(f + ": expected the path of a .safetensors file");
         c.initFrom = v;
       }},
      {"--save-weights", "FILE",
       "after training, write the parameters to a safetensors file with "
       "Hugging Face's names (f32, vocabulary unpadded)",
       [](C &c, S f, S v) {
         if (v.empty())
           invalid(f + ": expected the path of a .safetensors file to write");
         c.saveWeights = v;
       }},
      {"--save-weights-experts", "NAMES",
       "with --save-weights: name a mixture-of-experts model's routed "
       "experts as the bundle does (bundle: one [E, out, in] tensor per "
       "projection, the default), or one tensor per expert as the hub "
       "stores Mixtral (mixtral: block_sparse_moe.experts.N.w1/w3/w2) or "
       "Qwen3-MoE (qwen3-moe: mlp.experts.N.gate_proj/up_proj/down_proj)",
       [](C &c, S f, S v) {
         std::optional<ExpertNames> names = parseExpertNames(v);
         if (!names)
           invalid(f + ": unknown value '" + v +
                   "'; expected bundle, mixtral or qwen3-moe");
         c.saveWeightsExperts = *names;
       }},
      {"--save", "DIR",
       "save checkpoints to DIR/iter_NNNNNNN (every --save-interval "
       "iterations and at the end; docs/Checkpoints.md)",
       [](C &c, S f, S v) {
         if (v.empty())
           invalid(f + ": expected the directory to save checkpoints to");
         c.options.save = v;
       }},
      {"--save-interval", "N",
       "iterations between checkpoints (default: only at the end)",
       [](C &c, S f, S v) { c.options.saveInterval = parseIntFlag(f, v, 1); }},
      {"--load", "DIR",
       "resume from the newest checkpoint in DIR, in any layout (none there: "
       "start from the seeded initialization)",
       [](C &c, S f, S v) {
         if (v.empty())
           invalid(f + ": expected the directory to load a checkpoint from");
         c.options.load = v;
       }},
      {"--sample-tokens", "N",
       "after training, print a continuation of N tokens (default 0)",
       [](C &c, S f, S v) { c.sampleTokens = parseIntFlag(f, v, 0); }},
      {"--temperature", "T",
       "the sample's logits are divided by T > 0 (default 1)",
       [](C &c, S f, S v) {
         c.sampling.temperature = parseNumber(f, v);
         if (!(c.sampling.temperature > 0))
           invalid(f + ": found '" + v +
                   "', expected a number > 0 (1 samples from the model's "
                   "distribution; lower is closer to greedy)");
       }},
      {"--top-k", "K",
       "the sample draws among the K most likely tokens: 1 is greedy (the "
       "default), 0 the whole vocabulary",
       [](C &c, S f, S v) { c.sampling.topK = parseIntFlag(f, v, 0); }},
      {"--sample-prompt", "TEXT",
       "the text to continue (default: the first 32 bytes of the corpus)",
       [](C &c, S, S v) { c.samplePrompt = v; }},
      {"--threads", "N",
       "CPU threads of the host kernels (default: all hardware threads)",
       [](C &c, S f, S v) {
         c.options.threads = static_cast<unsigned>(parseIntFlag(f, v, 1));
       }},
      {"--backend", "NAME",
       "host (CPU, default) or cuda (GPU 0; MTRT_CUDA_TF32=1 allows TF32 "
       "GEMMs)",
       [](C &c, S f, S v) {
         if (v != "host" && v != "cuda")
           invalid(f + ": found '" + v + "', expected host or cuda");
         c.backend = v;
       }},
      {"--in-process-ranks", nullptr,
       "run every rank of a bundle compiled for several ranks (its grid) as "
       "a thread of this process",
       [](C &c, S, S) { c.inProcessRanks = true; }},
      {"--collective-timeout", "SECONDS",
       "in a multi-process run (torchrun or MPI variables), abort the run "
       "when a collective takes longer (default 300)",
       [](C &c, S f, S v) {
         double seconds = parseNumber(f, v);
         if (!(seconds > 0))
           invalid(f + ": found '" + v + "', expected seconds > 0 (e.g. " +
                   f + " 300)");
         c.collectiveTimeout = seconds;
       }},
      {"--no-progress-bar", nullptr,
       "never draw the progress bar (drawn only when stderr is a terminal)",
       [](C &c, S, S) { c.options.progressBar = false; }},
      {"--help", nullptr, "print this help and exit",
       [](C &c, S, S) { c.help = true; }},
  };
  return table;
}

/// Megatron-LM flags that describe the model or the layout: compiled in.
const char *const kCompileTimeFlags[] = {
    "--seq-length",
    "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--num-query-groups",
    "--group-query-attention",
    "--max-position-embeddings",
    "--vocab-size",
    "--make-vocab-size-divisible-by",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--virtual-pipeline-model-parallel-size",
    "--sequence-parallel",
    "--data-parallel-size",
    "--use-distributed-optimizer",
    "--recompute-granularity",
    "--hidden-dropout",
    "--attention-dropout",
    "--init-method-std",
};

/// Megatron-LM flags megatron-train does not have yet.
const char *const kNotYetFlags[] = {
    "--exit-interval",
};

[[noreturn]] void unknownFlag(const std::string &flag) {
  for (const char *name : kCompileTimeFlags)
    if (flag == name)
      invalid(flag + " is fixed when the bundle is compiled; pass it to "
                     "megatron-compile and train the new bundle");
  for (const char *name : kNotYetFlags)
    if (flag == name)
      invalid(flag + " is not supported by megatron-train yet");
  std::vector<std::string> candidates = flagNames(flags());
  candidates.insert(candidates.end(), std::begin(kCompileTimeFlags),
                    std::end(kCompileTimeFlags));
  invalid(unknownFlagMessage(flag, candidates, "megatron-train"));
}

} // namespace

namespace {

/// "--data-path 0.3 a 0.7 b" -> "--data-path=0.3 --data-path=a ...". A
/// blend is pairs of a number and a prefix; a value that does not parse as
/// a number where a weight would come ends it, so that the bundle may
/// follow (megatron-train --data-path corpus.txt BUNDLE).
std::vector<std::string> gatherDataPath(const std::vector<std::string> &args) {
  auto isNumber = [](const std::string &text) {
    char *end = nullptr;
    std::strtod(text.c_str(), &end);
    return !text.empty() && *end == '\0';
  };
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] != "--data-path" || i + 1 == args.size()) {
      out.push_back(args[i]);
      continue;
    }
    size_t j = i + 1;
    out.push_back("--data-path=" + args[j++]);
    auto isFlag = [&](size_t k) {
      return args[k].size() > 1 && args[k][0] == '-' && !isNumber(args[k]);
    };
    if (isNumber(args[i + 1]))
      while (j < args.size() && !isFlag(j)) {
        out.push_back("--data-path=" + args[j++]);
        if (j == args.size() || !isNumber(args[j]))
          break;
        out.push_back("--data-path=" + args[j++]);
      }
    i = j - 1;
  }
  return out;
}

} // namespace

bool dataPathIsIndexed(const std::vector<std::string> &dataPath) {
  if (dataPath.size() > 1)
    return true;
  const std::string &path = dataPath.at(0);
  if (data::IndexedDataset::exists(path))
    return true;
  // A dataset named by one of its files: the prefix was meant.
  for (const char *suffix : {".bin", ".idx"}) {
    size_t n = std::strlen(suffix);
    if (path.size() > n && path.compare(path.size() - n, n, suffix) == 0 &&
        data::IndexedDataset::exists(path.substr(0, path.size() - n)))
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "--data-path: '" + path + "' is a file of an indexed "
                  "dataset; give its prefix without " + suffix + " ('" +
                  path.substr(0, path.size() - n) + "')");
  }
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode))
    return false;
  throw Error(MTRT_STATUS_NOT_FOUND,
              "--data-path: '" + path +
                  "' is neither a text file nor the prefix of a .bin/.idx "
                  "pair (megatron-preprocess writes PREFIX_text_document.bin "
                  "and .idx; pass PREFIX_text_document)");
}

void checkPrecisionFlags(const TrainCommand &command) {
  if (command.bf16 && command.fp16)
    invalid("--bf16 and --fp16 are both given; choose one");
  if (!command.fp16)
    for (const char *flag : {"--loss-scale", "--initial-loss-scale",
                             "--min-loss-scale", "--loss-scale-window",
                             "--hysteresis"})
      if (std::find(command.given.begin(), command.given.end(), flag) !=
          command.given.end())
        invalid(std::string(flag) +
                " applies to --fp16 training only (bf16 and float32 need no "
                "loss scaling); drop it");
}

void checkPrecisionMatchesBundle(const TrainCommand &command,
                                 const std::string &bundleName,
                                 const std::string &precision) {
  if (command.bf16 && precision != "bf16")
    invalid("--bf16: bundle '" + bundleName + "' is compiled for precision " +
            precision +
            "; the precision is fixed when the bundle is compiled: "
            "recompile it with megatron-compile --bf16, or drop --bf16");
  if (command.fp16 && precision != "fp16")
    invalid("--fp16: bundle '" + bundleName + "' is compiled for precision " +
            precision +
            "; the precision is fixed when the bundle is compiled: "
            "recompile it with megatron-compile --fp16, or drop --fp16");
  if (!command.fp16 && precision == "fp16")
    invalid("bundle '" + bundleName +
            "' is compiled for precision fp16, which trains with loss "
            "scaling: pass --fp16 (and the loss-scaling flags you want), or "
            "recompile it without --fp16");
}

TrainCommand parseTrainCommand(const std::vector<std::string> &args) {
  TrainCommand command;
  ParsedCommandLine parsed =
      parseCommandLine(gatherDataPath(args), flags(), command, unknownFlag);
  command.help |= parsed.shortHelp;
  command.given = parsed.given;
  auto given = [&](const char *name) {
    return std::find(parsed.given.begin(), parsed.given.end(), name) !=
           parsed.given.end();
  };
  if (command.help)
    return command;
  const std::vector<std::string> &positional = parsed.positional;
  if (positional.size() != 1)
    invalid(positional.empty()
                ? "no bundle given: megatron-train BUNDLE --data-path PATH "
                  "--train-iters N --lr LR (a bundle is what megatron-compile "
                  "-o writes)"
                : "expected one bundle, found " +
                      std::to_string(positional.size()) + " arguments: '" +
                      positional[0] + "', '" + positional[1] + "'...");
  command.bundlePath = positional[0];
  if (command.dataPath.empty())
    invalid("--data-path is required: a text file, or the prefix of a "
            ".bin/.idx dataset written by megatron-preprocess");
  if (!given("--train-iters"))
    invalid("--train-iters is required: how many iterations to train");
  if (given("--save-weights-experts") && command.saveWeights.empty())
    invalid("--save-weights-experts needs --save-weights FILE: the file "
            "whose experts it names; add it or remove "
            "--save-weights-experts");
  if (given("--save-interval") && command.options.save.empty())
    invalid("--save-interval needs --save DIR: the directory to save the "
            "checkpoints to");
  if (!given("--lr"))
    invalid("--lr is required: the peak learning rate (e.g. --lr 6e-4)");
  if (command.fp16) {
    LossScalerOptions scaling = command.lossScaler;
    scaling.staticScale = command.lossScale;
    command.options.lossScaling = scaling;
  }
  return command;
}

std::string trainUsage() {
  std::ostringstream s;
  s << "usage: megatron-train BUNDLE --data-path PATH --train-iters N --lr LR "
       "[flags]\n\n"
       "Trains a bundle written by megatron-compile with Megatron-LM's "
       "training loop, on\nthe CPU (--backend host, the default) or a GPU "
       "(--backend cuda), on a text file\n(tokenized by --tokenizer-type) or "
       "on .bin/.idx datasets written by\nmegatron-preprocess, sampled as "
       "Megatron-LM's GPTDataset.\n\nflags:\n";
  s << flagUsage(flags(), 30);
  s << "\nModel and layout flags (--micro-batch-size, "
       "--tensor-model-parallel-size, ...)\nare fixed at compile time: pass "
       "them to megatron-compile.\n"
       "\n--init-from and --save-weights exchange weights with Hugging "
       "Face's GPT-2\n(GPT2LMHeadModel, GPT2Model), Llama "
       "(LlamaForCausalLM), Qwen2 and Qwen3 by parameter\nname.\n";
  return s.str();
}

} // namespace mtrt::train
