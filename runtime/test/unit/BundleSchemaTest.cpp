// Tests of the manifest schema: each class of violation is rejected with a
// message naming field, value and expectation.
#include "BundleTestBuilder.h"

using namespace mtrt;
using namespace mtrt::test;

namespace {

// bigramManifest(8, 4, 2, 3)'s train_step, for reference:
//   values: 0 tokens, 1 table, 2 W, 3 b, 4 x, 5 logits, 6 labels, 7 loss,
//           8 one, 9 dlogits, 10 dW, 11 db, 12 dx, 13 dtable
//   instructions: 0-2 get_parameter, 3 embedding, 4 linear,
//     5 cross_entropy, 6 fill, 7 cross_entropy_grad (frees 8, 5),
//     8 linear_weight_grad, 9 bias_grad, 10 linear (frees 9),
//     11 embedding_grad (frees 12, 4), 12-14 accumulate_gradient
Json base() { return bigramManifest(8, 4, 2, 3); }

Json &train(Json &m) { return m["functions"][0]; }
Json &inst(Json &m, int i) { return train(m)["instructions"][i]; }

TEST(BundleSchemaTest, TheBaseManifestIsValid) {
  Bundle bundle = Bundle::parseManifest("s.mtb", base().dump());
  const Function &f = *bundle.findFunction("train_step");
  EXPECT_EQ(f.values.size(), 14u);
  EXPECT_EQ(f.instructions[4].op, Op::Linear);
  EXPECT_EQ(f.instructions[7].free, (std::vector<int64_t>{8, 5}));
  EXPECT_EQ(f.instructions[5].attrs.reduction, Reduction::Mean);
  EXPECT_EQ(f.instructions[5].attrs.ignoreIndex, -100);
  EXPECT_TRUE(f.instructions[10].attrs.transposeWeight);
}

TEST(BundleSchemaTest, OperandOutOfRange) {
  Json m = base();
  inst(m, 4)["operands"][1] = 99;
  expectManifestRejected(
      m, {"bundle 'm.mtb': functions[0].instructions[4].operands[1]",
          "found 99", "expected a value index in [0, 14)"});
  inst(m, 4)["operands"][1] = -1;
  expectManifestRejected(m, {"operands[1]: found -1"});
}

TEST(BundleSchemaTest, UseBeforeDefinition) {
  Json m = base();
  // The linear reads dlogits (value 9), defined by instructions[7].
  inst(m, 4)["operands"][0] = 9;
  expectManifestRejected(m,
                         {"functions[0].instructions[4].operands[0]",
                          "value 9, which is used before it is defined (by "
                          "instructions[7])",
                          "expected an input of the function or a result of an "
                          "earlier instruction"});
}

TEST(BundleSchemaTest, WrongOperandAndResultCounts) {
  Json m = base();
  inst(m, 3)["operands"] = {1};
  expectManifestRejected(m, {"functions[0].instructions[3].operands",
                             "found 1 operands",
                             "expected 2 operands for embedding"});
  m = base();
  inst(m, 4)["operands"] = {4, 2, 3, 3};
  expectManifestRejected(
      m, {"found 4 operands", "expected 2 to 3 operands for linear"});
  m = base();
  inst(m, 12)["results"] = {5};
  expectManifestRejected(m, {"instructions[12].results", "found 1 results",
                             "expected 0 results for accumulate_gradient"});
}

TEST(BundleSchemaTest, UnknownOp) {
  Json m = base();
  inst(m, 3)["op"] = "conv2d";
  expectManifestRejected(m,
                         {"functions[0].instructions[3].op", "found \"conv2d\"",
                          "expected an op of the bundle format"});
  inst(m, 3)["op"] = 7;
  expectManifestRejected(m, {"instructions[3].op", "found 7"});
}

TEST(BundleSchemaTest, BadDType) {
  Json m = base();
  train(m)["values"][4]["dtype"] = "f8";
  expectManifestRejected(
      m, {"functions[0].values[4].dtype", "found \"f8\"",
          "expected one of \"f32\", \"f64\", \"bf16\", \"f16\", "
          "\"i32\", \"i64\""});
  m = base();
  // Ids must be integers.
  train(m)["values"][0]["dtype"] = "f32";
  expectManifestRejected(m, {"functions[0].instructions[3].operands[1]",
                             "found dtype f32 (value 0)",
                             "expected i32 or i64 for embedding's ids"});
  m = base();
  // Values that are not ids are floating-point, results included.
  train(m)["values"][9]["dtype"] = "i32";
  expectManifestRejected(
      m,
      {"functions[0].instructions[7].results[0]", "found dtype i32 (value 9)",
       "expected a floating-point type for cross_entropy_grad"});
  m = base();
  // One element type per op, or f32 mixed with one 16-bit type (an f64
  // bias of an f32 linear layer is neither).
  train(m)["values"][3]["dtype"] = "f64";
  m["parameters"][2]["dtype"] = "f64";
  expectManifestRejected(
      m, {"instructions[4].operands[2]", "found dtype f64 (value 3)",
          "expected f32 like operands[0] (an op has one element "
          "type, or mixes f32 with bf16 or f16)"});
}

TEST(BundleSchemaTest, NegativeDimension) {
  Json m = base();
  train(m)["values"][4]["shape"] = {2, -3, 4};
  expectManifestRejected(m, {"functions[0].values[4].shape[1]", "found -3",
                             "expected an integer >= 0"});
  m = base();
  m["parameters"][1]["shape"] = {4, -8};
  expectManifestRejected(m, {"parameters[1].shape[1]", "found -8"});
}

TEST(BundleSchemaTest, OverflowingShape) {
  Json m = base();
  train(m)["values"][4]["shape"] = {int64_t(1) << 31, int64_t(1) << 31, 4};
  expectManifestRejected(m, {"functions[0].values[4].shape",
                             "found shape [2147483648,2147483648,4]",
                             "expected at most 2^60 elements"});
  m = base();
  train(m)["values"][4]["shape"] = {2, 3, 18446744073709551615ull};
  expectManifestRejected(m,
                         {"values[4].shape[2]",
                          "expected an integer that fits in 64 signed bits"});
}

TEST(BundleSchemaTest, BadParameterIndex) {
  Json m = base();
  inst(m, 1)["attrs"]["parameter"] = 3;
  expectManifestRejected(
      m, {"functions[0].instructions[1].attrs.parameter", "found 3",
          "expected a parameter index in [0, 3) (the bundle has 3 "
          "parameters)"});
  m = base();
  inst(m, 13)["attrs"]["parameter"] = -1;
  expectManifestRejected(m, {"instructions[13].attrs.parameter", "found -1"});
}

TEST(BundleSchemaTest, ParameterTypeMustMatchItsView) {
  Json m = base();
  inst(m, 1)["attrs"]["parameter"] = 0; // W's view bound to the table
  expectManifestRejected(m, {"instructions[1].results[0]",
                             "found [4, 8] f32 (value 2)",
                             "expected [8, 4] f32, the type of parameters[0] "
                             "(embedding.word_embeddings.weight)"});
}

TEST(BundleSchemaTest, Attributes) {
  Json m = base();
  inst(m, 5)["attrs"].erase("reduction");
  expectManifestRejected(
      m, {"instructions[5].attrs.reduction",
          "found nothing (the attribute is missing)",
          "expected the attribute \"reduction\" of cross_entropy"});
  m = base();
  inst(m, 5)["attrs"]["reduction"] = "max";
  expectManifestRejected(m, {"attrs.reduction: found \"max\"",
                             "expected one of \"mean\", \"sum\", \"none\""});
  m = base();
  inst(m, 10)["attrs"]["transpose_weight"] = 1;
  expectManifestRejected(m, {"instructions[10].attrs.transpose_weight",
                             "found an integer 1", "expected true or false"});
  m = base();
  inst(m, 4)["attrs"] = {{"bias", true}};
  expectManifestRejected(m, {"instructions[4].attrs.bias",
                             "found an attribute \"bias\"",
                             "expected only the attributes of linear "
                             "(transpose_weight, whole_rows)"});
  // A --tp-comm-overlap chunk's whole has a multiple of its rows.
  m = base();
  inst(m, 4)["attrs"] = {{"whole_rows", 3}};
  expectManifestRejected(m, {"instructions[4].attrs.whole_rows", "found 3",
                             "a multiple of the GEMM's"});
  m = base();
  inst(m, 6)["attrs"]["value"] = "one";
  expectManifestRejected(m, {"instructions[6].attrs.value",
                             "found a string \"one\"", "expected a number"});
  m = base();
  inst(m, 3)["location"] = "model.py:3";
  expectManifestRejected(
      m, {"instructions[3].location: found a field \"location\"",
          "expected only the fields of an instruction (op, "
          "operands, results, attrs, free, body) of format "
          "version 1",
          "recompile the bundle with the megatron-compile of this "
          "runtime's release"});
}

TEST(BundleSchemaTest, ShapesFollowTheOpRules) {
  Json m = base();
  train(m)["values"][5]["shape"] = {2, 3, 7};
  expectManifestRejected(
      m, {"functions[0].instructions[4].results[0]",
          "found shape [2, 3, 7] (value 5)",
          "expected [2, 3, 8] (the input's leading dimensions and "
          "the output size) for linear"});
  m = base();
  train(m)["values"][6]["shape"] = {3, 2};
  expectManifestRejected(m, {"instructions[5].operands[1]",
                             "found shape [3, 2] (value 6)",
                             "expected [2, 3] (the logits' shape without the "
                             "vocabulary) for cross_entropy"});
}

TEST(BundleSchemaTest, DefinitionsAndFrees) {
  Json m = base();
  inst(m, 9)["results"] = {10}; // dW again
  expectManifestRejected(m, {"instructions[9].results[0]",
                             "value 10, already defined by instructions[8]",
                             "expected a value defined exactly once"});
  m = base();
  inst(m, 8)["free"] = {9}; // dlogits freed before bias_grad reads it
  expectManifestRejected(m, {"instructions[9].operands[0]",
                             "value 9, freed by instructions[8]",
                             "expected a value that is still live"});
  m = base();
  inst(m, 11)["free"] = {12, 4, 0};
  expectManifestRejected(
      m, {"instructions[11].free[2]", "value 0, an input",
          "inputs, outputs and parameter views are never freed"});
  m = base();
  inst(m, 11)["free"] = {12, 4, 2};
  expectManifestRejected(
      m, {"instructions[11].free[2]", "value 2, a parameter view"});
  m = base();
  train(m)["values"].push_back({{"shape", {1}}, {"dtype", "f32"}});
  expectManifestRejected(
      m, {"functions[0].values[14]", "value 14, which nothing defines",
          "expected every value to be an input or the result of "
          "exactly one instruction"});
}

TEST(BundleSchemaTest, EntryPointSignatures) {
  Json m = base();
  train(m)["outputs"] = {2};
  expectManifestRejected(m, {"functions[0].outputs[0]",
                             "value 2 of type [4, 8] f32",
                             "expected a floating-point scalar (the loss)"});
  m = base();
  train(m)["inputs"] = {0};
  expectManifestRejected(m, {"operands[1]"}); // labels are now never defined
  m = base();
  m["functions"][1]["name"] = "train_step";
  expectManifestRejected(m, {"functions[1].name", "found \"train_step\"",
                             "expected a name no other function has"});
}

TEST(BundleSchemaTest, ParametersAndModel) {
  Json m = base();
  m["parameters"][1]["name"] = "embedding.word_embeddings.weight";
  expectManifestRejected(m,
                         {"parameters[1].name",
                          "expected a name not already used by parameters[0]"});
  m = base();
  m["parameters"][0].erase("std");
  expectManifestRejected(m, {"parameters[0].std", "the field is missing"});
  m = base();
  m["parameters"][0]["init"] = "xavier";
  expectManifestRejected(m,
                         {"parameters[0].init", "found \"xavier\"",
                          "expected one of \"normal\", \"zeros\", \"ones\""});
  m = base();
  m["parameters"][0]["dtype"] = "i32";
  expectManifestRejected(m, {"parameters[0].dtype", "found \"i32\"",
                             "expected a floating-point type"});
  m = base();
  m["model"]["global_batch_size"] = 3;
  expectManifestRejected(m, {"model.global_batch_size", "found 3",
                             "expected a multiple of micro_batch_size * "
                             "data_parallel_size (2 * 1)"});
  m = base();
  m["model"]["hidden_size"] = "4";
  expectManifestRejected(
      m, {"model.hidden_size", "found a string \"4\"", "expected an integer"});
  m = base();
  m["model"]["precision"] = "fp8";
  expectManifestRejected(m, {"model.precision", "found \"fp8\""});
}

} // namespace
