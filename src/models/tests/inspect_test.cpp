// Inspection: branch counts from the SP tree equal the zoo parameters; summary text; DOT; units.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "models/inspect.h"
#include "models/zoo.h"

namespace gp::models {
namespace {

using ::testing::HasSubstr;

ir::Graph build(const std::string& spec) { return ir::Graph::build(build_builtin(spec), spec); }

TEST(Inspect, BranchCountsEqualTheParameters) {
  struct Case {
    std::string spec;
    std::vector<int> widths;
  };
  for (const Case& c : std::vector<Case>{
           {"mmt:branches=3,layers=2,seq=8,hidden=32,heads=4,ffn=64", {3}},
           {"mmt", {4}},
           {"dlrm:dense_branches=2,embedding_branches=5,layers=2,hidden=16,rows=10,dim=4,bag=3", {7}},
           {"dlrm", {14}},
           {"candle-uno:branches=5,layers=3,hidden=16", {5}},
           {"candle-uno", {7}},
           {"inception:blocks=3,channels=4,image=32,classes=10", {4, 4, 4}},
           {"inception", std::vector<int>(9, 4)},
           {"gpt:layers=3,seq=8,hidden=32,heads=4,ffn=64,vocab=50", {}},
       }) {
    SpStructure sp = sp_structure(build(c.spec));
    EXPECT_TRUE(sp.series_parallel) << c.spec << ": " << sp.failure;
    EXPECT_EQ(sp.spine_parallel_widths(), c.widths) << c.spec;
    int max_width = c.widths.empty() ? 1 : *std::max_element(c.widths.begin(), c.widths.end());
    EXPECT_EQ(sp.max_parallel_width(), max_width) << c.spec;
  }
}

TEST(Inspect, DescribesTheStructureInAFewLines) {
  ir::Graph mmt = build("mmt:branches=3,layers=2,seq=8,hidden=32,heads=4,ffn=64");
  EXPECT_EQ(describe_structure(mmt, sp_structure(mmt)),
            "series-parallel: yes\n"
            "structure: series of 4: [parallel of 3 branches x 17 ops] -> 2 ops -> loss\n"
            "widest parallel: 3 branches");
  ir::Graph dlrm = build("dlrm:dense_branches=7,embedding_branches=7,layers=1,hidden=16,rows=10,dim=4,bag=3");
  EXPECT_THAT(describe_structure(dlrm, sp_structure(dlrm)),
              HasSubstr("[parallel of 14 branches: 7 x 2 ops, 7 x 1 op] -> 6 ops -> loss"));
  ir::Graph inc = build("inception:blocks=3,channels=4,image=32,classes=10");
  EXPECT_THAT(describe_structure(inc, sp_structure(inc)),
              HasSubstr("series of 15: 4 ops -> 3 x [parallel of 4 branches of 2, 4, 4, 3 ops] joined by 2 ops -> "
                        "3 ops -> loss"));
  ir::Graph inc9 = build("inception:blocks=9,channels=4,image=32,classes=10");
  EXPECT_THAT(describe_structure(inc9, sp_structure(inc9)),
              HasSubstr("9 x [parallel of 4 branches of 2, 4, 4, 3 ops] joined by 1-2 ops -> 3 ops -> loss"));
  ir::Graph gpt = build("gpt:layers=3,seq=8,hidden=32,heads=4,ffn=64,vocab=50");
  EXPECT_THAT(describe_structure(gpt, sp_structure(gpt)),
              HasSubstr("structure: series of 28: 27 ops -> loss\nwidest parallel: none (a chain)"));
}

TEST(Inspect, NonSeriesParallelGraphIsSpIzed) {
  // a -> c, a -> d, b -> d is an N: not series-parallel.
  ir::ModelBuilder b("n-shape");
  auto x = b.input("x", {4});
  auto t = b.input("target", {4});
  auto na = b.unary("a", ir::OpKind::relu, x);
  auto nb = b.unary("b", ir::OpKind::tanh, x);
  auto nc = b.unary("c", ir::OpKind::relu, na);
  auto nd = b.op("d", ir::OpKind::add, {na, nb});
  auto ne = b.op("e", ir::OpKind::add, {nc, nd});
  b.output(b.op("loss", ir::OpKind::mse_loss, {ne, t}));
  ir::Graph g = ir::Graph::build(b.build());
  SpStructure sp = sp_structure(g);
  EXPECT_FALSE(sp.series_parallel);
  EXPECT_FALSE(sp.failure.empty());
  EXPECT_EQ(sp.tree.leaves(sp.tree.root).size(), 6u);
  std::string text = describe_structure(g, sp);
  EXPECT_THAT(text, HasSubstr("series-parallel: no ("));
  EXPECT_THAT(text, HasSubstr("structure of its SP-ized form"));
  EXPECT_THAT(text, HasSubstr("-> loss"));
}

TEST(Inspect, SummaryTotalsAndKinds) {
  ir::Graph g = build("candle-uno:branches=2,layers=1,hidden=8");
  ModelSummary s = summarize(g);
  EXPECT_EQ(s.num_ops, g.num_ops());
  EXPECT_EQ(s.num_inputs, 3u);
  EXPECT_EQ(s.params, g.total_params());
  EXPECT_DOUBLE_EQ(s.fwd_flops, g.total_fwd_flops());
  EXPECT_DOUBLE_EQ(s.bwd_flops, g.total_bwd_flops());
  EXPECT_DOUBLE_EQ(s.saved_bytes, g.total_saved_bytes());
  EXPECT_EQ(s.ops_per_kind, (std::map<std::string, int>{{"concat", 1}, {"linear", 5}, {"mse_loss", 1}, {"relu", 4}}));
}

TEST(Inspect, DotHasOneClusterPerBranchAndEveryEdge) {
  ir::Graph g = build("candle-uno:branches=2,layers=1,hidden=8");
  std::string dot = to_dot(g, sp_structure(g));
  EXPECT_THAT(dot, HasSubstr("subgraph cluster_0 {"));
  EXPECT_THAT(dot, HasSubstr("subgraph cluster_1 {"));
  EXPECT_THAT(dot, ::testing::Not(HasSubstr("cluster_2")));
  size_t edges = 0;
  for (size_t p = dot.find(" -> "); p != std::string::npos; p = dot.find(" -> ", p + 1)) ++edges;
  EXPECT_EQ(edges, to_dag(g).num_edges());
  EXPECT_THAT(dot, HasSubstr("[label=\"tower1.l0.fc\\nlinear\"]"));
}

TEST(Inspect, Units) {
  EXPECT_EQ(thousands(0), "0");
  EXPECT_EQ(thousands(999), "999");
  EXPECT_EQ(thousands(1000), "1,000");
  EXPECT_EQ(thousands(1234567), "1,234,567");
  EXPECT_EQ(thousands(-1234), "-1,234");
  EXPECT_EQ(si(1.234e9, "FLOP"), "1.23 GFLOP");
  EXPECT_EQ(si(45.6e6, "B"), "45.6 MB");
  EXPECT_EQ(si(512, "B"), "512 B");
  EXPECT_EQ(si(999.7, "B"), "1.00 kB");
  EXPECT_EQ(si(123.4e3, ""), "123 k");
}

}  // namespace
}  // namespace gp::models
