// Tests for mtrt_status_*: codes, messages, ownership and code names.
#include "StatusMatchers.h"

#include <cstring>
#include <set>
#include <string>

using mtrt::test::StatusPtr;

namespace {

TEST(StatusTest, NullIsOk) {
  EXPECT_EQ(mtrt_status_code(nullptr), MTRT_STATUS_OK);
  EXPECT_STREQ(mtrt_status_message(nullptr), "");
  mtrt_status_free(nullptr); // Documented as a no-op.
}

TEST(StatusTest, ErrorCarriesCodeAndMessageUntilFreed) {
  mtrt_status_t status = mtrt_device_count(MTRT_BACKEND_HOST, nullptr);
  ASSERT_NE(status, nullptr);
  EXPECT_EQ(mtrt_status_code(status), MTRT_STATUS_INVALID_ARGUMENT);
  // The message is owned by the status: reading it twice gives the same
  // storage, and it stays valid until the status is freed.
  const char *message = mtrt_status_message(status);
  EXPECT_EQ(message, mtrt_status_message(status));
  EXPECT_STREQ(message, "mtrt_device_count: out_count must not be NULL");
  mtrt_status_free(status);
}

TEST(StatusTest, StatusesAreIndependent) {
  StatusPtr first(mtrt_device_count(MTRT_BACKEND_HOST, nullptr));
  StatusPtr second(mtrt_device_info(MTRT_BACKEND_HOST, 5, nullptr));
  ASSERT_NE(first.get(), nullptr);
  ASSERT_NE(second.get(), nullptr);
  EXPECT_NE(first.get(), second.get());
  first.reset();
  EXPECT_EQ(mtrt_status_code(second.get()), MTRT_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(mtrt_status_message(second.get()),
               "mtrt_device_info: out_info must not be NULL");
}

TEST(StatusTest, CodeStringsAreDistinctAndMatchTheEnum) {
  struct Case {
    mtrt_status_code_t code;
    int value;
    const char *name;
  };
  // The values are ABI: they must match absl/gRPC/IREE's canonical codes.
  const Case cases[] = {
      {MTRT_STATUS_OK, 0, "OK"},
      {MTRT_STATUS_CANCELLED, 1, "CANCELLED"},
      {MTRT_STATUS_UNKNOWN, 2, "UNKNOWN"},
      {MTRT_STATUS_INVALID_ARGUMENT, 3, "INVALID_ARGUMENT"},
      {MTRT_STATUS_DEADLINE_EXCEEDED, 4, "DEADLINE_EXCEEDED"},
      {MTRT_STATUS_NOT_FOUND, 5, "NOT_FOUND"},
      {MTRT_STATUS_ALREADY_EXISTS, 6, "ALREADY_EXISTS"},
      {MTRT_STATUS_PERMISSION_DENIED, 7, "PERMISSION_DENIED"},
      {MTRT_STATUS_RESOURCE_EXHAUSTED, 8, "RESOURCE_EXHAUSTED"},
      {MTRT_STATUS_FAILED_PRECONDITION, 9, "FAILED_PRECONDITION"},
      {MTRT_STATUS_ABORTED, 10, "ABORTED"},
      {MTRT_STATUS_OUT_OF_RANGE, 11, "OUT_OF_RANGE"},
      {MTRT_STATUS_UNIMPLEMENTED, 12, "UNIMPLEMENTED"},
      {MTRT_STATUS_INTERNAL, 13, "INTERNAL"},
      {MTRT_STATUS_UNAVAILABLE, 14, "UNAVAILABLE"},
      {MTRT_STATUS_DATA_LOSS, 15, "DATA_LOSS"},
  };
  std::set<std::string> seen;
  for (const Case &c : cases) {
    EXPECT_EQ(static_cast<int>(c.code), c.value) << c.name;
    EXPECT_STREQ(mtrt_status_code_string(c.code), c.name);
    EXPECT_TRUE(seen.insert(c.name).second) << c.name;
  }
  EXPECT_STREQ(mtrt_status_code_string(static_cast<mtrt_status_code_t>(99)),
               "UNRECOGNIZED_STATUS_CODE");
}

} // namespace
