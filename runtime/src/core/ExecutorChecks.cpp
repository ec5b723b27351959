// The checks every backend's executor makes (core/ExecutorChecks.h).
#include "core/ExecutorChecks.h"

namespace mtrt {

const Function &requireFunction(const Bundle &bundle, std::string_view name) {
  const Function *function = bundle.findFunction(name);
  if (!function) {
    std::string names;
    for (const Function &f : bundle.functions())
      names += (names.empty() ? "" : ", ") + f.name;
    throw Error(MTRT_STATUS_NOT_FOUND,
                "bundle '" + bundle.name() + "' has no function '" +
                    std::string(name) +
                    "' (it has: " + (names.empty() ? "none" : names) +
                    "); recompile it with megatron-compile");
  }
  return *function;
}

void checkNoF16Values(const Bundle &bundle, const Function &fn) {
  for (size_t v = 0; v < fn.values.size(); ++v) {
    DType dtype = fn.values[v].dtype;
    if (dtype == DType::F16)
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  "bundle '" + bundle.name() + "': " + fn.name + ".values[" +
                      std::to_string(v) +
                      "] is f16; the backends store bf16 values (precision "
                      "bf16) but no f16 ones (precision fp16 keeps the "
                      "values f32 and scales the loss): recompile the model "
                      "with megatron-compile");
  }
}

std::string instructionWhere(const Function &fn, size_t position) {
  return fn.name + ": instructions[" + std::to_string(position) + "] (" +
         opName(fn.instructions[position].op) + ")";
}

void checkInputs(const Function &fn,
                 const std::vector<host::TensorView> &inputs,
                 const std::function<DType(int64_t)> &storageType) {
  if (inputs.size() != fn.inputs.size())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                fn.name + ": got " + std::to_string(inputs.size()) +
                    " inputs, expected " + std::to_string(fn.inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    int64_t v = fn.inputs[i];
    const TensorType &type = fn.values[v];
    if (inputs[i].shape != type.shape || inputs[i].dtype != storageType(v) ||
        (!inputs[i].data && type.numElements))
      throw Error(
          MTRT_STATUS_INVALID_ARGUMENT,
          fn.name + ": inputs[" + std::to_string(i) + "] (value " +
              std::to_string(v) + "): found " + shapeString(inputs[i].shape) +
              " " + dtypeName(inputs[i].dtype) +
              (inputs[i].data ? "" : " without data") + ", expected " +
              shapeString(type.shape) + " " + dtypeName(storageType(v)));
  }
}

} // namespace mtrt
