// Test helpers: owning wrappers and assertions for mtrt_status_t.
#ifndef MTRT_TEST_UNIT_STATUSMATCHERS_H
#define MTRT_TEST_UNIT_STATUSMATCHERS_H

#include "mtrt/mtrt.h"

#include "gtest/gtest.h"

#include <memory>
#include <string>

namespace mtrt::test {

struct StatusDeleter {
  void operator()(mtrt_status_s *status) const { mtrt_status_free(status); }
};

/// Owns a status so that a failing assertion cannot leak it.
using StatusPtr = std::unique_ptr<mtrt_status_s, StatusDeleter>;

inline std::string describe(const StatusPtr &status) {
  return std::string(mtrt_status_code_string(mtrt_status_code(status.get()))) +
         ": " + mtrt_status_message(status.get());
}

} // namespace mtrt::test

/// Asserts that `expr` returns OK, printing the status otherwise.
#define ASSERT_MTRT_OK(expr)                                                   \
  do {                                                                         \
    ::mtrt::test::StatusPtr mtrtTestStatus(expr);                              \
    ASSERT_EQ(mtrtTestStatus.get(), nullptr)                                   \
        << #expr << " failed: " << ::mtrt::test::describe(mtrtTestStatus);     \
  } while (false)

#endif // MTRT_TEST_UNIT_STATUSMATCHERS_H
