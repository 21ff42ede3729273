// Exact answers for the generic DAG algorithms on small hand-built graphs.
#include <gtest/gtest.h>

#include "graph/dag.h"
#include "graph/tests/graph_test_util.h"
#include "support/error.h"

namespace gp::graph {
namespace {

using testing::make_dag;

TEST(Dag, EdgesAreASet) {
  Dag g(3);
  g.add_edge(0, 1);
  g.add_edge(0, 1);
  g.add_edge(1, 2);
  EXPECT_EQ(g.num_edges(), 2u);
  EXPECT_TRUE(g.has_edge(0, 1));
  EXPECT_FALSE(g.has_edge(1, 0));
  EXPECT_EQ(g.succs(0), (std::vector<int>{1}));
  EXPECT_EQ(g.preds(2), (std::vector<int>{1}));
  EXPECT_EQ(g.add_node(), 3);
  EXPECT_EQ(g.sources(), (std::vector<int>{0, 3}));
  EXPECT_EQ(g.sinks(), (std::vector<int>{2, 3}));
}

TEST(Dag, TopoOrderIsKahnSmallestIdFirst) {
  Dag g = make_dag(5, {{3, 1}, {4, 0}, {0, 2}, {1, 2}});
  EXPECT_EQ(topo_order(g), (std::vector<int>{3, 1, 4, 0, 2}));
  EXPECT_EQ(topo_order(Dag(3)), (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(topo_order(make_dag(3, {{0, 1}, {1, 2}, {2, 1}})).has_value());
}

TEST(Dag, KahnOrderTakesTheSmallestKeyThenId) {
  Dag g = make_dag(5, {{3, 1}, {4, 0}, {0, 2}, {1, 2}});
  EXPECT_EQ(kahn_order(g), (std::vector<int>{3, 1, 4, 0, 2}));
  // Key -id: the largest ready id first.
  EXPECT_EQ(kahn_order(g, [](int u) { return -u; }), (std::vector<int>{4, 3, 1, 0, 2}));
  EXPECT_EQ(kahn_order(g, [](int) { return 7; }), (std::vector<int>{3, 1, 4, 0, 2}));  // ties by id
  // A cycle blocks its nodes and everything behind them; the rest is still placed.
  EXPECT_EQ(kahn_order(make_dag(4, {{0, 1}, {1, 2}, {2, 1}, {2, 3}})), (std::vector<int>{0}));
}

TEST(Dag, FindCycle) {
  Dag g = make_dag(4, {{0, 1}, {1, 2}, {2, 3}, {3, 1}});
  EXPECT_EQ(find_cycle(g), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(describe_cycle(find_cycle(g)), "1 -> 2 -> 3 -> 1");
  EXPECT_EQ(find_cycle(make_dag(2, {{1, 1}})), (std::vector<int>{1}));
  EXPECT_TRUE(find_cycle(make_dag(3, {{0, 1}, {0, 2}, {1, 2}})).empty());
}

TEST(Dag, Reachability) {
  Dag g = make_dag(5, {{0, 1}, {0, 2}, {1, 3}, {2, 3}});
  Reachability r(g);
  EXPECT_TRUE(r.reaches(0, 3));
  EXPECT_TRUE(r.reaches(2, 2));
  EXPECT_FALSE(r.reaches(1, 2));
  EXPECT_FALSE(r.reaches(3, 0));
  EXPECT_FALSE(r.reaches(0, 4));
  EXPECT_EQ(r.reach_count(0), 4);
  EXPECT_EQ(r.reach_count(4), 1);
  // More than one 64-bit word per row.
  Dag chain(130);
  for (int i = 0; i + 1 < 130; ++i) chain.add_edge(i, i + 1);
  Reachability rc(chain);
  EXPECT_TRUE(rc.reaches(0, 129));
  EXPECT_TRUE(rc.reaches(64, 128));
  EXPECT_FALSE(rc.reaches(129, 0));
  EXPECT_EQ(rc.reach_count(0), 130);
  EXPECT_EQ(rc.reach_count(65), 65);
  // Cyclic graphs are answered too.
  Reachability cyc(make_dag(3, {{0, 1}, {1, 0}, {1, 2}}));
  EXPECT_TRUE(cyc.reaches(1, 0));
  EXPECT_FALSE(cyc.reaches(2, 0));
}

TEST(Dag, ReachabilityOfAncestors) {
  using Direction = Reachability::Direction;
  // Not topologically numbered (edge 3 -> 1), and one with two words per row.
  Reachability r(make_dag(5, {{0, 3}, {3, 1}, {0, 2}, {1, 4}, {2, 4}}), Direction::ancestors);
  EXPECT_TRUE(r.reaches(4, 0));
  EXPECT_TRUE(r.reaches(1, 3));
  EXPECT_FALSE(r.reaches(3, 1));
  EXPECT_FALSE(r.reaches(2, 3));
  EXPECT_EQ(r.reach_count(4), 5);
  EXPECT_EQ(r.reach_count(0), 1);
  Dag chain(130);
  for (int i = 0; i + 1 < 130; ++i) chain.add_edge(i, i + 1);
  Reachability up(chain, Direction::ancestors);
  EXPECT_TRUE(up.reaches(129, 0));
  EXPECT_FALSE(up.reaches(0, 1));
  EXPECT_EQ(up.reach_count(129), 130);
  EXPECT_EQ(up.reach_count(65), 66);
  EXPECT_EQ(up.words(), 3u);
  EXPECT_EQ(up.row(64)[0], ~uint64_t{0});
  EXPECT_EQ(up.row(64)[1], uint64_t{1});
  EXPECT_EQ(up.row(64)[2], uint64_t{0});
  Reachability cyc(make_dag(3, {{0, 1}, {1, 0}, {1, 2}}), Direction::ancestors);
  EXPECT_TRUE(cyc.reaches(2, 0));
  EXPECT_FALSE(cyc.reaches(0, 2));
}

TEST(Dag, Convexity) {
  Dag chain = make_dag(3, {{0, 1}, {1, 2}, {0, 2}});
  EXPECT_FALSE(is_convex(chain, {0, 2}));  // 0 -> 1 -> 2 leaves and re-enters
  EXPECT_TRUE(is_convex(chain, {0, 1}));
  EXPECT_TRUE(is_convex(chain, {1}));
  EXPECT_TRUE(is_convex(chain, {}));
  Dag diamond = make_dag(4, {{0, 1}, {0, 2}, {1, 3}, {2, 3}});
  EXPECT_FALSE(is_convex(diamond, {0, 1, 3}));
  EXPECT_TRUE(is_convex(diamond, {1, 2}));
  EXPECT_TRUE(is_convex(diamond, {0, 1, 2}));
  EXPECT_TRUE(is_convex(diamond, {2, 3}));
}

TEST(Dag, TransitiveReduction) {
  Dag g = make_dag(4, {{0, 1}, {1, 2}, {0, 2}, {0, 3}, {2, 3}});
  EXPECT_EQ(transitive_reduction(g), make_dag(4, {{0, 1}, {1, 2}, {2, 3}}));
  Dag diamond = make_dag(4, {{0, 3}, {0, 1}, {0, 2}, {1, 3}, {2, 3}});
  EXPECT_EQ(transitive_reduction(diamond), make_dag(4, {{0, 1}, {0, 2}, {1, 3}, {2, 3}}));
  EXPECT_THROW(transitive_reduction(make_dag(2, {{0, 1}, {1, 0}})), UserError);
}

TEST(Dag, WeakComponents) {
  Dag g = make_dag(5, {{0, 1}, {4, 3}});
  int count = 0;
  EXPECT_EQ(weak_components(g, &count), (std::vector<int>{0, 0, 1, 2, 2}));
  EXPECT_EQ(count, 3);
  EXPECT_EQ(weak_components(make_dag(3, {{2, 0}, {2, 1}})), (std::vector<int>{0, 0, 0}));
}

TEST(Dag, Dominators) {
  // 0 -> {1, 2}; 1 -> {3, 5}; 2 -> 3; {3, 5} -> 4; 6 -> 4 is unreachable from 0.
  Dag g = make_dag(7, {{0, 1}, {0, 2}, {1, 3}, {2, 3}, {3, 4}, {1, 5}, {5, 4}, {6, 4}});
  EXPECT_EQ(dominators(g, 0), (std::vector<int>{0, 0, 0, 0, 0, 1, -1}));
  EXPECT_EQ(post_dominators(g, 4), (std::vector<int>{4, 4, 3, 4, 4, 4, 4}));
  // A chain through a diamond: 0 -> 1 -> {2, 3} -> 4 -> 5.
  Dag d = make_dag(6, {{0, 1}, {1, 2}, {1, 3}, {2, 4}, {3, 4}, {4, 5}});
  EXPECT_EQ(dominators(d, 0), (std::vector<int>{0, 0, 1, 1, 1, 4}));
  EXPECT_EQ(post_dominators(d, 5), (std::vector<int>{1, 4, 4, 4, 5, 5}));
}

}  // namespace
}  // namespace gp::graph
