// Tests for mtrt_version and mtrt_version_string.
#include "mtrt/mtrt.h"

#include "gtest/gtest.h"

#include <string>

namespace {

TEST(VersionTest, MatchesHeader) {
  mtrt_version_t version = mtrt_version();
  EXPECT_EQ(version.major, MTRT_VERSION_MAJOR);
  EXPECT_EQ(version.minor, MTRT_VERSION_MINOR);
  EXPECT_EQ(version.patch, MTRT_VERSION_PATCH);
}

TEST(VersionTest, StringAgreesWithNumbers) {
  mtrt_version_t version = mtrt_version();
  std::string expected = std::to_string(version.major) + "." +
                         std::to_string(version.minor) + "." +
                         std::to_string(version.patch);
  EXPECT_EQ(std::string(mtrt_version_string()), expected);
  // The same static string every time.
  EXPECT_EQ(mtrt_version_string(), mtrt_version_string());
}

TEST(VersionTest, MatchesCMakeProjectVersion) {
  // CMake parses the header; this catches a parse that silently broke.
  EXPECT_STREQ(mtrt_version_string(), MTRT_TEST_PROJECT_VERSION);
}

} // namespace
