// Every op kind: forward shape == the IR's inferred shape, backward reaches every parameter; and
// hand-computed values for linear, attention, embedding_bag, embedding and cross_entropy.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "runtime/exec/synthetic.h"
#include "runtime/tests/test_models.h"

namespace gp::runtime {
namespace {

TEST(Ops, EveryKindForwardShapeMatchesIrAndBackwardRuns) {
  ir::Graph g = ir::Graph::build(testing::all_kinds_model());
  std::set<ir::OpKind> kinds;
  for (size_t i = 0; i < g.num_ops(); ++i) kinds.insert(g.op(OpId(static_cast<int32_t>(i))).kind);
  EXPECT_EQ(kinds.size(), static_cast<size_t>(ir::OpKind::cross_entropy) + 1) << "a kind is not covered";

  StageModule m(g, g.op_ids(), 7);
  const int64_t b = 3;
  MicroBatchInfo info{0, b, b, 0};
  TensorMap out = m.forward(synthetic_external_inputs(m, info), info);
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const ir::Op& op = g.op(OpId(static_cast<int32_t>(i)));
    std::vector<int64_t> want = op.output_shape;
    if (!want.empty()) want[0] = b;
    EXPECT_EQ(out.at(op.name).sizes().vec(), want) << op.name;
  }
  torch::Tensor loss = m.scaled_loss(out, info);
  ASSERT_TRUE(loss.defined());
  EXPECT_EQ(loss.dim(), 0);
  loss.backward();
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0) << name;
  }
  // Parameter count equals the IR's derived count.
  int64_t n = 0;
  for (auto& p : m.parameters()) n += p.numel();
  EXPECT_EQ(n, g.total_params());
}

void set_params(StageModule& m, const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard ng;
  auto ps = m.parameters();
  ASSERT_EQ(ps.size(), values.size());
  for (size_t i = 0; i < ps.size(); ++i) ps[i].copy_(values[i]);
}

TEST(Ops, LinearHandComputed) {
  ir::ModelBuilder b("lin");
  std::string x = b.input("x", {2});
  std::string y = b.linear("fc", x, 3);
  b.output(b.op("loss", ir::OpKind::mse_loss, {y, b.input("t", {3})}));
  ir::Graph g = ir::Graph::build(b.build());
  StageModule m(g, {g.find("fc")}, 1);
  set_params(m, {torch::tensor({1.f, 0.f, 0.f, 1.f, 1.f, 1.f}).view({3, 2}), torch::tensor({0.5f, 0.f, -1.f})});
  MicroBatchInfo info{0, 1, 1, 0};
  torch::Tensor out = m.forward({{"x", torch::tensor({1.f, 2.f}).view({1, 2})}}, info).at("fc");
  EXPECT_TRUE(torch::equal(out, torch::tensor({1.5f, 2.f, 2.f}).view({1, 3}))) << out;
}

TEST(Ops, EmbeddingBagSumsRows) {
  ir::ModelBuilder b("emb");
  std::string i = b.input("i", {2}, ir::DType::i64);
  std::string e = b.op("e", ir::OpKind::embedding_bag, {i}, {{"rows", 3}, {"dim", 2}});
  b.output(b.op("loss", ir::OpKind::mse_loss, {e, b.input("t", {2})}));
  ir::Graph g = ir::Graph::build(b.build());
  StageModule m(g, {g.find("e")}, 1);
  set_params(m, {torch::tensor({1.f, 2.f, 10.f, 20.f, 100.f, 200.f}).view({3, 2})});
  torch::Tensor idx = torch::tensor({0, 2, 1, 1}, torch::kLong).view({2, 2});
  torch::Tensor out = m.forward({{"i", idx}}, {0, 2, 2, 0}).at("e");
  EXPECT_TRUE(torch::equal(out, torch::tensor({101.f, 202.f, 20.f, 40.f}).view({2, 2}))) << out;
}

TEST(Ops, EmbeddingLooksUpRowsAndAddsLearnedPositions) {
  ir::ModelBuilder b("tok");
  std::string i = b.input("i", {3}, ir::DType::i64);
  std::string e = b.op("e", ir::OpKind::embedding, {i}, {{"rows", 3}, {"dim", 2}, {"positions", true}});
  b.output(b.op("loss", ir::OpKind::mse_loss, {e, b.input("t", {3, 2})}));
  ir::Graph g = ir::Graph::build(b.build());
  StageModule m(g, {g.find("e")}, 1);
  set_params(m, {torch::tensor({1.f, 2.f, 10.f, 20.f, 100.f, 200.f}).view({3, 2}),
                 torch::tensor({0.f, 0.f, 0.5f, 0.5f, -1.f, -1.f}).view({3, 2})});
  torch::Tensor idx = torch::tensor({2, 0, 1, 1, 1, 0}, torch::kLong).view({2, 3});
  torch::Tensor out = m.forward({{"i", idx}}, {0, 2, 2, 0}).at("e");
  torch::Tensor want = torch::tensor({100.f, 200.f, 1.5f, 2.5f, 9.f, 19.f, 10.f, 20.f, 10.5f, 20.5f, 0.f, 1.f});
  EXPECT_TRUE(torch::equal(out, want.view({2, 3, 2}))) << out;
}

TEST(Ops, CrossEntropyIsMeanNegativeLogSoftmax) {
  ir::ModelBuilder b("ce");
  std::string z = b.input("z", {3});
  std::string l = b.input("l", {}, ir::DType::i64);
  b.output(b.op("ce", ir::OpKind::cross_entropy, {z, l}));
  ir::Graph g = ir::Graph::build(b.build());
  StageModule m(g, {g.find("ce")}, 1);
  torch::Tensor logits = torch::tensor({0.f, 0.f, 0.f, 1.f, 2.f, 3.f}).view({2, 3});
  torch::Tensor out = m.forward({{"z", logits}, {"l", torch::tensor({0, 2}, torch::kLong)}}, {0, 2, 2, 0}).at("ce");
  double e1 = std::log(3.0), e2 = -std::log(std::exp(3.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0)));
  EXPECT_NEAR(out.item<double>(), (e1 + e2) / 2, 1e-6);
}

TEST(Ops, AttentionMatchesPerHeadManualComputation) {
  const int64_t s = 5, h = 6, heads = 3, dh = h / heads;
  ir::ModelBuilder b("att");
  std::string x = b.input("x", {s, h});
  std::string a = b.op("a", ir::OpKind::attention, {x}, {{"heads", heads}});
  b.output(b.op("loss", ir::OpKind::mse_loss, {a, b.input("t", {s, h})}));
  ir::Graph g = ir::Graph::build(b.build());
  StageModule m(g, {g.find("a")}, 3);
  auto named = m.named_parameters();
  ASSERT_EQ(named.size(), 8u);
  EXPECT_EQ(named[0].first, "a/wq");
  EXPECT_EQ(named[7].first, "a/bo");
  auto W = [&](int i) { return named[static_cast<size_t>(i)].second.detach(); };
  torch::Tensor xin = torch::randn({2, s, h});
  torch::Tensor out = m.forward({{"x", xin}}, {0, 2, 2, 0}).at("a").detach();
  for (int64_t n = 0; n < 2; ++n) {
    torch::Tensor xs = xin[n];  // [s, h]
    torch::Tensor q = xs.matmul(W(0).t()) + W(1), k = xs.matmul(W(2).t()) + W(3), v = xs.matmul(W(4).t()) + W(5);
    std::vector<torch::Tensor> heads_out;
    for (int64_t hd = 0; hd < heads; ++hd) {
      auto cols = [&](const torch::Tensor& t) { return t.slice(1, hd * dh, (hd + 1) * dh); };
      torch::Tensor sc = cols(q).matmul(cols(k).t()) / std::sqrt(static_cast<double>(dh));
      torch::Tensor p = sc.exp() / sc.exp().sum(1, true);
      heads_out.push_back(p.matmul(cols(v)));
    }
    torch::Tensor want = torch::cat(heads_out, 1).matmul(W(6).t()) + W(7);
    EXPECT_TRUE(torch::allclose(out[n], want, 1e-5, 1e-6)) << out[n] << want;
  }
}

// Causal and padding masks against torch's own scaled_dot_product_attention (boolean attn_mask:
// true = the key takes part) or BERT's additive (1 - m) * -10000, forward and backward (x and all
// eight parameters).
struct MaskCase {
  const char* what;
  bool causal;
  const char* mask;  // "" (none), "keep", "ignore"
  bool fill;         // attrs.mask_fill = -10000 (added) instead of -inf
  bool float_mask;   // the mask input is f32 instead of i64
};

void expect_attention_like_torch(const MaskCase& c) {
  SCOPED_TRACE(c.what);
  const int64_t batch = 3, s = 6, h = 8, heads = 2, dh = h / heads;
  ir::ModelBuilder b("att");
  std::string x = b.input("x", {s, h});
  std::vector<std::string> in{x};
  Json attrs{{"heads", heads}};
  if (c.causal) attrs["causal"] = true;
  if (*c.mask) {
    in.push_back(b.input("m", {s}, c.float_mask ? ir::DType::f32 : ir::DType::i64));
    attrs["mask"] = c.mask;
    if (c.fill) attrs["mask_fill"] = -10000.0;
  }
  std::string a = b.op("a", ir::OpKind::attention, in, attrs);
  b.output(b.op("loss", ir::OpKind::mse_loss, {a, b.input("t", {s, h})}));
  ir::Graph g = ir::Graph::build(b.build());
  StageModule m(g, {g.find("a")}, 7);
  auto named = m.named_parameters();
  torch::manual_seed(5);
  torch::Tensor xin = torch::randn({batch, s, h}).requires_grad_();
  // Sample 0 keeps every key, sample 1 the first 4, sample 2 only the first.
  torch::Tensor keep =
      torch::tensor({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0}, torch::kLong).view({batch, s});
  torch::Tensor min = std::string(c.mask) == "ignore" ? 1 - keep : keep;
  if (c.float_mask) min = min.to(torch::kFloat32);
  TensorMap feed{{"x", xin}};
  if (*c.mask) feed.emplace("m", min);
  torch::Tensor out = m.forward(feed, {0, batch, batch, 0}).at("a");
  torch::Tensor r = torch::randn({batch, s, h});
  (out * r).sum().backward();

  // The reference on copies of the same weights.
  std::vector<torch::Tensor> w;
  for (auto& [n, t] : named) w.push_back(t.detach().clone().requires_grad_());
  torch::Tensor xr = xin.detach().clone().requires_grad_();
  auto split = [&](const torch::Tensor& t) { return t.view({batch, s, heads, dh}).transpose(1, 2); };
  torch::Tensor q = split(torch::linear(xr, w[0], w[1])), k = split(torch::linear(xr, w[2], w[3])),
                v = split(torch::linear(xr, w[4], w[5]));
  torch::Tensor ctx;
  if (c.fill) {  // BERT: scores + (1 - m) * -10000
    torch::Tensor bias = ((1 - keep).to(torch::kFloat32) * -10000.0).view({batch, 1, 1, s});
    torch::Tensor sc = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(dh)) + bias;
    if (c.causal) sc = sc.masked_fill(torch::ones({s, s}, torch::kBool).triu(1), -INFINITY);
    ctx = torch::matmul(torch::softmax(sc, -1), v);
  } else {
    torch::Tensor allowed = torch::ones({batch, 1, s, s}, torch::kBool);
    if (c.causal) allowed = allowed & torch::ones({s, s}, torch::kBool).tril();
    if (*c.mask) allowed = allowed & keep.to(torch::kBool).view({batch, 1, 1, s});
    ctx = torch::scaled_dot_product_attention(q, k, v, allowed);
  }
  torch::Tensor want = torch::linear(ctx.transpose(1, 2).reshape({batch, s, h}), w[6], w[7]);
  (want * r).sum().backward();
  EXPECT_TRUE(torch::allclose(out.detach(), want.detach(), 1e-5, 1e-6)) << out << want;
  EXPECT_TRUE(torch::allclose(xin.grad(), xr.grad(), 1e-5, 1e-6)) << xin.grad() << xr.grad();
  for (size_t i = 0; i < named.size(); ++i)
    EXPECT_TRUE(torch::allclose(named[i].second.grad(), w[i].grad(), 1e-5, 1e-6)) << named[i].first;
}

TEST(Ops, AttentionCausalEqualsTorchSdpa) { expect_attention_like_torch({"causal", true, "", false, false}); }
TEST(Ops, AttentionKeepMaskEqualsTorchSdpa) { expect_attention_like_torch({"keep", false, "keep", false, false}); }
TEST(Ops, AttentionIgnoreMaskF32EqualsTorchSdpa) {
  expect_attention_like_torch({"ignore", false, "ignore", false, true});
}
TEST(Ops, AttentionCausalAndKeepMaskEqualsTorchSdpa) {
  expect_attention_like_torch({"causal+keep", true, "keep", false, false});
}
TEST(Ops, AttentionAdditiveFillEqualsBertsMask) { expect_attention_like_torch({"fill", false, "keep", true, false}); }

TEST(Ops, AttentionMaskChangesTheOutputOnlyWhereKeysAreMasked) {
  // Full vs causal: query s-1 sees every key either way (equal rows); query 0 differs.
  const int64_t s = 4, h = 4;
  auto build = [&](bool causal) {
    ir::ModelBuilder b("att");
    std::string x = b.input("x", {s, h});
    Json attrs{{"heads", 2}};
    if (causal) attrs["causal"] = true;
    std::string a = b.op("a", ir::OpKind::attention, {x}, attrs);
    b.output(b.op("loss", ir::OpKind::mse_loss, {a, b.input("t", {s, h})}));
    return ir::Graph::build(b.build());
  };
  ir::Graph full = build(false), causal = build(true);
  StageModule mf(full, {full.find("a")}, 3), mc(causal, {causal.find("a")}, 3);
  torch::Tensor xin = torch::randn({1, s, h});
  torch::Tensor yf = mf.forward({{"x", xin}}, {0, 1, 1, 0}).at("a").detach();
  torch::Tensor yc = mc.forward({{"x", xin}}, {0, 1, 1, 0}).at("a").detach();
  EXPECT_TRUE(torch::allclose(yf[0][s - 1], yc[0][s - 1], 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(yf[0][0], yc[0][0], 1e-3, 1e-4));
}

TEST(Ops, DropoutKeepsExpectedFractionAndScales) {
  ir::ModelBuilder b("d");
  std::string x = b.input("x", {1000});
  std::string d = b.op("d", ir::OpKind::dropout, {x}, {{"p", 0.25}});
  b.output(b.op("loss", ir::OpKind::mse_loss, {d, b.input("t", {1000})}));
  ir::Graph g = ir::Graph::build(b.build());
  StageModule m(g, {g.find("d")}, 1);
  torch::Tensor out = m.forward({{"x", torch::ones({4, 1000})}}, {0, 4, 4, 0}).at("d");
  double kept = out.ne(0).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(kept, 0.75, 0.03);
  EXPECT_NEAR(out.max().item<double>(), 1 / 0.75, 1e-6);
  // Another step gives another mask; the same step the same mask.
  torch::Tensor again = m.forward({{"x", torch::ones({4, 1000})}}, {0, 4, 4, 0}).at("d");
  torch::Tensor next = m.forward({{"x", torch::ones({4, 1000})}}, {0, 4, 4, 1}).at("d");
  EXPECT_TRUE(torch::equal(out, again));
  EXPECT_FALSE(torch::equal(out, next));
}

}  // namespace
}  // namespace gp::runtime
