// The profiler: signature de-duplication, progress text, batch parsing, and a small real profiling
// run whose numbers are positive, grow with the batch and stay within 100x of the cpu roofline.
#include <gtest/gtest.h>

#include <sstream>

#include "cost/cost_model.h"
#include "profiler/profiler.h"

namespace gp::profiler {
namespace {

ir::Graph two_layer(int64_t seq, int64_t hidden, int64_t out) {
  ir::ModelBuilder b("p");
  std::string x = b.input("x", {seq, hidden});
  std::string h = b.linear("fc1", x, out);
  std::string a = b.unary("act", ir::OpKind::relu, h);
  std::string y = b.linear("fc2", a, out);  // same signature as fc1 when hidden == out
  b.output(b.op("loss", ir::OpKind::mse_loss, {y, b.input("t", {seq, out})}));
  return ir::Graph::build(b.build());
}

TEST(Profiler, ParseBatches) {
  EXPECT_EQ(parse_batches("1,2,4,8", "--batches"), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(parse_batches("16", "--batches"), (std::vector<int64_t>{16}));
  EXPECT_THROW(parse_batches("1,,2", "--batches"), UserError);
  EXPECT_THROW(parse_batches("0,2", "--batches"), UserError);
  EXPECT_THROW(parse_batches("2x", "--batches"), UserError);
}

TEST(Profiler, OneEntryPerSignatureWithProgress) {
  ir::Graph g = two_layer(4, 8, 8);
  ProfileOptions opt;
  opt.batches = {2, 1};
  opt.warmup = 0;
  opt.repeats = 1;
  std::ostringstream progress;
  cost::Profile p = profile_graph(g, opt, &progress);
  EXPECT_EQ(p.ops.size(), 3u);  // linear (fc1 == fc2), relu, mse_loss
  const auto& lin = p.ops.at(cost::op_signature(g, g.find("fc1")));
  EXPECT_EQ(lin.kind, "linear");
  EXPECT_EQ(lin.batches, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(p.ops.count(cost::op_signature(g, g.find("fc2"))), 1u);
  EXPECT_EQ(describe_op(g, g.find("fc1")), "linear [B, 4, 8] -> [B, 4, 8]");
  EXPECT_NE(progress.str().find("[1/3] linear [B, 4, 8] -> [B, 4, 8] b=1,2 ..."), std::string::npos)
      << progress.str();
  EXPECT_EQ(p.device.rfind("cpu: ", 0), 0u) << p.device;
}

TEST(Profiler, RealLinearTimesArePositiveOrderedAndNearRoofline) {
  ir::Graph g = two_layer(64, 256, 512);
  ProfileOptions opt;
  opt.batches = {2, 16};
  opt.warmup = 1;
  opt.repeats = 3;
  cost::Profile p = profile_graph(g, opt, nullptr);
  OpId fc1 = g.find("fc1");
  const auto& m = p.ops.at(cost::op_signature(g, fc1));
  cost::CostModel roof(g, cost::load_cluster("cpu"));
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_GT(m.fwd_s[i], 0);
    EXPECT_GT(m.bwd_s[i], 0);
    cost::OpTime r = roof.op_time(fc1, m.batches[i]);
    EXPECT_EQ(r.source, cost::Source::formula);
    double ratio = (m.fwd_s[i] + m.bwd_s[i]) / (r.fwd_s + r.bwd_s);
    EXPECT_GT(ratio, 0.01) << "b=" << m.batches[i];
    EXPECT_LT(ratio, 100.0) << "b=" << m.batches[i];
  }
  EXPECT_LT(m.fwd_s[0], m.fwd_s[1]);
  EXPECT_LT(m.bwd_s[0], m.bwd_s[1]);
}

}  // namespace
}  // namespace gp::profiler
