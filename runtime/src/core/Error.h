// The exception the runtime's C++ code throws: a status code and a message.
#ifndef MTRT_SRC_CORE_ERROR_H
#define MTRT_SRC_CORE_ERROR_H

#include "mtrt/mtrt.h"

#include <stdexcept>
#include <string>

namespace mtrt {

/// An error inside the runtime's C++ code: a canonical status code and a
/// message that names the file or function, the field, the value and what was
/// expected. Thrown, never across the C API: its entry points catch it and
/// return an mtrt_status_t with the same code and message.
class Error : public std::runtime_error {
public:
  Error(mtrt_status_code_t code, const std::string &message)
      : std::runtime_error(message), code_(code) {}
  mtrt_status_code_t code() const { return code_; }

private:
  mtrt_status_code_t code_;
};

} // namespace mtrt

#endif // MTRT_SRC_CORE_ERROR_H
