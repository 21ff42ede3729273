// RangeCost (prefix sums + live tensors per cut) equals cost::stage_cost on every range of every
// sequence, for the SP structure and the chain, on zoo models and random SP graphs.
#include <gtest/gtest.h>

#include <random>

#include "importers/resolve.h"
#include "planner/engine.h"
#include "planner/range_cost.h"
#include "planner/tests/util.h"

namespace gp::planner {
namespace {

void expect_equal(const cost::CostModel& cm, const detail::Structure& st, int mbs, int mini, bool same_node,
                  uint32_t seed, int samples) {
  detail::RangeCost rc(cm, st, mbs, mini, same_node);
  std::mt19937 rng(seed);
  std::vector<char> in(cm.graph().num_ops(), 0);
  for (int t = 0; t < samples; ++t) {
    const int s = static_cast<int>(rng() % st.seqs.size());
    const auto& q = st.seqs[s];
    const int k = static_cast<int>(q.items.size());
    const int i = static_cast<int>(rng() % k);
    const int m = i + 1 + static_cast<int>(rng() % (k - i));
    const int plog = static_cast<int>(rng() % rc.plogs());
    std::vector<OpId> ops;
    for (int j = i; j < m; ++j) ops.insert(ops.end(), q.items[j].ops.begin(), q.items[j].ops.end());
    for (OpId o : ops) in[o.v] = 1;
    cost::StageCost want = cost::stage_cost(cm, ops, in, 1 << plog, mbs, mini, same_node);
    for (OpId o : ops) in[o.v] = 0;
    detail::RangeCost::Cost got = rc.cost(s, i, m, plog);
    auto near = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(b), 1e-30); };
    ASSERT_TRUE(near(got.tps, want.tps_s))
        << "seq " << s << " [" << i << ", " << m << ") plog " << plog << ": " << got.tps << " vs " << want.tps_s;
    ASSERT_TRUE(near(got.compute_tps, want.compute_s / mbs));
    ASSERT_TRUE(near(got.state, want.state_bytes));
    ASSERT_TRUE(near(got.act, want.act_bytes_per_mb));
  }
}

TEST(RangeCost, EqualsStageCostOnRandomRanges) {
  uint32_t seed = 7;
  for (const char* spec : {"mmt", "dlrm", "candle-uno", "gpt:layers=2,seq=32,hidden=128,heads=4,ffn=256,vocab=512",
                           "inception:blocks=2,channels=16,image=32"}) {
    ir::Graph g = importers::load_graph(spec);
    for (int n : {4, 32}) {
      cost::CostModel cm(g, cost::load_cluster("summit", n));
      detail::Structure sp = detail::sp_structure(cm, nullptr), chain = detail::chain_structure(cm);
      for (int mbs : {1, 8, 64})
        for (bool same : {false, true}) {
          expect_equal(cm, sp, mbs, 256, same, ++seed, 300);
          expect_equal(cm, chain, mbs, 256, same, ++seed, 300);
        }
    }
  }
}

// A stage's fixed time per pass (the calibrated cpu preset's DeviceSpec::pass_fwd_s) counts in the DP's
// ranges as in stage_cost: once per micro-batch, whatever the range.
TEST(RangeCost, EqualsStageCostWithPassTimes) {
  ir::Graph g = importers::load_graph("mmt:branches=4,layers=2,seq=16,hidden=64,heads=4,ffn=128");
  cost::Cluster cl = cost::load_cluster("cpu", 4);
  cl.device.pass_fwd_s = 70e-6;
  cl.device.pass_bwd_s = 90e-6;
  cost::CostModel cm(g, cl);
  detail::Structure sp = detail::sp_structure(cm, nullptr), chain = detail::chain_structure(cm);
  uint32_t seed = 101;
  for (int mbs : {1, 4, 32}) {
    expect_equal(cm, sp, mbs, 32, true, ++seed, 300);
    expect_equal(cm, chain, mbs, 32, true, ++seed, 300);
  }
}

}  // namespace
}  // namespace gp::planner
