// Tests of the manifest fields for several ranks (docs/BundleFormat.md,
// "Several ranks"): the grid, parameters' split_axes, the collectives and
// bias_add, accepted and rejected with messages naming field, value and
// expectation.
#include "BundleTestBuilder.h"

using namespace mtrt;
using namespace mtrt::test;

namespace {

// Grid [2, 3]; parameter 0 w [4, 6] split over axis 1 on its columns (local
// [4, 2]), parameter 1 b [6] whole.
//   values: 0 x [4, 2], 1 w, 2 y = all_reduce(w), 3 g = all_gather(w, 1)
//           [4, 6], 4 s = reduce_scatter(g, 1) [4, 2], 5 c = all_slice(g, 1)
//           [4, 2], 6 b, 7 bias_add(g, b) [4, 6]
Json gridManifest() {
  FunctionBuilder f("f");
  int64_t x = f.input({4, 2}, "f32");
  (void)x;
  int64_t w = f.op("get_parameter", {}, {4, 2}, {{"parameter", 0}});
  f.op("all_reduce", {w}, {4, 2}, {{"grid_axes", {1}}, {"reduction", "sum"}});
  int64_t g =
      f.op("all_gather", {w}, {4, 6}, {{"grid_axes", {1}}, {"gather_axis", 1}});
  f.op("reduce_scatter", {g}, {4, 2},
       {{"grid_axes", {1}}, {"scatter_axis", -1}, {"reduction", "max"}});
  f.op("all_slice", {g}, {4, 2}, {{"grid_axes", {1}}, {"slice_axis", 1}});
  int64_t b = f.op("get_parameter", {}, {6}, {{"parameter", 1}});
  f.op("bias_add", {g, b}, {4, 6});
  Json w0 = parameterJson("w", {4, 6});
  w0["split_axes"] = {Json::array(), {1}};
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), {w0, parameterJson("b", {6})},
                        {f.build()});
  m["grid"] = {{"shape", {2, 3}}};
  return m;
}

Json &inst(Json &m, int i) { return m["functions"][0]["instructions"][i]; }
Json &attrs(Json &m, int i) { return inst(m, i)["attrs"]; }
Json &split(Json &m) { return m["parameters"][0]["split_axes"]; }

TEST(BundleGridTest, TheGridManifestIsValid) {
  Bundle bundle = Bundle::parseManifest("g.mtb", gridManifest().dump());
  EXPECT_TRUE(bundle.hasGrid());
  EXPECT_EQ(bundle.gridShape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(bundle.rankCount(), 6);
  const Parameter &w = bundle.parameters()[0];
  EXPECT_EQ(w.type.shape, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(w.localType.shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(w.localType.numElements, 8);
  EXPECT_EQ(w.splitAxes, (std::vector<std::vector<int64_t>>{{}, {1}}));
  EXPECT_TRUE(bundle.parameters()[1].splitAxes.empty());
  EXPECT_EQ(bundle.parameters()[1].localType.shape, (std::vector<int64_t>{6}));
  const Function &f = bundle.functions()[0];
  EXPECT_EQ(f.instructions[1].op, Op::AllReduce);
  EXPECT_EQ(f.instructions[1].attrs.gridAxes, (std::vector<int64_t>{1}));
  EXPECT_EQ(f.instructions[3].attrs.axis, 1); // -1 normalized
  EXPECT_EQ(f.instructions[3].attrs.collectiveReduction,
            CollectiveReduction::Max);
  EXPECT_EQ(f.instructions[6].op, Op::BiasAdd);
}

TEST(BundleGridTest, BundlesWithoutAGridHaveOneRank) {
  Bundle bundle =
      Bundle::parseManifest("b.mtb", bigramManifest(8, 4, 2, 3).dump());
  EXPECT_FALSE(bundle.hasGrid());
  EXPECT_EQ(bundle.rankCount(), 1);
  EXPECT_EQ(bundle.parameters()[1].localType.shape,
            bundle.parameters()[1].type.shape);
}

TEST(BundleGridTest, GridHelpers) {
  std::vector<int64_t> grid = {2, 3};
  EXPECT_EQ(gridCoordinates(grid, 4), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(gridGroupSize(grid, {0, 1}), 6);
  EXPECT_EQ(gridGroupIndex(grid, {1, 2}, {0, 1}), 5);
  EXPECT_EQ(gridGroupIndex(grid, {1, 2}, {1, 0}), 5 /* 2 * 2 + 1 */);
  EXPECT_EQ(gridGroupIndex(grid, {1, 2}, {1}), 2);
  Bundle bundle = Bundle::parseManifest("g.mtb", gridManifest().dump());
  EXPECT_EQ(shardOffsets(bundle.parameters()[0], grid, {1, 2}),
            (std::vector<int64_t>{0, 4}));
}

TEST(BundleGridTest, DataAxesSplitUnderExpertParallelismOnly) {
  using Axes = std::vector<int64_t>;
  // [dp, tp]; [dp, cp, tp] (the data axis holds every data-parallel rank);
  // [dp / ep, ep, tp] (expert parallelism over part of them: both axes).
  EXPECT_EQ(gridDataAxes({4, 2}, false, 4), Axes{0});
  EXPECT_EQ(gridDataAxes({4, 2, 1}, false, 4), Axes{0});
  EXPECT_EQ(gridDataAxes({1, 2, 1}, false, 1), Axes{0});
  EXPECT_EQ(gridDataAxes({2, 2, 1}, false, 4), (Axes{0, 1}));
  EXPECT_EQ(gridDataAxes({4, 2, 2}, false, 8), (Axes{0, 1}));
  // Pipelines put their axis first.
  EXPECT_EQ(gridDataAxes({2, 4, 1}, true, 4), Axes{1});
  EXPECT_EQ(gridDataAxes({2, 4, 2, 1}, true, 4), Axes{1});
  EXPECT_EQ(gridDataAxes({2, 2, 2, 1}, true, 4), (Axes{1, 2}));
  EXPECT_EQ(gridDataAxes({}, false, 1), Axes{});
}

TEST(BundleGridTest, BadGrids) {
  Json m = gridManifest();
  m["grid"] = {{"shape", {2, 0}}};
  expectManifestRejected(m, {"m.mtb': grid.shape[1]: found 0",
                             "expected an integer in [1, 65536]"});
  m["grid"] = {{"shape", Json::array()}};
  expectManifestRejected(
      m, {"grid.shape: found []", "expected at least one grid axis"});
  m["grid"] = {{"shape", {256, 256, 2}}};
  expectManifestRejected(m, {"grid.shape: found shape [256,256,2]",
                             "expected a grid of at most 65536 ranks"});
  m["grid"] = {{"shape", "2x3"}};
  expectManifestRejected(
      m, {"grid.shape: found a string \"2x3\"", "expected an array"});
  m["grid"] = 4;
  expectManifestRejected(m, {"grid: found an integer 4", "expected an object"});
  m.erase("grid");
  expectManifestRejected(
      m, {"parameters[0].split_axes: found [[],[1]]",
          "expected no split_axes in a bundle without a top-level "
          "\"grid\""});
}

TEST(BundleGridTest, BadSplitAxes) {
  Json m = gridManifest();
  split(m) = {{1}};
  expectManifestRejected(
      m, {"parameters[0].split_axes: found 1 lists",
          "expected one list per dimension of the shape [4, 6]"});
  split(m) = {Json::array(), {2}};
  expectManifestRejected(
      m, {"parameters[0].split_axes[1][0]: found 2",
          "expected a grid axis in [0, 2) (the grid is [2, 3])"});
  split(m) = {Json::array(), {1, 1}};
  expectManifestRejected(
      m, {"parameters[0].split_axes[1][1]: found 1, listed twice",
          "expected each grid axis at most once"});
  split(m) = {{0}, {0}};
  expectManifestRejected(
      m, {"parameters[0].split_axes[1][0]: found 0",
          "expected a grid axis that splits no other dimension"});
  split(m) = {{1}, Json::array()};
  expectManifestRejected(
      m, {"parameters[0].split_axes[0]: found [1] (3 ways)",
          "expected axes whose sizes' product divides dimension 0 "
          "of the shape [4, 6]"});
}

TEST(BundleGridTest, ParameterViewsHaveTheShardShape) {
  Json m = gridManifest();
  m["functions"][0]["values"][1]["shape"] = {4, 6};
  expectManifestRejected(m,
                         {"functions[0].instructions[0].results[0]",
                          "found [4, 6] f32 (value 1)",
                          "expected [4, 2] f32, the type of a rank's shard of "
                          "parameters[0] (w)"});
}

TEST(BundleGridTest, BadCollectiveAttributes) {
  Json m = gridManifest();
  attrs(m, 1)["grid_axes"] = {2};
  expectManifestRejected(m, {"instructions[1].attrs.grid_axes[0]: found 2",
                             "expected a grid axis in [0, 2)"});
  attrs(m, 1)["grid_axes"] = {0, 0};
  expectManifestRejected(m, {"grid_axes[1]: found 0, listed twice"});
  attrs(m, 1)["grid_axes"] = {1};
  attrs(m, 1)["reduction"] = "mean";
  expectManifestRejected(m, {"instructions[1].attrs.reduction: found \"mean\"",
                             "expected \"sum\" or \"max\""});
  attrs(m, 1).erase("reduction");
  expectManifestRejected(m, {"instructions[1].attrs.reduction",
                             "the attribute \"reduction\" of all_reduce"});
  m = gridManifest();
  attrs(m, 2)["gather_axis"] = 2;
  expectManifestRejected(m, {"instructions[2].attrs.gather_axis: found 2",
                             "expected an axis in [-2, 2) for rank 2"});
  m = gridManifest();
  m.erase("grid");
  m["parameters"][0].erase("split_axes");
  m["functions"][0]["values"][1]["shape"] = {4, 6};
  expectManifestRejected(m, {"instructions[1].attrs.grid_axes: found [1]",
                             "expected no collective (all_reduce) in a bundle "
                             "without a top-level \"grid\""});
}

TEST(BundleGridTest, BadCollectiveShapes) {
  Json m = gridManifest();
  m["functions"][0]["values"][2]["shape"] = {4, 6};
  expectManifestRejected(
      m, {"instructions[1].results[0]: found shape [4, 6]",
          "expected [4, 2] (the input's shape) for all_reduce"});
  m = gridManifest();
  attrs(m, 2)["gather_axis"] = 0;
  expectManifestRejected(m,
                         {"instructions[2].results[0]: found shape [4, 6]",
                          "expected [12, 2] (the input's shape with axis 0 "
                          "multiplied by the group size 3 (grid [2, 3] along "
                          "grid_axes [1]))"});
  m = gridManifest();
  attrs(m, 3)["grid_axes"] = {0};
  expectManifestRejected(
      m, {"instructions[3].results[0]: found shape [4, 2]",
          "expected [4, 3] (the input's shape with axis 1 divided "
          "by the group size 2"});
  m = gridManifest();
  attrs(m, 4)["slice_axis"] = 0;
  attrs(m, 4)["grid_axes"] = {1};
  expectManifestRejected(m,
                         {"instructions[4].operands[0]: found shape [4, 6]",
                          "expected a size along axis 0 divisible by the group "
                          "size 3"});
  m = gridManifest();
  m["functions"][0]["values"][6]["shape"] = {4};
  m["parameters"][1]["shape"] = {4};
  expectManifestRejected(
      m, {"instructions[6].operands[1]: found shape [4] (value 6)",
          "expected [6] (the input's last dimension) for bias_add"});
}

// Format version 7: a parameter tied across pipeline stages lists every
// pipeline rank that holds it (its embedding group), its owner first. Grid
// [4, 1, 3]: 4 pipeline ranks; no pipeline section (the stage functions'
// reads are checked against it in pipeline-bundle-errors.test).
TEST(BundleGridTest, PipelineRanks) {
  Json m = gridManifest();
  m["version"] = 7;
  m["grid"] = {{"shape", {4, 1, 3}}};
  split(m) = {Json::array(), {2}};
  for (Json &inst : m["functions"][0]["instructions"])
    if (inst.contains("attrs") && inst["attrs"].contains("grid_axes"))
      inst["attrs"]["grid_axes"] = {2};
  for (Json &p : m["parameters"])
    p["pipeline_rank"] = 0;
  {
    Bundle bundle = Bundle::parseManifest("g.mtb", m.dump());
    const Parameter &w = bundle.parameters()[0];
    EXPECT_EQ(w.pipelineRank, 0);
    EXPECT_EQ(w.pipelineRanks, (std::vector<int64_t>{0}));
    EXPECT_TRUE(w.heldOnPipelineRank(0));
    EXPECT_FALSE(w.heldOnPipelineRank(3));
  }
  Json &w = m["parameters"][0];
  w["pipeline_ranks"] = {0, 3};
  expectManifestRejected(
      m, {"parameters[0].pipeline_ranks: found pipeline ranks in "
          "a bundle without a pipeline section",
          "expected pipeline_ranks only in a pipeline bundle"});
  w["pipeline_ranks"] = {0, 4};
  expectManifestRejected(m, {"parameters[0].pipeline_ranks[1]: found 4",
                             "expected an integer in [0, 3]"});
  w["pipeline_ranks"] = {0, 3, 3};
  expectManifestRejected(m, {"parameters[0].pipeline_ranks[2]: found 3",
                             "expected a pipeline rank above 3 (the list is "
                             "increasing)"});
  w["pipeline_ranks"] = {0};
  expectManifestRejected(
      m, {"parameters[0].pipeline_ranks: found [0]",
          "expected at least two pipeline ranks (a parameter on "
          "one rank has pipeline_rank only)"});
  w["pipeline_ranks"] = {1, 3};
  expectManifestRejected(m,
                         {"parameters[0].pipeline_ranks[0]: found 1",
                          "expected the parameter's pipeline_rank 0 (the owner "
                          "comes first)"});
  w["pipeline_ranks"] = "0,3";
  expectManifestRejected(
      m, {"parameters[0].pipeline_ranks: found a string \"0,3\"",
          "expected an array"});
  w["pipeline_ranks"] = {0, 3};
  w.erase("pipeline_rank");
  expectManifestRejected(m,
                         {"parameters[0].pipeline_ranks: found pipeline_ranks "
                          "without pipeline_rank",
                          "expected pipeline_rank beside it"});
  w["pipeline_rank"] = 0;
  m["version"] = 6;
  expectManifestRejected(
      m, {"parameters[0].pipeline_ranks: found pipeline_ranks in a "
          "version 6 manifest",
          "expected none before format version 7"});
}

} // namespace
