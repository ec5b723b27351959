// Tests for safetensors: round trips, files written by hand to the format, float conversions, the atomic writer.
#include "SafetensorsTestUtil.h"

#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace mtrt;
using mtrt::test::fileOf;
using mtrt::test::TempDir;

namespace {

std::vector<uint8_t> readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

float fromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

/// Little-endian bytes of floats, written out the long way.
std::vector<uint8_t> leBytes(const std::vector<float> &values) {
  std::vector<uint8_t> bytes;
  for (float v : values)
    for (int i = 0; i < 4; ++i)
      bytes.push_back(static_cast<uint8_t>(bitsOf(v) >> (8 * i)));
  return bytes;
}

std::string pidTemp(const std::string &path) {
  return path + ".tmp." + std::to_string(::getpid());
}

//===----------------------------------------------------------------------===//
// Round trips and the reference layout
//===----------------------------------------------------------------------===//

TEST(SafetensorsTest, RoundTripIsBitExact) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  // Values whose bits a careless copy would change: signed zero, the
  // smallest subnormal, infinities, a NaN with a payload, the extremes.
  std::vector<float> weight = {
      -0.0f,
      fromBits(0x00000001u),
      std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(),
      fromBits(0x7fc12345u),
      std::numeric_limits<float>::max(),
  };
  std::vector<float> bias = {3.14159274f, -1.5f, 1e-30f};
  float scalar = 42.0f;
  std::vector<SafetensorsWriteTensor> tensors = {
      {"transformer.h.0.mlp.c_fc.bias", {3}, bias.data()},
      {"transformer.h.0.mlp.c_fc.weight", {2, 3}, weight.data()},
      {"scale", {}, &scalar},
      {"empty", {0, 4}, nullptr},
  };
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"note", "caf\xc3\xa9 \"quoted\"\n"}};
  std::string path = dir.file("model.safetensors");
  writeSafetensors(path, tensors, metadata);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.safetensors"});

  SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.name(), path);
  EXPECT_EQ(file.metadata(), metadata);
  EXPECT_EQ(file.headerSize() % 8, 0u);
  EXPECT_EQ(file.dataSize(), 4u * (3 + 6 + 1));
  std::vector<std::string> names = {"empty", "scale",
                                    "transformer.h.0.mlp.c_fc.bias",
                                    "transformer.h.0.mlp.c_fc.weight"};
  EXPECT_EQ(file.names(), names);
  // The data lies in name order, as the header lists it.
  ASSERT_EQ(file.tensors().size(), 4u);
  for (size_t i = 0; i < names.size(); ++i)
    EXPECT_EQ(file.tensors()[i].name, names[i]);

  const SafetensorsTensor &w = file.tensor("transformer.h.0.mlp.c_fc.weight");
  EXPECT_EQ(w.dtype, SafetensorsDType::F32);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w.numElements, 6u);
  EXPECT_EQ(w.begin, 16u);
  EXPECT_EQ(w.end, 40u);
  EXPECT_EQ(std::memcmp(file.bytes(w), weight.data(), 24), 0);
  std::vector<float> read = file.toFloat(w.name);
  ASSERT_EQ(read.size(), weight.size());
  for (size_t i = 0; i < weight.size(); ++i)
    EXPECT_EQ(bitsOf(read[i]), bitsOf(weight[i])) << "element " << i;
  EXPECT_EQ(file.toFloat("transformer.h.0.mlp.c_fc.bias"), bias);
  EXPECT_EQ(file.tensor("scale").shape, std::vector<int64_t>{});
  EXPECT_EQ(file.toDouble("scale"), std::vector<double>{42.0});
  EXPECT_EQ(file.tensor("empty").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(file.tensor("empty").numBytes(), 0u);
  EXPECT_TRUE(file.toFloat("empty").empty());
}

// The reference writer's layout, composed here by hand from the format:
// length, compact JSON (dtype, shape, data_offsets), space padding to 8.
TEST(SafetensorsTest, WriterMatchesTheReferenceLayout) {
  std::vector<float> values = {0, 1, 2, 3, 4, 5};
  std::vector<uint8_t> data = {0, 0, 0,    0,    0, 0, 0x80, 0x3f,
                               0, 0, 0,    0x40, 0, 0, 0x40, 0x40,
                               0, 0, 0x80, 0x40, 0, 0, 0xa0, 0x40};
  ASSERT_EQ(leBytes(values), data);

  // 64 header bytes: already a multiple of 8, so no padding.
  std::string header =
      R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  std::vector<uint8_t> expected = {64, 0, 0, 0, 0, 0, 0, 0};
  expected.insert(expected.end(), header.begin(), header.end());
  expected.insert(expected.end(), data.begin(), data.end());
  EXPECT_EQ(serializeSafetensors({{"attn.0", {1, 2, 3}, values.data()}}),
            expected);

  // Metadata first, tensors by name, 146 bytes padded with 6 spaces to 152.
  float b = 1.0f;
  header = R"({"__metadata__":{"step":"7"},)"
           R"("attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]},)"
           R"("b":{"dtype":"F32","shape":[],"data_offsets":[24,28]}})"
           "      ";
  expected = {152, 0, 0, 0, 0, 0, 0, 0};
  expected.insert(expected.end(), header.begin(), header.end());
  expected.insert(expected.end(), data.begin(), data.end());
  expected.insert(expected.end(), {0, 0, 0x80, 0x3f});
  EXPECT_EQ(serializeSafetensors(
                {{"b", {}, &b}, {"attn.0", {1, 2, 3}, values.data()}},
                {{"step", "7"}}),
            expected);

  // No tensors: "{}" and six spaces.
  expected = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
  EXPECT_EQ(serializeSafetensors({}), expected);
  EXPECT_TRUE(SafetensorsFile::parse("empty", expected).tensors().empty());
}

// A file of several dtypes written byte by byte, its header in an order
// other than its data's and padded with spaces.
TEST(SafetensorsTest, ReadsAHandWrittenFile) {
  std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("w":{"dtype":"BF16","shape":[2],"data_offsets":[20,24]},)"
      R"("ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
      R"("half":{"dtype":"F16","shape":[1,2],"data_offsets":[16,20]},)"
      R"("d":{"dtype":"F64","shape":[],"data_offsets":[24,32]}})"
      "      "; // 258 + 6 = 264 = 0x108 bytes
  std::vector<uint8_t> bytes = {0x08, 0x01, 0, 0, 0, 0, 0, 0};
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), {
                                7, 0, 0, 0, 0, 0, 0, 0,         // ids[0] = 7
                                0xff, 0xff, 0xff, 0xff,         //
                                0xff, 0xff, 0xff, 0xff,         // ids[1] = -1
                                0x00, 0x3c, 0x00, 0xc0,         // half: 1, -2
                                0x49, 0x40, 0x00, 0xbf,         // w: 3.140625, -0.5
                                0x9a, 0x99, 0x99, 0x99,         //
                                0x99, 0x99, 0xb9, 0x3f,         // d = 0.1
                            });
  SafetensorsFile file = SafetensorsFile::parse("hand.safetensors", bytes);
  EXPECT_EQ(file.headerSize(), 264u);
  EXPECT_EQ(file.dataSize(), 32u);
  EXPECT_EQ(file.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(file.names(),
            (std::vector<std::string>{"d", "half", "ids", "w"}));
  std::vector<std::string> inFileOrder;
  for (const SafetensorsTensor &t : file.tensors())
    inFileOrder.push_back(t.name);
  EXPECT_EQ(inFileOrder, (std::vector<std::string>{"ids", "half", "w", "d"}));

  const SafetensorsTensor &ids = file.tensor("ids");
  EXPECT_EQ(ids.dtype, SafetensorsDType::I64);
  int64_t idValues[2];
  std::memcpy(idValues, file.bytes(ids), sizeof(idValues));
  EXPECT_EQ(idValues[0], 7);
  EXPECT_EQ(idValues[1], -1);
  EXPECT_EQ(file.tensor("half").shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(file.toFloat("half"), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(file.toDouble("w"), (std::vector<double>{3.140625, -0.5}));
  EXPECT_EQ(file.toDouble("d"), std::vector<double>{0.1});
  EXPECT_EQ(file.toFloat("d"), std::vector<float>{0.1f});

  EXPECT_MTRT_ERROR(file.toFloat("ids"), MTRT_STATUS_INVALID_ARGUMENT,
                    "safetensors 'hand.safetensors': tensor \"ids\": found "
                    "dtype I64, expected F32, F64, BF16 or F16 to convert it "
                    "to floating point");
  EXPECT_MTRT_ERROR(file.tensor("wte"), MTRT_STATUS_NOT_FOUND,
                    "safetensors 'hand.safetensors': no tensor named \"wte\" "
                    "among its 4 tensors");
  EXPECT_EQ(file.find("wte"), nullptr);
}

//===----------------------------------------------------------------------===//
// BF16 and F16
//===----------------------------------------------------------------------===//

struct HalfCase {
  uint16_t bits;
  double value; // from the format's definition, not from the code
};

void expectSame(double expected, double actual, uint16_t bits) {
  if (std::isnan(expected)) {
    EXPECT_TRUE(std::isnan(actual)) << std::hex << bits;
    return;
  }
  EXPECT_EQ(actual, expected) << std::hex << bits;
  EXPECT_EQ(std::signbit(actual), std::signbit(expected)) << std::hex << bits;
}

// Each case is written as sign x 2^exponent x significand.
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const HalfCase kF16Cases[] = {
    {0x0000, 0.0},
    {0x8000, -0.0},
    {0x3c00, 1.0},
    {0xc000, -2.0},
    {0x3555, std::ldexp(1.0 + 341.0 / 1024, -2)},  // 0.333251953125
    {0x7bff, std::ldexp(2.0 - 1.0 / 1024, 15)},    // 65504, the largest
    {0x0400, std::ldexp(1.0, -14)},                // smallest normal
    {0x03ff, std::ldexp(1023.0, -24)},             // largest subnormal
    {0x0001, std::ldexp(1.0, -24)},                // smallest subnormal
    {0x8001, -std::ldexp(1.0, -24)},
    {0x7c00, kInf},
    {0xfc00, -kInf},
    {0x7e00, kNaN},
};
const HalfCase kBF16Cases[] = {
    {0x0000, 0.0},
    {0x8000, -0.0},
    {0x3f80, 1.0},
    {0xc040, -3.0},
    {0x4049, std::ldexp(1.0 + 73.0 / 128, 1)},   // 3.140625
    {0x3dcd, std::ldexp(1.0 + 77.0 / 128, -4)},  // 0.10009765625
    {0x7f7f, std::ldexp(2.0 - 1.0 / 128, 127)},  // the largest
    {0x0080, std::ldexp(1.0, -126)},             // smallest normal
    {0x0001, std::ldexp(1.0, -133)},             // smallest subnormal
    {0x7f80, kInf},
    {0xff80, -kInf},
    {0x7fc0, kNaN},
};

TEST(SafetensorsTest, ConvertsF16AndBF16Exactly) {
  for (const HalfCase &c : kF16Cases)
    expectSame(c.value, f16ToFloat(c.bits), c.bits);
  for (const HalfCase &c : kBF16Cases)
    expectSame(c.value, bf16ToFloat(c.bits), c.bits);

  // The same through a file, to float and to double.
  std::vector<uint8_t> data;
  for (const HalfCase &c : kF16Cases)
    data.insert(data.end(), {uint8_t(c.bits), uint8_t(c.bits >> 8)});
  for (const HalfCase &c : kBF16Cases)
    data.insert(data.end(), {uint8_t(c.bits), uint8_t(c.bits >> 8)});
  size_t nF16 = std::size(kF16Cases), nBF16 = std::size(kBF16Cases);
  std::string header =
      R"({"h":{"dtype":"F16","shape":[)" + std::to_string(nF16) +
      R"(],"data_offsets":[0,)" + std::to_string(2 * nF16) +
      R"(]},"b":{"dtype":"BF16","shape":[)" + std::to_string(nBF16) +
      R"(],"data_offsets":[)" + std::to_string(2 * nF16) + "," +
      std::to_string(2 * (nF16 + nBF16)) + "]}}";
  SafetensorsFile file = SafetensorsFile::parse("half", fileOf(header, data));
  std::vector<float> hf = file.toFloat("h");
  std::vector<double> hd = file.toDouble("h");
  for (size_t i = 0; i < nF16; ++i) {
    expectSame(kF16Cases[i].value, hf[i], kF16Cases[i].bits);
    expectSame(kF16Cases[i].value, hd[i], kF16Cases[i].bits);
  }
  std::vector<float> bf = file.toFloat("b");
  std::vector<double> bd = file.toDouble("b");
  for (size_t i = 0; i < nBF16; ++i) {
    expectSame(kBF16Cases[i].value, bf[i], kBF16Cases[i].bits);
    expectSame(kBF16Cases[i].value, bd[i], kBF16Cases[i].bits);
  }
}

//===----------------------------------------------------------------------===//
// The atomic writer
//===----------------------------------------------------------------------===//

TEST(SafetensorsTest, WriterReplacesAnExistingFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::string path = dir.file("w.safetensors");
  std::vector<float> first = {1, 2}, second = {3, 4, 5};
  writeSafetensors(path, {{"x", {2}, first.data()}});
  SafetensorsFile old = SafetensorsFile::open(path);
  writeSafetensors(path, {{"x", {3}, second.data()}});
  EXPECT_EQ(SafetensorsFile::open(path).toFloat("x"), second);
  // A reader that mapped the old file keeps it: rename replaced the name,
  // not the bytes.
  EXPECT_EQ(old.toFloat("x"), first);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"w.safetensors"});
}

TEST(SafetensorsTest, WriterFailsCleanlyWhenThePathIsADirectory) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::string path = dir.file("taken");
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  float x = 1;
  EXPECT_MTRT_ERROR(writeSafetensors(path, {{"x", {}, &x}}),
                    MTRT_STATUS_FAILED_PRECONDITION,
                    "writing safetensors '" + path +
                        "': cannot rename the temporary file '" +
                        pidTemp(path) + "' onto it: Is a directory");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"taken"});
}

TEST(SafetensorsTest, WriterFailsCleanlyWhenTheDirectoryIsMissing) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::string path = dir.file("missing/w.safetensors");
  float x = 1;
  EXPECT_MTRT_ERROR(writeSafetensors(path, {{"x", {}, &x}}),
                    MTRT_STATUS_NOT_FOUND,
                    "writing safetensors '" + path +
                        "': cannot create the temporary file '" +
                        pidTemp(path) + "': No such file or directory");
  EXPECT_TRUE(dir.entries().empty());
}

TEST(SafetensorsTest, WriterFailsCleanlyWhenTheDirectoryIsNotWritable) {
  if (::geteuid() == 0)
    GTEST_SKIP() << "running as root, which permission bits do not stop";
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  ASSERT_EQ(::chmod(dir.path().c_str(), 0555), 0);
  std::string path = dir.file("w.safetensors");
  float x = 1;
  EXPECT_MTRT_ERROR(writeSafetensors(path, {{"x", {}, &x}}),
                    MTRT_STATUS_PERMISSION_DENIED,
                    "writing safetensors '" + path +
                        "': cannot create the temporary file '" +
                        pidTemp(path) + "': Permission denied");
  EXPECT_TRUE(dir.entries().empty());
}

// A write that fails halfway (here: the file size limit) leaves the
// previous file whole and no temporary file behind.
TEST(SafetensorsTest, WriterFailureMidWayKeepsThePreviousFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::string path = dir.file("w.safetensors");
  std::vector<float> small = {1, 2, 3};
  writeSafetensors(path, {{"x", {3}, small.data()}});
  std::vector<uint8_t> before = readFile(path);

  std::vector<float> big(1 << 16, 0.5f); // 256 KiB, over the limit below
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto savedHandler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = saved;
  limit.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::optional<Error> error =
      test::errorOf([&] { writeSafetensors(path, {{"x", {1 << 16}, big.data()}}); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, savedHandler);

  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), MTRT_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_EQ(std::string(error->what()),
            "writing safetensors '" + path +
                "': cannot write the temporary file '" + pidTemp(path) +
                "': File too large");
  EXPECT_EQ(readFile(path), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"w.safetensors"});
}

TEST(SafetensorsTest, WriterRejectsBadTensors) {
  float x = 1;
  auto invalid = [](const std::string &message) {
    return "writing safetensors: " + message;
  };
  EXPECT_MTRT_ERROR(serializeSafetensors({{"a", {}, &x}, {"a", {}, &x}}),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    invalid("two tensors are named \"a\""));
  EXPECT_MTRT_ERROR(serializeSafetensors({{"", {}, &x}}),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    invalid("a tensor has an empty name"));
  EXPECT_MTRT_ERROR(
      serializeSafetensors({{"__metadata__", {}, &x}}),
      MTRT_STATUS_INVALID_ARGUMENT,
      invalid("a tensor is named \"__metadata__\", which the format reserves"));
  EXPECT_MTRT_ERROR(serializeSafetensors({{"a", {2, -1}, &x}}),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    invalid("tensor \"a\" has the negative dimension -1 in "
                            "shape [2, -1]"));
  EXPECT_MTRT_ERROR(serializeSafetensors({{"a", {2}, nullptr}}),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    invalid("tensor \"a\" of shape [2] has no data (a null "
                            "pointer)"));
  int64_t big = int64_t(1) << 62;
  EXPECT_MTRT_ERROR(serializeSafetensors({{"a", {big}, &x}}),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    invalid("tensor \"a\" of shape [4611686018427387904] "
                            "makes the file larger than 2^64 bytes"));
  EXPECT_MTRT_ERROR(serializeSafetensors({{"a\xff", {}, &x}}),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    invalid("the tensor name \"a\xef\xbf\xbd\" is not UTF-8, "
                            "which JSON needs"));
  EXPECT_MTRT_ERROR(serializeSafetensors({}, {{"k", "\xc0\x80"}}),
                    MTRT_STATUS_INVALID_ARGUMENT,
                    invalid("the value of metadata key \"k\" is not UTF-8, "
                            "which JSON needs"));
}

} // namespace
