// Tests that the safetensors reader rejects broken and hostile files, each with its full message.
#include "SafetensorsTestUtil.h"

#include <fstream>

using namespace mtrt;
using mtrt::test::fileOf;
using mtrt::test::TempDir;

namespace {

const char kName[] = "bad.safetensors";
const std::string kPrefix = "safetensors 'bad.safetensors': ";

SafetensorsFile parse(const std::vector<uint8_t> &bytes) {
  return SafetensorsFile::parse(kName, bytes);
}

/// A header of one F32 tensor "w" with `entry` as its JSON, over `dataSize`
/// zero bytes.
std::vector<uint8_t> oneTensor(const std::string &entry, size_t dataSize) {
  return fileOf(R"({"w":)" + entry + "}", std::vector<uint8_t>(dataSize));
}

#define EXPECT_REJECTED(bytes, expectedCode, expectedMessage)                  \
  EXPECT_MTRT_ERROR(parse(bytes), expectedCode, kPrefix + (expectedMessage))

//===----------------------------------------------------------------------===//
// The container: length prefix, header size, UTF-8, JSON
//===----------------------------------------------------------------------===//

TEST(SafetensorsRejectTest, FileShorterThanTheLengthPrefix) {
  EXPECT_REJECTED(std::vector<uint8_t>{}, MTRT_STATUS_DATA_LOSS,
                  "file: found 0 bytes, expected at least 8 (the header "
                  "length; the file is truncated or empty)");
  EXPECT_REJECTED((std::vector<uint8_t>{8, 0, 0, 0, 0}), MTRT_STATUS_DATA_LOSS,
                  "file: found 5 bytes, expected at least 8 (the header "
                  "length; the file is truncated or empty)");
}

TEST(SafetensorsRejectTest, HeaderLengthOverTheCap) {
  // 100,000,001 = 0x05f5e101, one past the cap; nothing is allocated for it.
  std::vector<uint8_t> bytes = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0, '{', '}'};
  EXPECT_REJECTED(bytes, MTRT_STATUS_INVALID_ARGUMENT,
                  "header length (bytes 0-7): found 100000001, expected at "
                  "most 100000000 (the reference implementation's limit; the "
                  "file is corrupted or not a safetensors file)");
  bytes = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  EXPECT_REJECTED(bytes, MTRT_STATUS_INVALID_ARGUMENT,
                  "header length (bytes 0-7): found 18446744073709551615, "
                  "expected at most 100000000 (the reference "
                  "implementation's limit; the file is corrupted or not a "
                  "safetensors file)");
}

TEST(SafetensorsRejectTest, HeaderLengthPastTheEndOfTheFile) {
  std::vector<uint8_t> bytes = fileOf("{}      ");
  bytes[0] = 100;
  EXPECT_REJECTED(bytes, MTRT_STATUS_DATA_LOSS,
                  "header length (bytes 0-7): found 100, expected at most the "
                  "8 bytes after it (the file is truncated)");
}

TEST(SafetensorsRejectTest, HeaderNotUtf8) {
  EXPECT_REJECTED(fileOf("{\"w\xff\":1}"), MTRT_STATUS_INVALID_ARGUMENT,
                  "header: found the byte 0xff at file offset 11, which is not "
                  "UTF-8, expected UTF-8 JSON text");
  // An overlong encoding of '/' and a lone surrogate are not UTF-8 either.
  EXPECT_REJECTED(fileOf("{\"\xc0\xaf\":1}"), MTRT_STATUS_INVALID_ARGUMENT,
                  "header: found the byte 0xc0 at file offset 10, which is not "
                  "UTF-8, expected UTF-8 JSON text");
  EXPECT_REJECTED(fileOf("{\"\xed\xa0\x80\":1}"), MTRT_STATUS_INVALID_ARGUMENT,
                  "header: found the byte 0xed at file offset 10, which is not "
                  "UTF-8, expected UTF-8 JSON text");
}

TEST(SafetensorsRejectTest, HeaderNotJson) {
  std::optional<Error> error =
      test::errorOf([] { parse(fileOf(R"({"w": )")); });
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), MTRT_STATUS_INVALID_ARGUMENT);
  std::string message = error->what();
  // The middle is nlohmann's own description of the syntax error.
  std::string start = kPrefix + "header: found invalid JSON ([json.exception.";
  std::string end = "), expected a JSON object";
  EXPECT_EQ(message.substr(0, start.size()), start) << message;
  ASSERT_GE(message.size(), end.size());
  EXPECT_EQ(message.substr(message.size() - end.size()), end) << message;
  EXPECT_NE(message.find("unexpected end of input"), std::string::npos)
      << message;
}

TEST(SafetensorsRejectTest, HeaderNotAnObject) {
  EXPECT_REJECTED(fileOf("[1, 2]"), MTRT_STATUS_INVALID_ARGUMENT,
                  "header: found a JSON array [1,2], expected a JSON object "
                  "of tensor names (and \"__metadata__\")");
}

TEST(SafetensorsRejectTest, HeaderNestedTooDeep) {
  std::string deep = R"({"w":{"x":)" + std::string(20, '[') +
                     std::string(20, ']') + "}}";
  EXPECT_REJECTED(fileOf(deep), MTRT_STATUS_INVALID_ARGUMENT,
                  "header[\"w\"][\"x\"][...][...][...][...][...][...][...][...]"
                  "[...][...][...][...][...][...]: found JSON nested 17 deep, "
                  "expected at most 16 (a valid header nests 3 deep)");
}

TEST(SafetensorsRejectTest, DuplicateKeys) {
  const std::string w = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  EXPECT_REJECTED(fileOf(R"({"w":)" + w + R"(,"w":)" + w + "}",
                         std::vector<uint8_t>(4)),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "header: found the key \"w\" twice, expected each tensor "
                  "name once");
  EXPECT_REJECTED(oneTensor(R"({"dtype":"F32","dtype":"F64","shape":[1],)"
                            R"("data_offsets":[0,4]})",
                            4),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\": found the key \"dtype\" twice, expected each "
                  "key once in an object");
  EXPECT_REJECTED(fileOf(R"({"__metadata__":{"a":"1","a":"2"}})"),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "__metadata__: found the key \"a\" twice, expected each key "
                  "once in an object");
}

TEST(SafetensorsRejectTest, MetadataNotAMapOfStrings) {
  EXPECT_REJECTED(fileOf(R"({"__metadata__":["pt"]})"),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "__metadata__: found a JSON array [\"pt\"], expected an "
                  "object of strings to strings");
  EXPECT_REJECTED(fileOf(R"({"__metadata__":{"step":7}})"),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "__metadata__[\"step\"]: found the JSON number 7, expected a "
                  "string");
}

//===----------------------------------------------------------------------===//
// Tensor entries
//===----------------------------------------------------------------------===//

TEST(SafetensorsRejectTest, EntryNotAnObjectOrIncomplete) {
  const std::string expected =
      ", expected an object with \"dtype\", \"shape\" and \"data_offsets\"";
  EXPECT_REJECTED(oneTensor(R"("F32")", 0), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\": found a JSON string \"F32\"" + expected);
  EXPECT_REJECTED(oneTensor(R"({"shape":[1],"data_offsets":[0,4]})", 4),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\": found no \"dtype\"" + expected);
  EXPECT_REJECTED(oneTensor(R"({"dtype":"F32","data_offsets":[0,4]})", 4),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\": found no \"shape\"" + expected);
  EXPECT_REJECTED(oneTensor(R"({"dtype":"F32","shape":[1]})", 4),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\": found no \"data_offsets\"" + expected);
}

TEST(SafetensorsRejectTest, BadDType) {
  EXPECT_REJECTED(oneTensor(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})",
                            4),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".dtype: found the JSON number 4, expected a "
                  "string such as \"F32\"");
  const std::string known = "BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, "
                            "U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64";
  EXPECT_REJECTED(
      oneTensor(R"({"dtype":"float32","shape":[1],"data_offsets":[0,4]})", 4),
      MTRT_STATUS_INVALID_ARGUMENT,
      "tensor \"w\".dtype: found \"float32\", expected one of " + known);
  EXPECT_REJECTED(
      oneTensor(R"({"dtype":"F4","shape":[2],"data_offsets":[0,1]})", 1),
      MTRT_STATUS_UNIMPLEMENTED,
      "tensor \"w\".dtype: found \"F4\", expected a dtype of whole bytes (" +
          known + "); this runtime does not read the sub-byte types");
}

TEST(SafetensorsRejectTest, BadShape) {
  auto entry = [](const std::string &shape) {
    return oneTensor(R"({"dtype":"F32","shape":)" + shape +
                         R"(,"data_offsets":[0,0]})",
                     0);
  };
  EXPECT_REJECTED(entry("4"), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".shape: found the JSON number 4, expected an "
                  "array of non-negative integers");
  EXPECT_REJECTED(entry("[2, -3]"), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".shape[1]: found -3, expected a non-negative "
                  "integer");
  EXPECT_REJECTED(entry("[2.5]"), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".shape[0]: found 2.5, expected a non-negative "
                  "integer");
  EXPECT_REJECTED(entry("[\"2\"]"), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".shape[0]: found \"2\", expected a "
                  "non-negative integer");
  EXPECT_REJECTED(entry("[0, 9223372036854775808]"),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".shape[1]: found 9223372036854775808, expected "
                  "a dimension of at most 9223372036854775807");
}

TEST(SafetensorsRejectTest, SizeOverflowingSixtyFourBits) {
  // 2^32 x 2^32 elements overflow; 2^62 elements fit, but not as 4 bytes each.
  EXPECT_REJECTED(
      oneTensor(R"({"dtype":"U8","shape":[4294967296,4294967296],)"
                R"("data_offsets":[0,0]})",
                0),
      MTRT_STATUS_INVALID_ARGUMENT,
      "tensor \"w\".shape: found [4294967296, 4294967296] of U8, whose size "
      "in bytes overflows 64 bits, expected at most 18446744073709551615 "
      "bytes");
  EXPECT_REJECTED(oneTensor(R"({"dtype":"F32","shape":[4611686018427387904],)"
                            R"("data_offsets":[0,0]})",
                            0),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".shape: found [4611686018427387904] of F32, "
                  "whose size in bytes overflows 64 bits, expected at most "
                  "18446744073709551615 bytes");
}

TEST(SafetensorsRejectTest, BadDataOffsets) {
  auto entry = [](const std::string &offsets, size_t dataSize) {
    return oneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":)" +
                         offsets + "}",
                     dataSize);
  };
  const std::string two = ", expected [begin, end], two non-negative integers";
  EXPECT_REJECTED(entry("[0]", 8), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".data_offsets: found a JSON array [0]" + two);
  EXPECT_REJECTED(entry("[0, 4, 8]", 8), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".data_offsets: found a JSON array [0,4,8]" +
                      two);
  EXPECT_REJECTED(entry("{\"begin\":0}", 8), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".data_offsets: found a JSON object" + two);
  EXPECT_REJECTED(entry("[-8, 0]", 8), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".data_offsets[0]: found -8, expected a "
                  "non-negative integer");
  EXPECT_REJECTED(entry("[0, 8.0]", 8), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".data_offsets[1]: found 8.0, expected a "
                  "non-negative integer");
  EXPECT_REJECTED(entry("[8, 0]", 8), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".data_offsets [8, 0]: found begin 8 after end "
                  "0, expected begin <= end");
  EXPECT_REJECTED(entry("[0, 8]", 4), MTRT_STATUS_DATA_LOSS,
                  "tensor \"w\".data_offsets [0, 8]: found end 8, expected at "
                  "most the 4 bytes of the data buffer (the file is truncated "
                  "or the header corrupted)");
  EXPECT_REJECTED(entry("[0, 12]", 12), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"w\".data_offsets [0, 12]: found 12 bytes, "
                  "expected 8 = 2 elements of shape [2] x 4 bytes (F32)");
}

//===----------------------------------------------------------------------===//
// How the tensors tile the data buffer
//===----------------------------------------------------------------------===//

std::vector<uint8_t> twoTensors(const std::string &a, const std::string &b,
                                size_t dataSize) {
  return fileOf(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":)" + a +
                    R"(},"b":{"dtype":"F32","shape":[2],"data_offsets":)" +
                    b + "}}",
                std::vector<uint8_t>(dataSize));
}

TEST(SafetensorsRejectTest, OverlappingTensors) {
  EXPECT_REJECTED(twoTensors("[0,8]", "[4,12]", 12),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"b\".data_offsets [4, 12]: found an overlap with "
                  "tensor \"a\" at [0, 8], expected tensors whose bytes do not "
                  "overlap");
  // The same bytes twice is an overlap too.
  EXPECT_REJECTED(twoTensors("[0,8]", "[0,8]", 8), MTRT_STATUS_INVALID_ARGUMENT,
                  "tensor \"b\".data_offsets [0, 8]: found an overlap with "
                  "tensor \"a\" at [0, 8], expected tensors whose bytes do not "
                  "overlap");
}

TEST(SafetensorsRejectTest, BytesNoTensorCovers) {
  EXPECT_REJECTED(twoTensors("[0,8]", "[12,20]", 20),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "data buffer: found bytes [8, 12] that no tensor covers "
                  "(before tensor \"b\"), expected tensors that cover the data "
                  "buffer exactly");
  EXPECT_REJECTED(twoTensors("[4,12]", "[12,20]", 20),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "data buffer: found bytes [0, 4] that no tensor covers "
                  "(before tensor \"a\"), expected tensors that cover the data "
                  "buffer exactly");
  EXPECT_REJECTED(twoTensors("[0,8]", "[8,16]", 20),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "data buffer: found bytes [16, 20] that no tensor covers (at "
                  "the end of the file), expected tensors that cover the data "
                  "buffer exactly");
  EXPECT_REJECTED(fileOf("{}", {0}), MTRT_STATUS_INVALID_ARGUMENT,
                  "data buffer: found bytes [0, 1] that no tensor covers (at "
                  "the end of the file), expected tensors that cover the data "
                  "buffer exactly");
}

//===----------------------------------------------------------------------===//
// What is accepted, and files on disk
//===----------------------------------------------------------------------===//

TEST(SafetensorsRejectTest, AcceptsWhatTheFormatAllows) {
  // Trailing spaces, keys the format does not define, empty tensors that
  // share an offset, and tensors listed out of offset order.
  SafetensorsFile file = parse(fileOf(
      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("z1":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
      R"("z0":{"dtype":"I64","shape":[3,0],"data_offsets":[8,8],"x":[1]},)"
      R"("a":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}     )",
      std::vector<uint8_t>(12)));
  std::vector<std::string> order;
  for (const SafetensorsTensor &t : file.tensors())
    order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"b", "z0", "z1", "a"}));
  EXPECT_TRUE(file.metadata().empty());
}

TEST(SafetensorsRejectTest, OpenNamesThePath) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::string path = dir.file("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_MTRT_ERROR(SafetensorsFile::open(path), MTRT_STATUS_DATA_LOSS,
                    "safetensors '" + path +
                        "': file: found 3 bytes, expected at least 8 (the "
                        "header length; the file is truncated or empty)");
  std::string missing = dir.file("missing.safetensors");
  EXPECT_MTRT_ERROR(SafetensorsFile::open(missing), MTRT_STATUS_NOT_FOUND,
                    "safetensors '" + missing +
                        "': cannot open it; check the path (No such file or "
                        "directory)");
  EXPECT_MTRT_ERROR(SafetensorsFile::open(dir.path()),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    "safetensors '" + dir.path() +
                        "': file: found a directory or special file, expected "
                        "a regular file");
  // A truncated file on disk: the last tensor's end is past the data.
  std::string truncated = dir.file("truncated.safetensors");
  std::vector<uint8_t> bytes = twoTensors("[0,8]", "[8,16]", 16);
  bytes.resize(bytes.size() - 4);
  std::ofstream(truncated, std::ios::binary)
      .write(reinterpret_cast<const char *>(bytes.data()), bytes.size());
  EXPECT_MTRT_ERROR(SafetensorsFile::open(truncated), MTRT_STATUS_DATA_LOSS,
                    "safetensors '" + truncated +
                        "': tensor \"b\".data_offsets [8, 16]: found end 16, "
                        "expected at most the 12 bytes of the data buffer (the "
                        "file is truncated or the header corrupted)");
}

} // namespace

//===----------------------------------------------------------------------===//
// Edges the other tests leave: an empty header, text after the JSON, numbers
// past 64 bits, an empty tensor inside another's bytes
//===----------------------------------------------------------------------===//

/// The message of the Error that parsing `bytes` throws.
std::string rejection(const std::vector<uint8_t> &bytes) {
  std::optional<Error> error = test::errorOf([&] { parse(bytes); });
  return error ? error->what() : "accepted";
}

TEST(SafetensorsRejectTest, EmptyHeaderOrTextAfterTheJson) {
  std::string start = kPrefix + "header: found invalid JSON ([json.exception.";
  for (const std::vector<uint8_t> &bytes : {fileOf(""), fileOf("{} x")}) {
    std::string message = rejection(bytes);
    EXPECT_EQ(message.substr(0, start.size()), start) << message;
  }
  // nlohmann stops at a NUL byte, so what follows one would go unread.
  EXPECT_REJECTED(fileOf(std::string("{}\0{\"w\":1}", 10)),
                  MTRT_STATUS_INVALID_ARGUMENT,
                  "header: found a NUL byte at file offset 10, expected UTF-8 "
                  "JSON text (the header is padded with spaces, not NULs)");
}

TEST(SafetensorsRejectTest, NumbersPastSixtyFourBits) {
  // nlohmann reads integers past UINT64_MAX as doubles, which are refused.
  EXPECT_REJECTED(
      oneTensor(R"({"dtype":"U8","shape":[0],)"
                R"("data_offsets":[18446744073709551616,0]})",
                0),
      MTRT_STATUS_INVALID_ARGUMENT,
      "tensor \"w\".data_offsets[0]: found 1.8446744073709552e+19, expected "
      "a non-negative integer");
  EXPECT_REJECTED(
      oneTensor(R"({"dtype":"U8","shape":[1e30],"data_offsets":[0,0]})", 0),
      MTRT_STATUS_INVALID_ARGUMENT,
      "tensor \"w\".shape[0]: found 1e+30, expected a non-negative integer");
  // The largest offsets that fit are out of range, not an overflow.
  EXPECT_REJECTED(
      oneTensor(R"({"dtype":"U8","shape":[0],)"
                R"("data_offsets":[18446744073709551615,18446744073709551615]})",
                0),
      MTRT_STATUS_DATA_LOSS,
      "tensor \"w\".data_offsets [18446744073709551615, "
      "18446744073709551615]: found end 18446744073709551615, expected at "
      "most the 0 bytes of the data buffer (the file is truncated or the "
      "header corrupted)");
}

TEST(SafetensorsRejectTest, EmptyTensorInsideAnotherTensorsBytes) {
  EXPECT_REJECTED(
      fileOf(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
             std::vector<uint8_t>(8)),
      MTRT_STATUS_INVALID_ARGUMENT,
      "tensor \"e\".data_offsets [4, 4]: found an overlap with tensor \"a\" "
      "at [0, 8], expected tensors whose bytes do not overlap");
}
