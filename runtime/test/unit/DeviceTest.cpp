// Tests for mtrt_device_count and mtrt_device_info on both backends.
#include "StatusMatchers.h"

#include <cstdio>
#include <cstring>
#include <string>

using mtrt::test::StatusPtr;

namespace {

/// A device info whose every byte is 0xAB, to see what a call wrote.
mtrt_device_info_t poisonedInfo() {
  mtrt_device_info_t info;
  std::memset(&info, 0xAB, sizeof(info));
  return info;
}

bool isAllZero(const mtrt_device_info_t &info) {
  const auto *bytes = reinterpret_cast<const unsigned char *>(&info);
  for (size_t i = 0; i < sizeof(info); ++i)
    if (bytes[i] != 0)
      return false;
  return true;
}

/// Expects `status` to have `code` and a message containing each of `parts`.
void expectError(const StatusPtr &status, mtrt_status_code_t code,
                 std::initializer_list<const char *> parts) {
  ASSERT_NE(status.get(), nullptr)
      << "expected " << mtrt_status_code_string(code);
  EXPECT_EQ(mtrt_status_code(status.get()), code)
      << mtrt::test::describe(status);
  std::string message = mtrt_status_message(status.get());
  for (const char *part : parts)
    EXPECT_NE(message.find(part), std::string::npos)
        << "'" << part << "' not in: " << message;
}

//===----------------------------------------------------------------------===//
// Host
//===----------------------------------------------------------------------===//

TEST(HostDeviceTest, HasExactlyOneDevice) {
  int count = -1;
  ASSERT_MTRT_OK(mtrt_device_count(MTRT_BACKEND_HOST, &count));
  EXPECT_EQ(count, 1);
}

TEST(HostDeviceTest, InfoIsSane) {
  mtrt_device_info_t info = poisonedInfo();
  ASSERT_MTRT_OK(mtrt_device_info(MTRT_BACKEND_HOST, 0, &info));
  size_t nameLength = strnlen(info.name, sizeof(info.name));
  EXPECT_LT(nameLength, sizeof(info.name)) << "name is not NUL-terminated";
  EXPECT_GT(nameLength, 0u);
  EXPECT_GT(info.total_memory_bytes, 0u);
  EXPECT_EQ(info.compute_capability_major, 0);
  EXPECT_EQ(info.compute_capability_minor, 0);
  EXPECT_GE(info.multiprocessor_count, 1);
}

TEST(HostDeviceTest, NullOutCountIsInvalidArgument) {
  StatusPtr status(mtrt_device_count(MTRT_BACKEND_HOST, nullptr));
  expectError(status, MTRT_STATUS_INVALID_ARGUMENT, {"out_count"});
}

TEST(HostDeviceTest, NullOutInfoIsInvalidArgument) {
  StatusPtr status(mtrt_device_info(MTRT_BACKEND_HOST, 0, nullptr));
  expectError(status, MTRT_STATUS_INVALID_ARGUMENT, {"out_info"});
}

TEST(HostDeviceTest, IndexPastTheEndIsOutOfRangeAndZeroesTheOutput) {
  mtrt_device_info_t info = poisonedInfo();
  StatusPtr status(mtrt_device_info(MTRT_BACKEND_HOST, 1, &info));
  expectError(status, MTRT_STATUS_OUT_OF_RANGE,
              {"device index 1", "'host' has 1 device", "0..0"});
  EXPECT_TRUE(isAllZero(info));
}

TEST(HostDeviceTest, NegativeIndexIsOutOfRange) {
  mtrt_device_info_t info;
  StatusPtr status(mtrt_device_info(MTRT_BACKEND_HOST, -1, &info));
  expectError(status, MTRT_STATUS_OUT_OF_RANGE, {"device index -1"});
}

//===----------------------------------------------------------------------===//
// Backend argument
//===----------------------------------------------------------------------===//

TEST(DeviceTest, UnknownBackendIsInvalidArgument) {
  auto bogus = static_cast<mtrt_backend_t>(7);
  int count = -1;
  StatusPtr countStatus(mtrt_device_count(bogus, &count));
  expectError(countStatus, MTRT_STATUS_INVALID_ARGUMENT, {"unknown backend 7"});
  EXPECT_EQ(count, 0);

  mtrt_device_info_t info = poisonedInfo();
  StatusPtr infoStatus(mtrt_device_info(bogus, 0, &info));
  expectError(infoStatus, MTRT_STATUS_INVALID_ARGUMENT, {"unknown backend 7"});
  EXPECT_TRUE(isAllZero(info));
}

//===----------------------------------------------------------------------===//
// CUDA
//===----------------------------------------------------------------------===//

#if !MTRT_TEST_HAVE_CUDA

TEST(CudaDeviceTest, CountIsUnavailableWithoutCuda) {
  int count = -1;
  StatusPtr status(mtrt_device_count(MTRT_BACKEND_CUDA, &count));
  expectError(status, MTRT_STATUS_UNAVAILABLE,
              {"built without CUDA", "-DMTRT_ENABLE_CUDA=ON"});
  EXPECT_EQ(count, 0);
}

TEST(CudaDeviceTest, InfoIsUnavailableWithoutCuda) {
  mtrt_device_info_t info = poisonedInfo();
  StatusPtr status(mtrt_device_info(MTRT_BACKEND_CUDA, 0, &info));
  expectError(status, MTRT_STATUS_UNAVAILABLE,
              {"built without CUDA", "-DMTRT_ENABLE_CUDA=ON"});
  EXPECT_TRUE(isAllZero(info));
}

#else // MTRT_TEST_HAVE_CUDA

int cudaDeviceCount() {
  int count = -1;
  StatusPtr status(mtrt_device_count(MTRT_BACKEND_CUDA, &count));
  EXPECT_EQ(status.get(), nullptr) << mtrt::test::describe(status);
  return count;
}

TEST(CudaDeviceTest, CountSucceedsWithOrWithoutAGpu) {
  // No GPU or no driver is a count of 0, not an error.
  int count = cudaDeviceCount();
  EXPECT_GE(count, 0);
  if (count == 0)
    std::printf("note: no CUDA device or driver visible; count is 0\n");
}

TEST(CudaDeviceTest, NullOutPointersAreInvalidArgument) {
  StatusPtr countStatus(mtrt_device_count(MTRT_BACKEND_CUDA, nullptr));
  expectError(countStatus, MTRT_STATUS_INVALID_ARGUMENT, {"out_count"});
  StatusPtr infoStatus(mtrt_device_info(MTRT_BACKEND_CUDA, 0, nullptr));
  expectError(infoStatus, MTRT_STATUS_INVALID_ARGUMENT, {"out_info"});
}

TEST(CudaDeviceTest, IndexPastTheEndIsOutOfRange) {
  int count = cudaDeviceCount();
  ASSERT_GE(count, 0);
  mtrt_device_info_t info = poisonedInfo();
  StatusPtr status(mtrt_device_info(MTRT_BACKEND_CUDA, count, &info));
  std::string index = "device index " + std::to_string(count);
  std::string has = "'cuda' has " + std::to_string(count) + " device";
  expectError(status, MTRT_STATUS_OUT_OF_RANGE, {index.c_str(), has.c_str()});
  EXPECT_TRUE(isAllZero(info));
}

TEST(CudaDeviceTest, InfoIsSaneForEveryDevice) {
  int count = cudaDeviceCount();
  if (count <= 0)
    GTEST_SKIP() << "no CUDA device visible on this machine";
  for (int i = 0; i < count; ++i) {
    SCOPED_TRACE("device " + std::to_string(i));
    mtrt_device_info_t info = poisonedInfo();
    ASSERT_MTRT_OK(mtrt_device_info(MTRT_BACKEND_CUDA, i, &info));
    size_t nameLength = strnlen(info.name, sizeof(info.name));
    EXPECT_LT(nameLength, sizeof(info.name));
    EXPECT_GT(nameLength, 0u);
    EXPECT_GT(info.total_memory_bytes, 0u);
    EXPECT_GE(info.compute_capability_major, 1);
    EXPECT_GE(info.compute_capability_minor, 0);
    EXPECT_GE(info.multiprocessor_count, 1);
  }
}

#endif // MTRT_TEST_HAVE_CUDA

} // namespace
