//===- megatron-compile.cpp - Model file in, model-level IR and reports out ===//
//
// Thin: flags in, library calls out. Every key of the model file is also a
// flag with Megatron-LM's name (`--tensor-model-parallel-size 2`), which
// overrides the file.
//
//===----------------------------------------------------------------------===//

#include "megatron/Frontend/CompileConfig.h"
#include "megatron/Frontend/ModelBuilder.h"
#include "megatron/InitAll.h"
#include "mt/Transforms/Passes.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

#include <memory>
#include <vector>

using namespace llvm;
using namespace megatron;

static cl::OptionCategory compileCategory("megatron-compile options");
static cl::OptionCategory modelCategory(
    "Model-file keys (each overrides the file; see models/README.md)");

static cl::opt<std::string> inputPath(cl::Positional, cl::Required,
                                      cl::desc("<model.yaml | config.json>"),
                                      cl::cat(compileCategory));
static cl::opt<std::string> outputPath("o", cl::desc("Output file"),
                                       cl::value_desc("file"), cl::init("-"),
                                       cl::cat(compileCategory));

enum class EmitKind { None, Mlir };
static cl::opt<EmitKind> emit(
    "emit", cl::desc("Print a stage of the compilation"),
    cl::values(clEnumValN(EmitKind::Mlir, "mlir",
                          "the model-level (mt) IR: parameters, train_step "
                          "and eval_step")),
    cl::init(EmitKind::None), cl::cat(compileCategory));

enum class ReportKind { None, Params };
static cl::opt<ReportKind> report(
    "report", cl::desc("Print a table about the compiled model"),
    cl::values(clEnumValN(ReportKind::Params, "params",
                          "parameters: names, global shapes, counts, init")),
    cl::init(ReportKind::None), cl::cat(compileCategory));

static int fail(const Twine &message) {
  WithColor::error(errs(), "megatron-compile") << message << "\n";
  return 1;
}

int main(int argc, char **argv) {
  InitLLVM initLLVM(argc, argv);

  // One flag per model-file key, named as Megatron-LM names its arguments.
  std::vector<std::unique_ptr<cl::opt<std::string>>> keyFlags;
  std::vector<std::string> flagNames;
  for (const ConfigKeyInfo &key : getConfigKeys()) {
    std::string flag = key.key.str();
    std::replace(flag.begin(), flag.end(), '_', '-');
    flagNames.push_back(flag);
  }
  // Boolean keys are switches, as in Megatron-LM (`--sequence-parallel`); a
  // value (`--sequence-parallel=false`) is still accepted.
  for (auto [key, flag] : llvm::zip(getConfigKeys(), flagNames))
    keyFlags.push_back(std::make_unique<cl::opt<std::string>>(
        StringRef(flag), cl::desc(key.help), cl::value_desc("value"),
        key.kind == ConfigValueKind::Boolean ? cl::ValueOptional
                                             : cl::ValueRequired,
        cl::cat(modelCategory)));

  cl::HideUnrelatedOptions({&compileCategory, &modelCategory});
  cl::ParseCommandLineOptions(
      argc, argv,
      "megatron-compile: compiles a model file (YAML, or a Hugging Face "
      "config.json) for training\n");

  if (emit == EmitKind::None && report == ReportKind::None)
    return fail("nothing to do: give --emit mlir or --report params (writing "
                "a training bundle is not implemented yet)");

  Expected<CompileConfig> config = loadCompileConfig(inputPath);
  if (!config)
    return fail(toString(config.takeError()));
  for (auto [key, flag] : llvm::zip(getConfigKeys(), keyFlags)) {
    if (flag->getNumOccurrences() == 0)
      continue;
    if (Error error = applyOverride(*config, key.key, *flag))
      return fail("--" + flag->ArgStr + ": " + toString(std::move(error)));
  }
  if (Error error = validateCompileConfig(*config))
    return fail(inputPath + ": " + toString(std::move(error)));

  mlir::DialectRegistry registry;
  registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  mlir::OwningOpRef<mlir::ModuleOp> module = buildModelModule(context, *config);
  if (failed(mlir::verify(*module)))
    return fail("internal error: the model-level IR does not verify");

  std::string errorMessage;
  std::unique_ptr<ToolOutputFile> output =
      mlir::openOutputFile(outputPath, &errorMessage);
  if (!output)
    return fail(errorMessage);
  if (report == ReportKind::Params)
    mlir::mt::printParameterTable(*module, output->os());
  if (emit == EmitKind::Mlir)
    module->print(output->os());
  output->keep();
  return 0;
}
