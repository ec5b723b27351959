// The host backend's GEMMs fused with their epilogues (linear_gelu,
// linear_gelu_grad, linear_weight_bias_grad, linear_add) against the ops
// each one means, in one function from the same inputs: bit for bit.
#include "BundleTestBuilder.h"

#include "core/Random.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include <gtest/gtest.h>

#include <cstring>

using namespace mtrt;
using namespace mtrt::test;

namespace {

host::Tensor randomInput(std::vector<int64_t> shape, uint64_t seed) {
  host::Tensor t(DType::F32, std::move(shape));
  for (int64_t i = 0; i < t.numElements(); ++i)
    t.data<float>()[i] =
        static_cast<float>(random::normal(seed, 17, static_cast<uint64_t>(i)));
  return t;
}

/// Runs `f` on the host with one random input per entry of `shapes` and
/// returns its outputs.
std::vector<host::Tensor>
runHost(FunctionBuilder &f, const std::vector<std::vector<int64_t>> &shapes) {
  Json manifest = manifestJson(modelJson(256, 8, 4, 2, 2), Json::array(),
                               Json::array({f.build()}));
  Bundle bundle = Bundle::parseManifest("fused-test", manifest.dump());
  host::ThreadPool pool(2);
  host::ParameterStore store(bundle, DType::F32);
  std::vector<host::Tensor> inputs;
  std::vector<host::TensorView> views;
  uint64_t seed = 40;
  for (const auto &shape : shapes)
    inputs.push_back(randomInput(shape, ++seed));
  for (const host::Tensor &t : inputs)
    views.push_back({t.dtype, t.shape, t.buffer.data()});
  host::Executor executor(bundle, "op", store, pool);
  return executor.run(views, {1, 1});
}

void expectSameBits(const host::Tensor &a, const host::Tensor &b,
                    const std::string &what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  ASSERT_EQ(a.buffer.size(), b.buffer.size()) << what;
  EXPECT_EQ(std::memcmp(a.buffer.data(), b.buffer.data(), a.buffer.size()), 0)
      << what;
}

/// Each fused op beside its unfused ops; outputs alternate fused, unfused.
void fusedBesideUnfused(bool transposed, const char *approximate) {
  int64_t rows = 6, in = 5, out = 7;
  std::vector<int64_t> wShape = transposed ? std::vector<int64_t>{out, in}
                                           : std::vector<int64_t>{in, out};
  std::vector<std::vector<int64_t>> shapes = {
      {2, rows / 2, in}, wShape, {out}, {2, rows / 2, out}, {2, rows / 2, in}};
  FunctionBuilder f("op");
  int64_t x = f.input(shapes[0], "f32"), w = f.input(shapes[1], "f32"),
          b = f.input(shapes[2], "f32"), h = f.input(shapes[3], "f32"),
          dz = f.input(shapes[4], "f32");
  std::vector<int64_t> act = {2, rows / 2, out};
  Json linearAttrs = Json::object();
  if (transposed)
    linearAttrs["transpose_weight"] = true;
  Json geluAttrs = linearAttrs;
  geluAttrs["approximate"] = approximate;
  Json gelu = {{"approximate", approximate}};
  auto pair = [&](const char *op, std::vector<int64_t> operands,
                  std::vector<std::vector<int64_t>> resultShapes, Json attrs) {
    std::vector<int64_t> values;
    for (auto &shape : resultShapes)
      values.push_back(f.value(shape));
    f.inst(op, operands, values, attrs);
    return values;
  };
  // linear_gelu = gelu(linear(x, w, b)), and the pre-activation.
  auto fused = pair("linear_gelu", {x, w, b}, {act, act}, geluAttrs);
  int64_t pre = f.op("linear", {x, w, b}, act, linearAttrs);
  int64_t y = f.op("gelu", {pre}, act, gelu);
  for (int64_t v : {fused[0], y, fused[1], pre})
    f.output(v);
  // linear_gelu_grad = gelu_grad(linear(dz, w), h) and its bias_grad.
  fused = pair("linear_gelu_grad", {dz, w, h}, {act, {out}}, geluAttrs);
  int64_t product = f.op("linear", {dz, w}, act, linearAttrs);
  int64_t dh = f.op("gelu_grad", {product, h}, act, gelu);
  int64_t db = f.op("bias_grad", {dh}, {out});
  for (int64_t v : {fused[0], dh, fused[1], db})
    f.output(v);
  // linear_weight_bias_grad = linear_weight_grad(x, h) and bias_grad(h).
  fused = pair("linear_weight_bias_grad", {x, h}, {wShape, {out}}, linearAttrs);
  int64_t dw = f.op("linear_weight_grad", {x, h}, wShape, linearAttrs);
  int64_t dbias = f.op("bias_grad", {h}, {out});
  for (int64_t v : {fused[0], dw, fused[1], dbias})
    f.output(v);
  // linear_add = add(linear(x, w[, b]), h), with and without the bias.
  fused = pair("linear_add", {x, w, h, b}, {act}, linearAttrs);
  int64_t sum =
      f.op("add", {f.op("linear", {x, w, b}, act, linearAttrs), h}, act);
  f.output(fused[0]);
  f.output(sum);
  fused = pair("linear_add", {x, w, h}, {act}, linearAttrs);
  sum = f.op("add", {h, f.op("linear", {x, w}, act, linearAttrs)}, act);
  f.output(fused[0]);
  f.output(sum);
  std::vector<host::Tensor> outputs = runHost(f, shapes);
  ASSERT_EQ(outputs.size(), 16u);
  for (size_t i = 0; i < outputs.size(); i += 2)
    expectSameBits(outputs[i], outputs[i + 1],
                   "outputs[" + std::to_string(i) + "]");
}

TEST(HostFusedGemmTest, FusedOpsEqualTheirUnfusedOps) {
  fusedBesideUnfused(false, "tanh");
}

TEST(HostFusedGemmTest, TransposedWeightAndErfGelu) {
  fusedBesideUnfused(true, "erf");
}

} // namespace
