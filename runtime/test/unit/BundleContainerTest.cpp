// Tests of the bundle container: header fields, lengths, checksum, JSON, and
// loading files.
#include "BundleTestBuilder.h"

#include <limits>

using namespace mtrt;
using namespace mtrt::test;

namespace {

std::string goodManifest() { return bigramManifest(8, 4, 2, 3).dump(); }

Bundle parseBytes(const std::vector<uint8_t> &bytes) {
  return Bundle::parse("t.mtb", bytes.data(), bytes.size());
}

void putU64(std::vector<uint8_t> &bytes, size_t at, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    bytes[at + i] = static_cast<uint8_t>(value >> (8 * i));
}

TEST(BundleContainerTest, AcceptsAWellFormedBundle) {
  Bundle bundle = parseBytes(bundleBytes(goodManifest()));
  EXPECT_EQ(bundle.name(), "t.mtb");
  EXPECT_EQ(bundle.producer(), "test");
  EXPECT_EQ(bundle.model().vocabSize, 8);
  ASSERT_EQ(bundle.parameters().size(), 3u);
  EXPECT_EQ(bundle.parameters()[2].init, InitMethod::Zeros);
  EXPECT_FALSE(bundle.parameters()[2].weightDecay);
  ASSERT_NE(bundle.findFunction("train_step"), nullptr);
  EXPECT_EQ(bundle.findFunction("train_step")->inputs.size(), 2u);
  EXPECT_EQ(bundle.findFunction("nothing"), nullptr);
}

TEST(BundleContainerTest, LoadsFromAFile) {
  TempFile file(".mtb");
  file.write(bundleBytes(goodManifest()));
  Bundle bundle = Bundle::load(file.path());
  EXPECT_EQ(bundle.name(), file.path());
  EXPECT_EQ(bundle.functions().size(), 3u);
}

TEST(BundleContainerTest, RejectsAMissingFile) {
  expectError(
      [] { Bundle::load("/nonexistent/dir/x.mtb"); }, MTRT_STATUS_NOT_FOUND,
      {"bundle '/nonexistent/dir/x.mtb'", "cannot open", "megatron-compile"});
}

TEST(BundleContainerTest, RejectsTruncationAtEveryRegion) {
  std::vector<uint8_t> whole = bundleBytes(goodManifest());
  // Inside the magic, the header fields, the digest, the manifest, and one
  // byte short of the end.
  for (size_t size : {size_t(0), size_t(5), size_t(20), size_t(40), size_t(63),
                      size_t(64), size_t(100), whole.size() - 1}) {
    SCOPED_TRACE("truncated to " + std::to_string(size) + " bytes");
    std::vector<uint8_t> bytes(whole.begin(), whole.begin() + size);
    if (size < 64)
      expectError([&] { parseBytes(bytes); }, MTRT_STATUS_DATA_LOSS,
                  {"bundle 't.mtb'", "header",
                   "found " + std::to_string(size) + " bytes",
                   "expected a 64-byte header"});
    else
      expectError([&] { parseBytes(bytes); }, MTRT_STATUS_DATA_LOSS,
                  {"header.manifest_length (offset 16)", "truncated",
                   "at most the " + std::to_string(size - 64) + " bytes"});
  }
}

TEST(BundleContainerTest, RejectsTrailingBytes) {
  std::vector<uint8_t> bytes = bundleBytes(goodManifest());
  bytes.push_back(0);
  expectError([&] { parseBytes(bytes); }, MTRT_STATUS_DATA_LOSS,
              {"header", "bytes in the file", "exactly 64 + "});
}

TEST(BundleContainerTest, RejectsAFlippedManifestByte) {
  std::vector<uint8_t> bytes = bundleBytes(goodManifest());
  bytes[64 + 10] ^= 0x01;
  expectError(
      [&] { parseBytes(bytes); }, MTRT_STATUS_DATA_LOSS,
      {"header.sha256 (offset 32)", "corrupted", "expected the stored"});
}

TEST(BundleContainerTest, RejectsAFlippedDigestByte) {
  std::vector<uint8_t> bytes = bundleBytes(goodManifest());
  bytes[40] ^= 0x80;
  expectError([&] { parseBytes(bytes); }, MTRT_STATUS_DATA_LOSS,
              {"header.sha256"});
}

TEST(BundleContainerTest, RejectsBadMagic) {
  std::vector<uint8_t> bytes = bundleBytes(goodManifest());
  std::memcpy(bytes.data(), "PK\x03\x04zip!", 8);
  expectError([&] { parseBytes(bytes); }, MTRT_STATUS_INVALID_ARGUMENT,
              {"header.magic (offset 0)", "not a bundle file",
               "expected the bytes \"MTBUNDLE\""});
}

TEST(BundleContainerTest, RejectsOtherVersions) {
  for (uint32_t version : {0u, 13u, 0xFFFFFFFFu}) {
    std::vector<uint8_t> bytes = bundleBytes(goodManifest(), version);
    expectError([&] { parseBytes(bytes); }, MTRT_STATUS_UNIMPLEMENTED,
                {"header.version (offset 8)",
                 "found " + std::to_string(version), "expected 1 to 12",
                 "megatron-compile"});
  }
}

TEST(BundleContainerTest, RejectsFlags) {
  std::vector<uint8_t> bytes = bundleBytes(goodManifest(), 1, 4);
  expectError([&] { parseBytes(bytes); }, MTRT_STATUS_INVALID_ARGUMENT,
              {"header.flags (offset 12)", "found 4", "expected 0"});
}

TEST(BundleContainerTest, RejectsLengthsThatOverflow) {
  std::vector<uint8_t> good = bundleBytes(goodManifest());
  uint64_t manifest = good.size() - 64;
  uint64_t max = std::numeric_limits<uint64_t>::max();
  {
    // M + P would wrap around 2^64; the reader never adds them.
    std::vector<uint8_t> bytes = good;
    putU64(bytes, 24, max);
    expectError([&] { parseBytes(bytes); }, MTRT_STATUS_DATA_LOSS,
                {"header.payload_length (offset 24)",
                 "found 18446744073709551615 bytes",
                 "expected at most the 0 bytes after the manifest"});
  }
  {
    std::vector<uint8_t> bytes = good;
    putU64(bytes, 16, max);
    expectError([&] { parseBytes(bytes); }, MTRT_STATUS_DATA_LOSS,
                {"header.manifest_length (offset 16)",
                 "found 18446744073709551615 bytes"});
  }
  {
    // A shorter manifest and a payload that make up the size: payloads are
    // not part of versions 1 and 2 (goodManifest's header says 1).
    std::vector<uint8_t> bytes = good;
    putU64(bytes, 16, manifest - 8);
    putU64(bytes, 24, 8);
    expectError([&] { parseBytes(bytes); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"header.payload_length (offset 24)", "found 8",
                 "expected 0 in format versions 1 and 2"});
  }
}

TEST(BundleContainerTest, RejectsTextThatIsNotJson) {
  for (std::string text :
       {"", "not json", "{\"format\": ", "[1, 2,]", "{\"a\": \"\xff\xfe\"}"}) {
    SCOPED_TRACE(text);
    std::vector<uint8_t> bytes = bundleBytes(text);
    expectError([&] { parseBytes(bytes); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"bundle 't.mtb': manifest: found text that is not JSON",
                 "expected UTF-8 JSON"});
  }
}

TEST(BundleContainerTest, RejectsDeepNesting) {
  std::string text(200, '[');
  text += std::string(200, ']');
  expectError([&] { Bundle::parseManifest("deep", text); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"manifest", "nested more than 64 levels"});
}

TEST(BundleContainerTest, RejectsJsonThatIsNotAManifest) {
  expectError(
      [] { Bundle::parseManifest("m", "[1, 2]"); },
      MTRT_STATUS_INVALID_ARGUMENT,
      {"bundle 'm': manifest: found an array [1,2]", "expected an object"});
  Json manifest = bigramManifest(8, 4, 2, 3);
  manifest["format"] = "onnx";
  expectError([&] { Bundle::parseManifest("m", manifest.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"format: found \"onnx\", expected \"megatron-bundle\""});
  manifest = bigramManifest(8, 4, 2, 3);
  manifest["version"] = 13;
  expectError([&] { Bundle::parseManifest("m", manifest.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"version: found 13, expected 1 to 12"});
  manifest = bigramManifest(8, 4, 2, 3);
  manifest.erase("functions");
  expectError([&] { Bundle::parseManifest("m", manifest.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"functions: found nothing (the field is missing)",
               "expected the required field \"functions\""});
}

} // namespace
