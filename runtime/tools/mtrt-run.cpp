// mtrt-run: runs one function of a bundle once and prints its outputs, or
// checks train_step's gradients against finite differences in float64.
#include "core/AttentionViews.h"
#include "core/Bundle.h"
#include "core/CommandLine.h"
#include "core/Random.h"
#include "core/Safetensors.h"
#include "core/ScratchPlan.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/Weights.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using mtrt::DType;
using mtrt::Error;
namespace host = mtrt::host;

/// Streams of the counter-based generator for this tool's random draws,
/// apart from those of initialization (parameter indices) and dropout.
constexpr uint64_t kInputStream = 0x6d7472742d696e00ull;  // "mtrt-in"
constexpr uint64_t kSampleStream = 0x6d7472742d676300ull; // "mtrt-gc"

[[noreturn]] void invalid(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

struct Options {
  std::string bundlePath;
  std::string function;
  bool fp64 = false;
  uint64_t seed = 1234;
  std::string initFrom;
  std::string inputsPath;
  uint64_t firstSample = 0;
  std::optional<int64_t> intMax;
  bool summary = false;
  unsigned threads = 0;

  bool gradcheck = false;
  bool checkCudaPlan = false;
  double tolerance = 1e-6;
  int64_t maxElements = 0; // 0: every element
  int stencil = 5;
  std::optional<double> fdStep;

  bool help = false;
};

double parsePositive(const std::string &flag, const std::string &text) {
  errno = 0;
  char *end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE ||
      !std::isfinite(value) || !(value > 0))
    invalid(flag + ": found '" + text + "', expected a number > 0");
  return value;
}

using Flag = mtrt::Flag<Options>;

const std::vector<Flag> &flags() {
  using O = Options;
  using S = const std::string &;
  static const std::vector<Flag> table = {
      {"--function", "NAME",
       "the function to run: train_step, eval_step, predict_step, ...",
       [](O &o, S, S v) { o.function = v; }},
      {"--fp64", nullptr, "compute every floating value in float64",
       [](O &o, S, S) { o.fp64 = true; }},
      {"--seed", "S",
       "seed of the parameters' initialization and of random inputs "
       "(default 1234, megatron-train's)",
       [](O &o, S f, S v) {
         o.seed = static_cast<uint64_t>(mtrt::parseIntFlag(f, v, 0));
       }},
      {"--init-from", "FILE",
       "after initialization, load the parameters from a safetensors file "
       "(Hugging Face's names)",
       [](O &o, S, S v) { o.initFrom = v; }},
      {"--inputs", "FILE",
       "the function's inputs: one line per input, its elements in row-major "
       "order separated by spaces (default: seeded random integers in "
       "[0, --int-max))",
       [](O &o, S, S v) { o.inputsPath = v; }},
      {"--int-max", "N",
       "random integer inputs are below N (default: the model's vocab_size, "
       "or 2 without a model section)",
       [](O &o, S f, S v) { o.intMax = mtrt::parseIntFlag(f, v, 1); }},
      {"--first-sample", "N",
       "the consumed-sample index of the batch's row 0, which keys the "
       "dropout masks (default 0)",
       [](O &o, S f, S v) {
         o.firstSample = static_cast<uint64_t>(mtrt::parseIntFlag(f, v, 0));
       }},
      {"--summary", nullptr,
       "print each output's sum, min and max instead of its values",
       [](O &o, S, S) { o.summary = true; }},
      {"--threads", "N", "CPU threads (default: all hardware threads)",
       [](O &o, S f, S v) {
         o.threads = static_cast<unsigned>(mtrt::parseIntFlag(f, v, 1));
       }},
      {"--gradcheck", nullptr,
       "check train_step's gradients against finite differences of its "
       "loss, in float64",
       [](O &o, S, S) { o.gradcheck = true; }},
      {"--check-cuda-plan", nullptr,
       "check, without a GPU, that every function's memory plan gives the "
       "CUDA backend each block it needs (as its executor does at load "
       "time), print one line per function and run nothing",
       [](O &o, S, S) { o.checkCudaPlan = true; }},
      {"--tolerance", "T",
       "--gradcheck fails (exit 1) when a parameter's relative error is "
       "above T (default 1e-6)",
       [](O &o, S f, S v) { o.tolerance = parsePositive(f, v); }},
      {"--max-elements", "N",
       "--gradcheck checks at most N seeded-random elements per parameter "
       "(default 0: all)",
       [](O &o, S f, S v) { o.maxElements = mtrt::parseIntFlag(f, v, 0); }},
      {"--stencil", "3|5",
       "--gradcheck's finite differences: central (3 points) or the "
       "five-point stencil (default 5)",
       [](O &o, S f, S v) {
         if (v != "3" && v != "5")
           invalid(f + ": found '" + v + "', expected 3 or 5");
         o.stencil = v == "3" ? 3 : 5;
       }},
      {"--fd-step", "H",
       "--gradcheck's step h (default 5e-4 for 5 points, 1e-6 for 3)",
       [](O &o, S f, S v) { o.fdStep = parsePositive(f, v); }},
      {"--help", nullptr, "print this help and exit",
       [](O &o, S, S) { o.help = true; }},
  };
  return table;
}

std::string usage() {
  std::ostringstream s;
  s << "usage: mtrt-run BUNDLE --function NAME [flags]\n"
       "       mtrt-run BUNDLE --gradcheck [flags]\n\n"
       "Runs one function of a bundle once on the CPU (host backend) and "
       "prints each\noutput: a line 'output I: SHAPE DTYPE', then its values "
       "in row-major order,\none per line (%.17g), or with --summary its "
       "sum, min and max.\n\n"
       "--gradcheck runs train_step in float64, then compares each "
       "parameter's\naccumulated gradient with finite differences of the "
       "loss with the same masks\n(dropout masks depend only on the seed, "
       "the sample and the position), printing\nthe norm-wise relative error "
       "||analytic - numeric|| / ||numeric|| per parameter\nand exiting 1 "
       "when the largest is above --tolerance.\n\nflags:\n";
  s << mtrt::flagUsage(flags(), 22);
  return s.str();
}

Options parseOptions(const std::vector<std::string> &args) {
  Options o;
  mtrt::ParsedCommandLine parsed =
      mtrt::parseCommandLine(args, flags(), o, [](const std::string &name) {
        invalid(mtrt::unknownFlagMessage(name, mtrt::flagNames(flags()),
                                         "mtrt-run"));
      });
  o.help |= parsed.shortHelp;
  if (o.help)
    return o;
  const std::vector<std::string> &positional = parsed.positional;
  if (positional.size() != 1)
    invalid(positional.empty()
                ? "no bundle given: mtrt-run BUNDLE --function NAME, or "
                  "mtrt-run BUNDLE --gradcheck"
                : "expected one bundle, found " +
                      std::to_string(positional.size()) + " arguments: '" +
                      positional[0] + "', '" + positional[1] + "'...");
  o.bundlePath = positional[0];
  if (o.checkCudaPlan)
    return o;
  if (o.gradcheck) {
    if (!o.function.empty() && o.function != "train_step")
      invalid("--gradcheck checks train_step; leave --function " + o.function +
              " out");
    o.function = "train_step";
    o.fp64 = true;
  } else if (o.function.empty()) {
    invalid("--function is required: the function to run (e.g. --function "
            "eval_step), or pass --gradcheck");
  }
  return o;
}

/// One input of the function, owned.
host::Tensor makeInput(const host::Executor &executor, size_t i,
                       const std::vector<std::string> *line, int64_t lineNo,
                       const Options &o, int64_t intMax) {
  const mtrt::Function &fn = executor.function();
  int64_t v = fn.inputs[i];
  const mtrt::TensorType &type = fn.values[v];
  DType dtype = executor.storageType(v);
  host::Tensor t(dtype, type.shape);
  int64_t n = t.numElements();
  std::string what = "input " + std::to_string(i) + " (" + type.str() + ")";
  if (line && static_cast<int64_t>(line->size()) != n)
    invalid("--inputs '" + o.inputsPath + "': line " + std::to_string(lineNo) +
            ", " + what + ", has " + std::to_string(line->size()) +
            " values, expected " + std::to_string(n));
  for (int64_t k = 0; k < n; ++k) {
    if (mtrt::isFloatingPoint(dtype)) {
      double x;
      if (line) {
        const std::string &text = (*line)[k];
        char *end = nullptr;
        errno = 0;
        x = std::strtod(text.c_str(), &end);
        if (*end != '\0' || errno == ERANGE)
          invalid("--inputs '" + o.inputsPath + "': line " +
                  std::to_string(lineNo) + ", " + what + ", value " +
                  std::to_string(k) + ": found '" + text +
                  "', expected a number");
      } else {
        x = mtrt::random::normal(o.seed, kInputStream + i,
                                 static_cast<uint64_t>(k));
      }
      if (dtype == DType::F64)
        t.data<double>()[k] = x;
      else
        t.data<float>()[k] = static_cast<float>(x);
    } else {
      int64_t x;
      if (line) {
        const std::string &text = (*line)[k];
        char *end = nullptr;
        errno = 0;
        long long parsed = std::strtoll(text.c_str(), &end, 10);
        bool fits = dtype == DType::I64 ||
                    (parsed >= std::numeric_limits<int32_t>::min() &&
                     parsed <= std::numeric_limits<int32_t>::max());
        if (*end != '\0' || errno == ERANGE || !fits)
          invalid("--inputs '" + o.inputsPath + "': line " +
                  std::to_string(lineNo) + ", " + what + ", value " +
                  std::to_string(k) + ": found '" + text +
                  "', expected an integer of type " + mtrt::dtypeName(dtype));
        x = parsed;
      } else {
        x = static_cast<int64_t>(
            mtrt::random::randomBits(o.seed, kInputStream + i,
                                     static_cast<uint64_t>(k)) %
            static_cast<uint64_t>(intMax));
      }
      if (dtype == DType::I64)
        t.data<int64_t>()[k] = x;
      else
        t.data<int32_t>()[k] = static_cast<int32_t>(x);
    }
  }
  return t;
}

/// The function's inputs, from --inputs or seeded random.
std::vector<host::Tensor> makeInputs(const mtrt::Bundle &bundle,
                                     const host::Executor &executor,
                                     const Options &o) {
  const mtrt::Function &fn = executor.function();
  int64_t intMax = o.intMax                       ? *o.intMax
                   : bundle.model().vocabSize > 0 ? bundle.model().vocabSize
                                                  : 2;
  std::vector<std::vector<std::string>> lines;
  std::vector<int64_t> lineNumbers;
  if (!o.inputsPath.empty()) {
    std::ifstream file(o.inputsPath);
    if (!file)
      throw Error(MTRT_STATUS_NOT_FOUND, "--inputs: cannot open '" +
                                             o.inputsPath + "' (" +
                                             std::strerror(errno) + ")");
    std::string text;
    for (int64_t number = 1; std::getline(file, text); ++number) {
      std::istringstream words(text);
      std::vector<std::string> line;
      for (std::string word; words >> word;)
        line.push_back(word);
      if (line.empty() || line[0][0] == '#')
        continue;
      lines.push_back(std::move(line));
      lineNumbers.push_back(number);
    }
    if (lines.size() != fn.inputs.size())
      invalid("--inputs '" + o.inputsPath + "': found " +
              std::to_string(lines.size()) + " non-blank lines, expected " +
              std::to_string(fn.inputs.size()) + ", one per input of " +
              fn.name);
  }
  std::vector<host::Tensor> inputs;
  for (size_t i = 0; i < fn.inputs.size(); ++i)
    inputs.push_back(makeInput(executor, i, lines.empty() ? nullptr : &lines[i],
                               lines.empty() ? 0 : lineNumbers[i], o, intMax));
  return inputs;
}

std::vector<host::TensorView> viewsOf(const std::vector<host::Tensor> &inputs) {
  std::vector<host::TensorView> views;
  for (const host::Tensor &t : inputs)
    views.push_back({t.dtype, t.shape, t.buffer.data()});
  return views;
}

double element(const host::Tensor &t, int64_t k) {
  switch (t.dtype) {
  case DType::F64:
    return t.data<double>()[k];
  case DType::F32:
    return t.data<float>()[k];
  case DType::I64:
    return static_cast<double>(t.data<int64_t>()[k]);
  default:
    return t.data<int32_t>()[k];
  }
}

void printOutputs(const std::vector<host::Tensor> &outputs, bool summary) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const host::Tensor &t = outputs[i];
    std::printf("output %zu: %s %s\n", i, mtrt::shapeString(t.shape).c_str(),
                mtrt::dtypeName(t.dtype));
    int64_t n = t.numElements();
    bool isInt = t.dtype == DType::I32 || t.dtype == DType::I64;
    if (summary) {
      double sum = 0, lo = std::numeric_limits<double>::infinity(), hi = -lo;
      for (int64_t k = 0; k < n; ++k) {
        double x = element(t, k);
        sum += x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      std::printf("sum %.17g min %.17g max %.17g\n", sum, lo, hi);
    } else {
      for (int64_t k = 0; k < n; ++k) {
        if (t.dtype == DType::I64)
          std::printf("%" PRId64 "\n", t.data<int64_t>()[k]);
        else if (isInt)
          std::printf("%" PRId32 "\n", t.data<int32_t>()[k]);
        else
          std::printf("%.17g\n", element(t, k));
      }
    }
  }
}

/// The element indices of a parameter of `n` elements to check: all, or
/// `max` distinct ones drawn by a partial Fisher-Yates shuffle keyed on
/// (seed, parameter), in increasing order.
std::vector<int64_t> chooseElements(int64_t n, int64_t max, uint64_t seed,
                                    size_t parameter) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k)
    all[k] = k;
  if (max == 0 || n <= max)
    return all;
  for (int64_t j = 0; j < max; ++j) {
    uint64_t r = mtrt::random::randomBits(seed, kSampleStream + parameter,
                                          static_cast<uint64_t>(j));
    int64_t pick = j + static_cast<int64_t>(r % static_cast<uint64_t>(n - j));
    std::swap(all[j], all[pick]);
  }
  all.resize(static_cast<size_t>(max));
  std::sort(all.begin(), all.end());
  return all;
}

void loadInitFrom(const Options &o, const mtrt::Bundle &bundle,
                  host::ParameterStore &store) {
  if (o.initFrom.empty())
    return;
  try {
    mtrt::SafetensorsFile file = mtrt::SafetensorsFile::open(o.initFrom);
    mtrt::train::loadWeights(file, bundle, store);
  } catch (const Error &e) {
    throw Error(e.code(), std::string("--init-from: ") + e.what());
  }
}

int runFunction(const mtrt::Bundle &bundle, const Options &o) {
  host::ThreadPool pool(o.threads);
  host::ParameterStore store(bundle, o.fp64 ? DType::F64 : DType::F32);
  store.initialize(pool, o.seed);
  loadInitFrom(o, bundle, store);
  host::Executor executor(bundle, o.function, store, pool);
  std::vector<host::Tensor> inputs = makeInputs(bundle, executor, o);
  printOutputs(executor.run(viewsOf(inputs), {0, o.firstSample}), o.summary);
  return 0;
}

int gradcheck(const mtrt::Bundle &bundle, const Options &o) {
  host::ThreadPool pool(o.threads);
  host::ParameterStore store(bundle, DType::F64);
  store.initialize(pool, o.seed);
  loadInitFrom(o, bundle, store);
  host::Executor executor(bundle, "train_step", store, pool);
  const mtrt::Function &fn = executor.function();
  if (fn.outputs.empty() || fn.values[fn.outputs[0]].rank() != 0 ||
      !mtrt::isFloatingPoint(fn.values[fn.outputs[0]].dtype))
    invalid("bundle '" + bundle.name() +
            "': train_step's first output is not a scalar loss; "
            "--gradcheck needs one");
  std::vector<host::Tensor> inputs = makeInputs(bundle, executor, o);
  std::vector<host::TensorView> views = viewsOf(inputs);

  // Every run accumulates into the gradient buffers: start each from zero
  // so that the first run's buffers hold exactly its gradient.
  auto loss = [&]() {
    store.zeroGradients(pool);
    std::vector<host::Tensor> outputs = executor.run(views, {0, o.firstSample});
    double l = outputs[0].data<double>()[0];
    if (!std::isfinite(l))
      throw Error(MTRT_STATUS_ABORTED,
                  "gradcheck: train_step's loss is " + std::to_string(l) +
                      "; check the inputs and the weights");
    return l;
  };
  double loss0 = loss();
  std::vector<std::vector<double>> analytic(store.size());
  for (size_t i = 0; i < store.size(); ++i) {
    const double *g = store.gradient(i).data<double>();
    analytic[i].assign(g, g + store.gradient(i).numElements());
  }

  double h = o.fdStep ? *o.fdStep : o.stencil == 5 ? 5e-4 : 1e-6;
  std::printf("gradcheck: train_step of '%s' in float64 at sample %" PRIu64
              ", seed %" PRIu64 ": loss %.17g; %s differences, h %g\n",
              bundle.name().c_str(), o.firstSample, o.seed, loss0,
              o.stencil == 5 ? "five-point" : "central", h);
  std::fflush(stdout);

  double maxError = 0;
  bool anyNaN = false;
  size_t checked = 0;
  for (size_t i = 0; i < store.size(); ++i) {
    // An expert bias only selects experts: nothing differentiates it, and
    // its gradient buffer holds tokens per expert.
    if (store.info(i).isExpertBias()) {
      std::printf("gradcheck %s: an expert bias, not differentiated: "
                  "skipped\n",
                  store.info(i).name.c_str());
      continue;
    }
    ++checked;
    host::Tensor &value = store.value(i);
    double *x = value.data<double>();
    std::vector<int64_t> elements =
        chooseElements(value.numElements(), o.maxElements, o.seed, i);
    double diffSquares = 0, numericSquares = 0;
    for (int64_t k : elements) {
      const double x0 = x[k];
      auto at = [&](double offset) {
        x[k] = x0 + offset;
        return loss();
      };
      double numeric;
      if (o.stencil == 5)
        numeric = (at(-2 * h) - 8 * at(-h) + 8 * at(h) - at(2 * h)) / (12 * h);
      else
        numeric = (at(h) - at(-h)) / (2 * h);
      x[k] = x0;
      double d = analytic[i][k] - numeric;
      diffSquares += d * d;
      numericSquares += numeric * numeric;
    }
    double error = numericSquares > 0 ? std::sqrt(diffSquares / numericSquares)
                   : diffSquares > 0  ? std::numeric_limits<double>::infinity()
                                      : 0.0;
    anyNaN |= std::isnan(error);
    maxError = std::max(maxError, error);
    std::printf("gradcheck %s: relative error %.3e (%zu elements)\n",
                store.info(i).name.c_str(), error, elements.size());
    std::fflush(stdout);
  }
  std::printf("gradcheck: max relative error %.3e over %zu parameters\n",
              anyNaN ? std::nan("") : maxError, checked);
  if (anyNaN || maxError > o.tolerance) {
    std::printf("gradcheck: FAILED: above the tolerance %g\n", o.tolerance);
    return 1;
  }
  std::printf("gradcheck: passed (tolerance %g)\n", o.tolerance);
  return 0;
}

int run(int argc, char **argv) {
  Options o = parseOptions(std::vector<std::string>(argv + 1, argv + argc));
  if (o.help) {
    std::cout << usage();
    return 0;
  }
  mtrt::Bundle bundle = mtrt::Bundle::load(o.bundlePath);
  if (o.checkCudaPlan) {
    for (const mtrt::Function &fn : bundle.functions()) {
      if (!fn.memoryPlan) {
        std::cout << fn.name << ": no memory plan (backends lay out their "
                                "own arena)\n";
        continue;
      }
      bool workspace = false;
      mtrt::checkCudaMemoryPlan(bundle, fn, workspace);
      mtrt::ScratchPlan scratch = mtrt::planScratch(
          fn, bundle.hasModel() && bundle.model().precision == "bf16",
          workspace);
      uint64_t blocks = 0;
      for (uint64_t bytes : scratch.bytes)
        blocks += bytes > 0;
      size_t paired = 0, held = 0;
      for (size_t i = 0; i < fn.instructions.size(); ++i)
        if (fn.instructions[i].op == mtrt::Op::Attention &&
            scratch.attentionPartner[i] != mtrt::ScratchPlan::kNoPartner) {
          ++paired;
          held += scratch.outputHeld[i];
        }
      mtrt::AttentionViewLayout views = mtrt::readAttentionViews(
          fn, bundle.hasModel() && bundle.model().precision == "bf16");
      size_t elided = static_cast<size_t>(
          std::count(views.elided.begin(), views.elided.end(), true));
      std::cout << fn.name << ": the plan covers the CUDA backend ("
                << fn.memoryPlan->arenaBytes << " bytes, " << blocks
                << " kernel blocks, "
                << (workspace ? "cuBLASLt's workspace in the GEMMs' blocks"
                              : "no GEMM workspace in the plan")
                << ", "
                << (fn.memoryPlan->hasViews
                        ? std::to_string(views.views) + " views in " +
                              std::to_string(views.groups) + " groups, " +
                              std::to_string(elided) + " copies elided"
                        : std::string("attention views left to the backend"))
                << ", " << held << " of " << paired
                << " attention outputs held for their gradients)\n";
    }
    return 0;
  }
  return o.gradcheck ? gradcheck(bundle, o) : runFunction(bundle, o);
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const Error &e) {
    std::fflush(stdout);
    std::cerr << "mtrt-run: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc &) {
    std::fflush(stdout);
    std::cerr << "mtrt-run: error: out of memory\n";
    return 1;
  } catch (const std::exception &e) {
    std::fflush(stdout);
    std::cerr << "mtrt-run: internal error: " << e.what() << "\n";
    return 2;
  }
}
