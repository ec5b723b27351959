// megatron-train: trains a compiled bundle on a text corpus on the CPU or a GPU.
#include "comm/RankContext.h"
#include "comm/RankContext.h"
#include "comm/Rendezvous.h"
#if MTRT_HAVE_NCCL
#include "comm/NcclCommunicator.h"
#endif
#include "comm/RunRanks.h"
#include "core/Bundle.h"
#include "core/Safetensors.h"
#include "host/ParameterStore.h"
#include "train/ByteTokenizer.h"
#include "train/TrainFlags.h"
#include "train/Trainer.h"
#include "train/TrainingPlots.h"
#include "train/Weights.h"
#if MTRT_HAVE_CUDA
#include "cuda/Trainer.h"
#endif

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <chrono>
#include <optional>
#include <memory>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace {

std::string readCorpus(const std::string &path) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    throw mtrt::Error(MTRT_STATUS_NOT_FOUND,
                      "--data-path: cannot open '" + path + "' (" +
                          std::strerror(errno) +
                          "); give the path of a text file");
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad())
    throw mtrt::Error(MTRT_STATUS_DATA_LOSS,
                      "--data-path: reading '" + path + "' failed");
  return text.str();
}

/// Fails before training, not after it, when --save-weights could not be
/// written: a missing or unwritable directory, or a directory as the path.
void checkSaveWeightsPath(const std::string &path) {
  namespace fs = std::filesystem;
  fs::path file(path);
  fs::path dir =
      file.parent_path().empty() ? fs::path(".") : file.parent_path();
  std::error_code ec;
  if (fs::is_directory(file, ec))
    throw mtrt::Error(MTRT_STATUS_FAILED_PRECONDITION,
                      "--save-weights: '" + path +
                          "' is a directory; give a file path such as '" +
                          (file / "model.safetensors").string() + "'");
  if (!fs::is_directory(dir, ec))
    throw mtrt::Error(MTRT_STATUS_NOT_FOUND,
                      "--save-weights: the directory '" + dir.string() +
                          "' of '" + path +
                          "' does not exist; create it first");
  if (::access(dir.c_str(), W_OK) != 0)
    throw mtrt::Error(MTRT_STATUS_PERMISSION_DENIED,
                      "--save-weights: cannot write to the directory '" +
                          dir.string() + "' (" + std::strerror(errno) +
                          "); give a path in a writable directory");
}

/// What messages call --data-path's values.
std::string dataName(const mtrt::train::TrainCommand &command) {
  std::string name;
  for (const std::string &value : command.dataPath)
    name += (name.empty() ? "" : " ") + value;
  return name;
}

/// Fails before training when --plot-dir cannot be written.
void checkPlotDir(const std::string &dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw mtrt::Error(MTRT_STATUS_NOT_FOUND,
                      "--plot-dir: '" + dir +
                          "' is not a directory; create it first");
  if (::access(dir.c_str(), W_OK) != 0)
    throw mtrt::Error(MTRT_STATUS_PERMISSION_DENIED,
                      "--plot-dir: cannot write to '" + dir + "' (" +
                          std::strerror(errno) + ")");
}

/// Prefixes the flag to a file's error so that the user knows which file
/// it was.
[[noreturn]] void rethrowFor(const char *flag, const mtrt::Error &e) {
  throw mtrt::Error(e.code(), std::string(flag) + ": " + e.what());
}

#if MTRT_HAVE_CUDA
using GpuTrainer = mtrt::cuda::Trainer;

/// The GPU trainer of --backend cuda; MTRT_CUDA_TF32=1 allows TF32 GEMMs,
/// MTRT_CUDA_SYNC=1 synchronizes after every instruction (to name a
/// faulting kernel), MTRT_CUDA_PROFILE=1 prints train_step's time per op;
/// MTRT_CUDA_GEMM_TUNE=0 keeps cuBLASLt's heuristic algorithm untimed,
/// MTRT_CUDA_DETERMINISTIC_ATTENTION=1 sums flash attention's dq in a fixed
/// order (ContextOptions::deterministicAttention; the own kernels then),
/// MTRT_CUDA_CUDNN_ATTENTION=0 runs attention without dropout on the own
/// flash kernels instead of cuDNN's (ContextOptions::cudnnAttention),
/// MTRT_CUDA_HOPPER_ATTENTION=0 runs the flash forward and backward on the
/// own kernels instead of the Hopper ones (ContextOptions::hopperAttention),
/// MTRT_CUDA_BF16_VALUES=0 holds every floating value in fp32 under bf16
/// mixed precision (by default activations whose producer and readers all
/// take bf16 are held in bf16) and MTRT_CUDA_GRAPHS=0 or 1 runs the step
/// without or with a CUDA graph (ContextOptions::cudaGraphs's default);
/// --in-process-ranks' collectives run as kernels reading the peers'
/// buffers (ContextOptions::peerCollectives) and the multi-rank steps as
/// CUDA graphs (run() sets CUDA_MODULE_LOADING=EAGER and
/// CUDA_DEVICE_MAX_CONNECTIONS=32 unless they are set); MTRT_PEER_COLLECTIVES=0
/// stages the collectives through the host instead;
/// MTRT_CUDA_NCCL_GRAPHS=1 captures step functions whose collectives go
/// through NCCL in CUDA graphs too (ContextOptions::ncclGraphs);
/// MTRT_CUDA_PROFILER_ITERATION=N brackets iteration N with
/// cudaProfilerStart and cudaProfilerStop (ContextOptions::profilerIteration:
/// `ncu --profile-from-start off` sees that step's kernels only).
std::unique_ptr<GpuTrainer>
makeGpuTrainer(const mtrt::Bundle &bundle, const std::string &corpus,
               const mtrt::train::TrainCommand &c,
               mtrt::comm::RankContext *rank = nullptr, int deviceIndex = 0) {
  auto enabled = [](const char *name) {
    const char *value = std::getenv(name);
    return value && std::string(value) == "1";
  };
  mtrt::cuda::ContextOptions device;
  device.tf32 = enabled("MTRT_CUDA_TF32");
  device.syncEachInstruction = enabled("MTRT_CUDA_SYNC");
  device.profileInstructions = enabled("MTRT_CUDA_PROFILE_INSTRUCTIONS");
  device.profile = enabled("MTRT_CUDA_PROFILE") || device.profileInstructions;
  device.deterministicAttention = enabled("MTRT_CUDA_DETERMINISTIC_ATTENTION");
  auto disabled = [](const char *name) {
    const char *value = std::getenv(name);
    return value && std::string(value) == "0";
  };
  device.gemmTuning = !disabled("MTRT_CUDA_GEMM_TUNE");
  device.cudnnAttention = !disabled("MTRT_CUDA_CUDNN_ATTENTION");
  device.hopperAttention = !disabled("MTRT_CUDA_HOPPER_ATTENTION");
  device.bf16Values = !disabled("MTRT_CUDA_BF16_VALUES");
  device.peerCollectives = !disabled("MTRT_PEER_COLLECTIVES");
  device.ncclGraphs = enabled("MTRT_CUDA_NCCL_GRAPHS");
  if (enabled("MTRT_CUDA_GRAPHS") || disabled("MTRT_CUDA_GRAPHS"))
    device.cudaGraphs = enabled("MTRT_CUDA_GRAPHS");
  if (const char *iteration = std::getenv("MTRT_CUDA_PROFILER_ITERATION")) {
    char *end = nullptr;
    long long n = std::strtoll(iteration, &end, 10);
    if (end == iteration || *end != '\0' || n < 1)
      throw mtrt::Error(MTRT_STATUS_INVALID_ARGUMENT,
                        std::string("MTRT_CUDA_PROFILER_ITERATION='") +
                            iteration +
                            "': expected an iteration number from 1 (the "
                            "iteration the profiler sees)");
    device.profilerIteration = n;
  }
  device.device = deviceIndex;
  return std::make_unique<GpuTrainer>(bundle, corpus, dataName(c), c.options,
                                      device, rank);
}
#else
/// Stands in for mtrt::cuda::Trainer where the CUDA backend is not built;
/// makeGpuTrainer never makes one.
struct GpuTrainer {
  mtrt::train::Trainer &host() { std::abort(); }
  void uploadParametersFromHost() {}
  void train(std::ostream &) {}
  void copyParametersToHost() {}
  std::string sample(const std::string &, int64_t,
                     const mtrt::train::SamplingOptions &) {
    std::abort();
  }
};

std::unique_ptr<GpuTrainer> makeGpuTrainer(const mtrt::Bundle &,
                                           const std::string &,
                                           const mtrt::train::TrainCommand &,
                                           mtrt::comm::RankContext * = nullptr,
                                           int = 0) {
  throw mtrt::Error(MTRT_STATUS_UNAVAILABLE,
                    "--backend cuda: this megatron-train was built without "
                    "the CUDA backend; reconfigure the runtime with "
                    "-DMTRT_ENABLE_CUDA=ON, or use --backend host");
}
#endif

/// --init-from's file, opened (and its format checked) before any trainer
/// is built, so that a bad file fails fast; its tensors are checked against
/// the bundle when loaded. nullopt without the flag.
std::optional<mtrt::SafetensorsFile>
openInitFrom(const mtrt::train::TrainCommand &command) {
  if (command.initFrom.empty())
    return std::nullopt;
  try {
    return mtrt::SafetensorsFile::open(command.initFrom);
  } catch (const mtrt::Error &e) {
    rethrowFor("--init-from", e);
  }
}

/// Loads --init-from's `file` into `stores` (one store, or the stores of
/// some ranks: loadWeights' overloads) and, where `print`, says so.
template <typename Stores>
void loadInitFrom(const mtrt::SafetensorsFile &file, const mtrt::Bundle &bundle,
                  Stores &&stores, const mtrt::train::TrainCommand &command,
                  bool print) {
  mtrt::train::WeightsLoadReport report;
  try {
    report = mtrt::train::loadWeights(file, bundle, stores);
  } catch (const mtrt::Error &e) {
    rethrowFor("--init-from", e);
  }
  if (!print)
    return;
  std::cout << "loaded " << report.parameters << " parameters from '"
            << command.initFrom << "'";
  if (report.padded)
    std::cout << " (" << report.padded
              << " vocabulary tables padded with their initial rows)";
  if (report.expertBiasesKept)
    std::cout << " (" << report.expertBiasesKept
              << " expert biases not in the file start at zero)";
  std::cout << "\n";
}

/// --plot-dir's charts of the run's iterations (rank 0's, which holds the
/// same losses as every rank).
void drawPlots(const std::vector<mtrt::train::IterationRecord> &history,
               const std::string &dir) {
  for (const std::string &file : mtrt::train::writeTrainingPlots(history, dir))
    std::cout << "drew '" << file << "'\n";
}

/// --sample-tokens: the sample after training, printed to `out`: from the
/// GPU's parameters with `gpu` (predict_step on the device), else from
/// `trainer`'s. With several ranks, every rank calls it (a collective:
/// Trainer::sample).
void printSample(mtrt::train::Trainer &trainer, GpuTrainer *gpu,
                 const mtrt::train::TrainCommand &command, std::ostream &out) {
  if (!command.samplePrompt && trainer.corpus().empty())
    throw mtrt::Error(MTRT_STATUS_INVALID_ARGUMENT,
                      "--sample-tokens: give the text to continue with "
                      "--sample-prompt (the default, the corpus' first "
                      "bytes, needs a text --data-path)");
  std::string prompt = command.samplePrompt ? *command.samplePrompt
                                            : trainer.corpus().substr(0, 32);
  mtrt::train::SamplingOptions sampling = command.sampling;
  sampling.seed = command.options.seed;
  std::string text =
      gpu ? gpu->sample(prompt, command.sampleTokens, sampling)
          : trainer.sample(prompt, command.sampleTokens, sampling);
  std::ostringstream how;
  if (sampling.topK == 1)
    how << "greedy sample";
  else
    how << "sample (temperature " << sampling.temperature << ", top-k "
        << sampling.topK << ")";
  out << " " << how.str() << " (" << command.sampleTokens << " tokens) after "
      << command.options.trainIters << " iterations, prompt \""
      << mtrt::train::escapeForDisplay(prompt) << "\":\n"
      << mtrt::train::escapeForDisplay(text) << "\n";
}

/// --save-weights: the file from `store`. With several ranks (`rank`),
/// every rank calls it with its store (a collective: rank 0 gathers the
/// shards and writes the file).
void saveTrainedWeights(const mtrt::train::TrainCommand &command,
                        const mtrt::Bundle &bundle,
                        mtrt::comm::RankContext *rank,
                        const mtrt::host::ParameterStore &store) {
  try {
    mtrt::train::saveWeights(command.saveWeights, bundle, rank, store,
                             command.saveWeightsExperts);
  } catch (const mtrt::Error &e) {
    rethrowFor("--save-weights", e);
  }
  if (!rank || rank->rank() == 0)
    std::cout << "saved the weights to '" << command.saveWeights << "'\n";
}

/// --in-process-ranks: every rank of the bundle's grid as a thread, each
/// with its trainer; rank 0 logs. Throws the first rank's own error (not
/// the aborts it caused on the others).
void trainInProcessRanks(const mtrt::Bundle &bundle, const std::string &corpus,
                         const mtrt::train::TrainCommand &command) {
  if (!bundle.hasGrid())
    throw mtrt::Error(MTRT_STATUS_INVALID_ARGUMENT,
                      "--in-process-ranks: bundle '" + bundle.name() +
                          "' has no grid (it is compiled for one rank); "
                          "train it without --in-process-ranks");
  if (!command.saveWeights.empty()) {
    checkSaveWeightsPath(command.saveWeights);
    mtrt::train::checkExpertNames(bundle, command.saveWeightsExperts);
  }
  std::optional<mtrt::SafetensorsFile> weights = openInitFrom(command);
  if (command.sampleTokens > 0)
    if (std::string refusal = mtrt::train::samplingRefusal(bundle);
        !refusal.empty())
      throw mtrt::Error(MTRT_STATUS_UNIMPLEMENTED, refusal);
  int ranks = static_cast<int>(bundle.rankCount());
  mtrt::comm::InProcessWorld world(ranks);
  // The ranks share the machine's cores.
  mtrt::train::TrainerOptions options = command.options;
  if (options.threads == 0)
    options.threads = std::max(1u, std::thread::hardware_concurrency() /
                                       static_cast<unsigned>(ranks));
  // --init-from: rank 0 writes every rank's shards from the file's whole
  // tensors, in place, while the other ranks wait at a barrier.
  std::vector<mtrt::host::ParameterStore *> stores(static_cast<size_t>(ranks));
  std::vector<std::exception_ptr> errors =
      mtrt::comm::runRanks(world, [&](mtrt::comm::Communicator &c) {
        mtrt::comm::RankContext rank(c, bundle.gridShape());
        std::ostringstream discarded;
        std::ostream &out = c.rank() == 0 ? std::cout : discarded;
        // --backend cuda: every rank on GPU 0, each with its own stream.
        std::unique_ptr<GpuTrainer> gpu;
        std::unique_ptr<mtrt::train::Trainer> hostTrainer;
        if (command.backend == "cuda")
          gpu = makeGpuTrainer(bundle, corpus, command, &rank);
        else
          hostTrainer = std::make_unique<mtrt::train::Trainer>(
              bundle, corpus, dataName(command), options, &rank);
        mtrt::train::Trainer &trainer = gpu ? gpu->host() : *hostTrainer;
        stores[static_cast<size_t>(c.rank())] = &trainer.parameters();
        if (weights) {
          c.barrier({"stores ready for --init-from", -1});
          if (c.rank() == 0)
            loadInitFrom(*weights, bundle, stores, command, /*print=*/true);
          c.barrier({"--init-from read", -1});
          if (gpu)
            gpu->uploadParametersFromHost();
        }
        if (gpu) {
          gpu->train(out);
          gpu->copyParametersToHost();
        } else {
          hostTrainer->train(out);
        }
        if (c.rank() == 0 && !command.plotDir.empty())
          drawPlots(gpu ? gpu->history() : trainer.history(), command.plotDir);
        if (command.sampleTokens > 0)
          printSample(trainer, gpu.get(), command, out);
        if (!command.saveWeights.empty())
          saveTrainedWeights(command, bundle, &rank, trainer.parameters());
      });
  std::exception_ptr first;
  for (const std::exception_ptr &error : errors) {
    if (!error)
      continue;
    try {
      std::rethrow_exception(error);
    } catch (const mtrt::Error &e) {
      if (e.code() != MTRT_STATUS_ABORTED) {
        first = error;
        break;
      }
    } catch (...) {
      first = error;
      break;
    }
    if (!first)
      first = error;
  }
  if (first)
    std::rethrow_exception(first);
}

/// A launch of several processes (torchrun's or an MPI launcher's
/// variables, WORLD_SIZE > 1): this process trains its rank of the bundle's
/// grid on CUDA device LOCAL_RANK, its collectives through NCCL (rank 0
/// serves the rendezvous on MASTER_ADDR:MASTER_PORT); rank 0 logs. An NCCL
/// error or a collective longer than --collective-timeout aborts the
/// communicator and ends the process naming the rank, the call and the step.
/// Returns false for a single-process run.
bool trainLaunchedRank(const mtrt::Bundle &bundle, const std::string &corpus,
                       const mtrt::train::TrainCommand &command) {
  std::optional<mtrt::comm::LaunchEnvironment> launch =
      mtrt::comm::readLaunchEnvironment();
  if (!launch || launch->worldSize <= 1)
    return false;
  std::string who = "this process is rank " + std::to_string(launch->rank) +
                    " of " + std::to_string(launch->worldSize) + " (" +
                    launch->launcher + " variables)";
  if (command.backend != "cuda")
    throw mtrt::Error(MTRT_STATUS_UNIMPLEMENTED,
                      who + "; a multi-process run needs --backend cuda (its "
                            "ranks talk through NCCL); on the CPU run one "
                            "process with --in-process-ranks");
  if (bundle.rankCount() != launch->worldSize)
    throw mtrt::Error(
        MTRT_STATUS_INVALID_ARGUMENT,
        who + ", and bundle '" + bundle.name() + "' is compiled for " +
            std::to_string(bundle.rankCount()) +
            " rank(s); start as many processes as the bundle has ranks, or "
            "recompile it for " +
            std::to_string(launch->worldSize) + " ranks");
  if (!command.saveWeights.empty()) {
    // Rank 0 writes the file.
    if (launch->rank == 0)
      checkSaveWeightsPath(command.saveWeights);
    mtrt::train::checkExpertNames(bundle, command.saveWeightsExperts);
  }
  if (command.sampleTokens > 0)
    if (std::string refusal = mtrt::train::samplingRefusal(bundle);
        !refusal.empty())
      throw mtrt::Error(MTRT_STATUS_UNIMPLEMENTED, who + "; " + refusal);
  // Each process checks the file and cuts its own shards from it.
  std::optional<mtrt::SafetensorsFile> weights = openInitFrom(command);
#if MTRT_HAVE_NCCL
  mtrt::comm::NcclOptions options;
  options.collectiveTimeout = std::chrono::milliseconds(
      static_cast<int64_t>(command.collectiveTimeout * 1000));
  options.exitOnFailure = true;
  std::unique_ptr<mtrt::comm::NcclCommunicator> world =
      mtrt::comm::NcclCommunicator::create(*launch, options);
  mtrt::comm::RankContext rank(*world, bundle.gridShape());
  std::unique_ptr<GpuTrainer> gpu =
      makeGpuTrainer(bundle, corpus, command, &rank, launch->localRank);
  if (weights) {
    loadInitFrom(
        *weights, bundle,
        std::vector<mtrt::host::ParameterStore *>{&gpu->host().parameters()},
        command, /*print=*/launch->rank == 0);
    gpu->uploadParametersFromHost();
  }
  std::ostringstream discarded;
  gpu->train(launch->rank == 0 ? std::cout : discarded);
  if (launch->rank == 0 && !command.plotDir.empty())
    drawPlots(gpu->history(), command.plotDir);
  if (command.sampleTokens > 0)
    printSample(gpu->host(), gpu.get(), command,
                launch->rank == 0 ? std::cout : discarded);
  if (!command.saveWeights.empty())
    gpu->copyParametersToHost();
  if (!command.saveWeights.empty())
    saveTrainedWeights(command, bundle, &rank, gpu->host().parameters());
  return true;
#else
  (void)corpus;
  throw mtrt::Error(MTRT_STATUS_UNAVAILABLE,
                    who + "; this megatron-train was built without NCCL "
                          "(it needs the CUDA backend and nccl.h)");
#endif
}

int run(int argc, char **argv) {
  using namespace mtrt::train;
  TrainCommand command =
      parseTrainCommand(std::vector<std::string>(argv + 1, argv + argc));
  if (command.help) {
    std::cout << trainUsage();
    return 0;
  }
  checkPrecisionFlags(command);
  if (!command.plotDir.empty())
    checkPlotDir(command.plotDir);
  // A text file is read whole (and tokenized by the trainer); indexed
  // datasets are mapped by the trainer.
  std::string corpus;
  if (dataPathIsIndexed(command.dataPath))
    command.options.dataBlend = mtrt::data::parseDataBlend(command.dataPath);
  else
    corpus = readCorpus(command.dataPath[0]);
  mtrt::Bundle bundle = mtrt::Bundle::load(command.bundlePath);
  if (bundle.hasModel())
    checkPrecisionMatchesBundle(command, command.bundlePath,
                                bundle.model().precision);
  if (command.inProcessRanks) {
    // Read when CUDA starts (the first trainer); a value set stays.
    // PeerGroup's barrier kernels in CUDA graphs need every module loaded
    // up front and a hardware work queue for each of the ranks' streams
    // (two a rank; CUDA gives 8 queues by default, 32 at most): otherwise
    // the executors run those functions without graphs
    // (cuda/PeerCollective.h; docs/Parallelism.md, "In-process ranks on
    // one GPU").
    const char *peer = std::getenv("MTRT_PEER_COLLECTIVES");
    if (command.backend == "cuda" && !(peer && std::string(peer) == "0")) {
      setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
      setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
    }
    trainInProcessRanks(bundle, corpus, command);
    return 0;
  }
  if (trainLaunchedRank(bundle, corpus, command))
    return 0;
  if (!command.saveWeights.empty()) {
    checkSaveWeightsPath(command.saveWeights);
    mtrt::train::checkExpertNames(bundle, command.saveWeightsExperts);
  }
  std::optional<mtrt::SafetensorsFile> weights = openInitFrom(command);
  // --backend cuda: the GPU trainer is built on a host trainer (checks,
  // initialization, sampling), which the rest of this function sees.
  std::unique_ptr<GpuTrainer> gpu;
  if (command.backend == "cuda")
    gpu = makeGpuTrainer(bundle, corpus, command);
  std::unique_ptr<Trainer> hostTrainer;
  if (!gpu)
    hostTrainer = std::make_unique<Trainer>(bundle, corpus, dataName(command),
                                            command.options);
  Trainer &trainer = gpu ? gpu->host() : *hostTrainer;
  if (weights) {
    loadInitFrom(*weights, bundle, trainer.parameters(), command,
                 /*print=*/true);
    if (gpu)
      gpu->uploadParametersFromHost();
  }
  if (gpu)
    gpu->train(std::cout);
  else
    trainer.train(std::cout);
  if (gpu)
    gpu->copyParametersToHost();
  if (!command.saveWeights.empty())
    saveTrainedWeights(command, bundle, nullptr, trainer.parameters());
  if (!command.plotDir.empty())
    drawPlots(gpu ? gpu->history() : trainer.history(), command.plotDir);
  if (command.sampleTokens > 0)
    printSample(trainer, gpu.get(), command, std::cout);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const mtrt::Error &e) {
    std::cout.flush();
    std::cerr << "megatron-train: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc &) {
    std::cout.flush();
    std::cerr << "megatron-train: error: out of memory; use a smaller model "
                 "or global batch\n";
    return 1;
  } catch (const std::exception &e) {
    std::cout.flush();
    std::cerr << "megatron-train: internal error: " << e.what() << "\n";
    return 2;
  }
}
