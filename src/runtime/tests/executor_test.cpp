// Determinism and partition independence of StageModule and the synthetic data.
#include <gtest/gtest.h>

#include "runtime/exec/stable_hash.h"
#include "runtime/exec/stage_module.h"
#include "runtime/exec/synthetic.h"
#include "runtime/tests/test_models.h"

namespace gp::runtime {
namespace {

TEST(StableHash, FixedValuesAndLengthPrefix) {
  // Pinned: a change here changes every initial weight and data set (and old checkpoints' meaning).
  // Value computed independently (FNV-1a 64 over seed + length-prefixed parts, then splitmix64).
  EXPECT_EQ(stable_hash({"param", "fc", "weight"}, 1), 0x4686e7d66da73f06ULL);
  EXPECT_NE(stable_hash({"ab", "c"}, 1), stable_hash({"a", "bc"}, 1));
  EXPECT_NE(stable_hash({"x"}, 1), stable_hash({"x"}, 2));
  EXPECT_NE(stable_hash_ints(5, {1, 2}), stable_hash_ints(5, {2, 1}));
}

TEST(StageModule, SameSeedSameParamsAndIndependentOfStageSplit) {
  ir::Graph g = ir::Graph::build(testing::all_kinds_model());
  StageModule a(g, g.op_ids(), 11), b(g, g.op_ids(), 11), c(g, g.op_ids(), 12);
  auto pa = a.named_parameters(), pb = b.named_parameters(), pc = c.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  bool any_diff = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
    any_diff |= !torch::equal(pa[i].second, pc[i].second);
  }
  EXPECT_TRUE(any_diff) << "seed has no effect";
  // A stage holding only "attn" gets exactly the whole model's attention weights.
  StageModule only(g, {g.find("attn")}, 11);
  auto po = only.named_parameters();
  ASSERT_EQ(po.size(), 8u);
  for (auto& [name, t] : po) {
    auto it = std::find_if(pa.begin(), pa.end(), [&](auto& p) { return p.first == name; });
    ASSERT_NE(it, pa.end()) << name;
    EXPECT_TRUE(torch::equal(t, it->second)) << name;
  }
  EXPECT_EQ(only.external_inputs(), std::vector<std::string>{"drop"});
  EXPECT_TRUE(only.loss_ops().empty());
  EXPECT_EQ(a.loss_ops(), (std::vector<std::string>{"ce", "mse", "bce"}));
}

TEST(Synthetic, SampleRangesConcatenateAndDependOnStep) {
  ir::Graph g = ir::Graph::build(testing::all_kinds_model());
  for (int i = 0; i < static_cast<int>(g.model().inputs.size()); ++i) {
    torch::Tensor whole = synthetic_input(g, i, 0, 8, 5, 2);
    torch::Tensor parts = torch::cat({synthetic_input(g, i, 0, 4, 5, 2), synthetic_input(g, i, 4, 4, 5, 2)});
    EXPECT_TRUE(torch::equal(whole, parts)) << g.model().inputs[static_cast<size_t>(i)].name;
    EXPECT_FALSE(torch::equal(whole, synthetic_input(g, i, 0, 8, 5, 3)));
  }
  // i64 ranges come from the consumers: embedding rows (10) and classes (5).
  torch::Tensor idx = synthetic_input(g, 1, 0, 64, 5, 0), lab = synthetic_input(g, 2, 0, 64, 5, 0);
  EXPECT_EQ(idx.scalar_type(), torch::kLong);
  EXPECT_EQ(idx.sizes().vec(), (std::vector<int64_t>{64, 4}));
  EXPECT_EQ(lab.sizes().vec(), (std::vector<int64_t>{64}));
  EXPECT_GE(idx.min().item<int64_t>(), 0);
  EXPECT_EQ(idx.max().item<int64_t>(), 9);
  EXPECT_EQ(lab.max().item<int64_t>(), 4);
}

TEST(Synthetic, FeaturesAreStandardNormalWindowsThatDifferPerSampleAndInput) {
  // A feature sample is the sum of two windows of one pool of normal(0, 1) values (over sqrt 2), at
  // offsets per (input, sample, step), wrapping round the pool's end (a sample of 3M values always does).
  ir::ModelBuilder b("features");
  std::string a = b.input("a", {8, 16}), c = b.input("c", {8, 16}), big = b.input("big", {3 << 20});
  for (const std::string& in : {a, c, big}) b.output(b.unary("relu_" + in, ir::OpKind::relu, in));
  ir::Graph g = ir::Graph::build(b.build());
  torch::Tensor xa = synthetic_input(g, 0, 0, 512, 5, 0), xc = synthetic_input(g, 1, 0, 512, 5, 0);
  EXPECT_NEAR(xa.mean().item<double>(), 0.0, 0.02);
  EXPECT_NEAR(xa.std().item<double>(), 1.0, 0.02);
  torch::Tensor rows = xa.reshape({512, -1});
  EXPECT_EQ(std::get<0>(at::unique_dim(rows, 0)).size(0), 512);  // no two samples alike
  EXPECT_FALSE(torch::equal(xa, xc));                            // nor two inputs
  torch::Tensor x = synthetic_input(g, 2, 0, 2, 5, 0);
  EXPECT_NEAR(x.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(x.std().item<double>(), 1.0, 0.01);
  EXPECT_TRUE(torch::equal(x[0].narrow(0, 0, 1 << 20), x[0].narrow(0, 1 << 20, 1 << 20)));  // the pool, again
}

TEST(Synthetic, TargetsAreAFunctionOfTheFeatures) {
  ir::Graph g = ir::Graph::build(testing::all_kinds_model());
  int source = teacher_source(g);
  ASSERT_GE(source, 0);
  EXPECT_EQ(g.model().inputs[static_cast<size_t>(source)].dtype, ir::DType::f32);
  // Labels (input 2, 5 classes): spread over the classes, and equal for equal features: the same
  // sample at another step has other features and (mostly) another label.
  torch::Tensor lab = synthetic_input(g, 2, 0, 256, 5, 0);
  EXPECT_GE(std::get<0>(at::_unique(lab)).numel(), 4);
  torch::Tensor again = synthetic_input(g, 2, 0, 256, 5, 0), other = synthetic_input(g, 2, 0, 256, 5, 1);
  EXPECT_TRUE(torch::equal(lab, again));
  EXPECT_GT(lab.ne(other).sum().item<int64_t>(), 100);
}

TEST(StageModule, MicroBatchSplitGivesSameOutputsAndAccumulatedGradients) {
  ir::Graph g = ir::Graph::build(testing::all_kinds_model(/*with_batchnorm=*/false));
  StageModule whole(g, g.op_ids(), 3), split(g, g.op_ids(), 3);
  const int64_t B = 8, step = 4;
  MicroBatchInfo all{0, B, B, step}, m0{0, 4, B, step}, m1{4, 4, B, step};
  TensorMap o = whole.forward(synthetic_external_inputs(whole, all), all);
  TensorMap o0 = split.forward(synthetic_external_inputs(split, m0), m0);
  TensorMap o1 = split.forward(synthetic_external_inputs(split, m1), m1);
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const ir::Op& op = g.op(OpId(static_cast<int32_t>(i)));
    if (ir::is_loss(op.kind)) continue;
    EXPECT_TRUE(torch::allclose(o.at(op.name), torch::cat({o0.at(op.name), o1.at(op.name)}), 1e-5, 1e-6)) << op.name;
  }
  torch::Tensor l = whole.scaled_loss(o, all);
  torch::Tensor l0 = split.scaled_loss(o0, m0), l1 = split.scaled_loss(o1, m1);
  EXPECT_NEAR(l.item<double>(), l0.item<double>() + l1.item<double>(), 1e-5 * std::abs(l.item<double>()));
  l.backward();
  l0.backward();
  l1.backward();
  auto pw = whole.named_parameters(), ps = split.named_parameters();
  for (size_t i = 0; i < pw.size(); ++i)
    EXPECT_TRUE(torch::allclose(pw[i].second.grad(), ps[i].second.grad(), 1e-4, 1e-6)) << pw[i].first;
}

TEST(StageModule, MissingExternalInputIsReported) {
  ir::Graph g = ir::Graph::build(testing::all_kinds_model());
  StageModule m(g, {g.find("attn")}, 1);
  EXPECT_THROW(m.forward({}, {0, 2, 2, 0}), RuntimeFailure);
}

}  // namespace
}  // namespace gp::runtime
