//===- ScaleInitPass.cpp - An out-of-tree pass loaded into megatron-opt ---===//
//
// A pass plugin built against the installed headers (find_package(Megatron)):
// `example-scale-init{std=S}` sets the initialization std of every normally
// initialized parameter to S, as a user scaling the init of a model would.
// Loaded with `megatron-opt --load-pass-plugin=libScaleInitPlugin.so`, it runs
// in a pipeline beside the project's own (docs/PassPipelines.md). The
// plugin's other pass, example-recompute-layer, is in RecomputeLayerPass.cpp.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Tools/Plugins/PassPlugin.h"

using namespace mlir;

namespace {

struct ScaleInitPass
    : public PassWrapper<ScaleInitPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(ScaleInitPass)

  ScaleInitPass() = default;
  ScaleInitPass(const ScaleInitPass &other) : PassWrapper(other) {}

  StringRef getArgument() const final { return "example-scale-init"; }
  StringRef getDescription() const final {
    return "Sets the init std of every normally initialized mt.parameter";
  }

  Option<double> initStd{*this, "std",
                     llvm::cl::desc("The standard deviation to initialize "
                                    "with"),
                     llvm::cl::init(0.02)};

  void runOnOperation() override {
    if (initStd <= 0) {
      getOperation().emitError()
          << "example-scale-init: std is " << initStd << "; give a positive one";
      return signalPassFailure();
    }
    Builder builder(&getContext());
    for (auto parameter : getOperation().getOps<mt::ParameterOp>())
      if (parameter.getInit() == mt::InitMethod::Normal)
        parameter.setStdAttr(builder.getF64FloatAttr(initStd));
  }
};

} // namespace

// RecomputeLayerPass.cpp, the plugin's other pass.
void registerRecomputeLayerPass();

extern "C" LLVM_ATTRIBUTE_WEAK PassPluginLibraryInfo mlirGetPassPluginInfo() {
  return {MLIR_PLUGIN_API_VERSION, "ScaleInitPlugin", LLVM_VERSION_STRING, [] {
            PassRegistration<ScaleInitPass>();
            registerRecomputeLayerPass();
          }};
}
