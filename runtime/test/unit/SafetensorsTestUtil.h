// Test helpers for the safetensors tests: files from header text, caught errors, a temporary directory.
#ifndef MTRT_TEST_UNIT_SAFETENSORSTESTUTIL_H
#define MTRT_TEST_UNIT_SAFETENSORSTESTUTIL_H

#include "core/Safetensors.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace mtrt::test {

/// A safetensors file: the 8-byte little-endian length of `header`, the
/// header itself, then `data`.
inline std::vector<uint8_t> fileOf(const std::string &header,
                                   const std::vector<uint8_t> &data = {}) {
  std::vector<uint8_t> bytes;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    bytes.push_back(static_cast<uint8_t>(n >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

/// The Error that `body` throws, or nullopt when it returns.
template <typename Fn> std::optional<Error> errorOf(Fn &&body) {
  try {
    body();
  } catch (const Error &e) {
    return e;
  }
  return std::nullopt;
}

/// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
public:
  TempDir() {
    const char *base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base && *base ? base : "/tmp") + "/mtrt-st-XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()))
      path_ = buffer.data();
  }
  ~TempDir() {
    if (path_.empty())
      return;
    std::error_code ignored;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 ignored);
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string &path() const { return path_; }
  std::string file(const std::string &name) const { return path_ + "/" + name; }
  /// The names of the entries in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto &entry : std::filesystem::directory_iterator(path_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

private:
  std::string path_;
};

} // namespace mtrt::test

/// Expects `expr` to throw mtrt::Error with `code` and exactly `message`.
#define EXPECT_MTRT_ERROR(expr, expectedCode, expectedMessage)                 \
  do {                                                                         \
    std::optional<::mtrt::Error> mtrtTestError =                               \
        ::mtrt::test::errorOf([&] { (void)(expr); });                          \
    ASSERT_TRUE(mtrtTestError.has_value()) << #expr << " did not throw";       \
    EXPECT_EQ(mtrtTestError->code(), (expectedCode)) << mtrtTestError->what(); \
    EXPECT_EQ(std::string(mtrtTestError->what()), (expectedMessage));          \
  } while (false)

#endif // MTRT_TEST_UNIT_SAFETENSORSTESTUTIL_H
