// The checks every backend's executor makes, with the same messages: the
// function and parameter store it is given, the value types it computes in,
// the inputs of a run and the ids they hold.
#ifndef MTRT_SRC_CORE_EXECUTORCHECKS_H
#define MTRT_SRC_CORE_EXECUTORCHECKS_H

#include "core/Bundle.h"
#include "host/HostTensor.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace mtrt {

/// The function `name` of `bundle`; NOT_FOUND naming the functions it has.
const Function &requireFunction(const Bundle &bundle, std::string_view name);

/// INVALID_ARGUMENT "WHO: the parameter store was made for another bundle
/// than 'NAME'" unless `store` (a backend's ParameterStore) holds `bundle`'s
/// parameters.
template <typename Store>
void checkParameterStore(const Bundle &bundle, const Store &store,
                         const std::string &who) {
  if (store.size() != bundle.parameters().size() ||
      (store.size() && &store.info(0) != &bundle.parameters()[0]))
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                who +
                    ": the parameter store was made for another bundle "
                    "than '" +
                    bundle.name() + "'");
}

/// UNIMPLEMENTED for an f16 value of `fn`. bf16 values (mt-mixed-precision,
/// format version 8) are stored as declared; fp16 training keeps the IR in
/// f32 and scales the loss, so a bundle never declares f16.
void checkNoF16Values(const Bundle &bundle, const Function &fn);

/// "FN: instructions[I] (OP)", how messages name an instruction.
std::string instructionWhere(const Function &fn, size_t position);

/// INVALID_ARGUMENT unless `inputs` match `fn`'s inputs in number, shape and
/// storage type (`storageType(value)`: the dtype the backend keeps it in) and
/// have data.
void checkInputs(const Function &fn,
                 const std::vector<host::TensorView> &inputs,
                 const std::function<DType(int64_t)> &storageType);

/// OUT_OF_RANGE unless every id is in [0, limit) (or equals `ignore` when
/// given), naming the instruction (`where`) and the operand, not just the
/// kernel.
template <typename Id>
void checkIds(const std::string &where, const char *what, size_t operand,
              int64_t value, const Id *ids, int64_t count, int64_t limit,
              const char *limitName, const int64_t *ignore) {
  for (int64_t i = 0; i < count; ++i) {
    int64_t id = static_cast<int64_t>(ids[i]);
    if ((id >= 0 && id < limit) || (ignore && id == *ignore))
      continue;
    throw Error(
        MTRT_STATUS_OUT_OF_RANGE,
        where + ": operands[" + std::to_string(operand) + "] (value " +
            std::to_string(value) + ") holds " + what + " " +
            std::to_string(id) + " at element " + std::to_string(i) +
            ", outside [0, " + std::to_string(limit) + "): " + limitName +
            " is " + std::to_string(limit) +
            (ignore ? " (and ignore_index is " + std::to_string(*ignore) + ")"
                    : std::string()) +
            "; the data must be tokenized for this vocabulary");
  }
}

} // namespace mtrt

#endif // MTRT_SRC_CORE_EXECUTORCHECKS_H
