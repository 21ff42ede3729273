// Shared (tied) parameters in the IR and the stage cost: counted once per stage that holds any of
// their users; a stage holding only a non-canonical user still holds (and pays for) a copy; copies
// on several stages sum their gradients once per iteration, priced like an all-reduce among them.
#include <gtest/gtest.h>

#include "cost/cost_model.h"
#include "cost/tests/test_util.h"
#include "ir/model.h"

using namespace gp;
using namespace gp::cost;
using ir::ModelBuilder;
using ir::OpKind;

namespace {

// ids [B, 4] -> emb (table 50 x 16) -> fc 16 -> mean -> head 50 (no bias, weight = emb's table).
ir::Model tied_model(bool tie = true) {
  ModelBuilder b("tied");
  b.input("ids", {4}, ir::DType::i64);
  auto e = b.op("emb", OpKind::embedding, {"ids"}, {{"rows", 50}, {"dim", 16}});
  auto h = b.linear("fc", e, 16);
  auto m = b.op("pool", OpKind::mean, {h}, {{"axis", 1}});
  auto logits = b.linear("head", m, 50, /*bias=*/false);
  b.input("label", {}, ir::DType::i64);
  b.output(b.op("loss", OpKind::cross_entropy, {logits, "label"}));
  ir::Model model = b.build();
  if (tie) model.shared_params.push_back({"table", {50, 16}, {"emb/weight", "head/weight"}});
  return model;
}

std::string build_error(const ir::Model& m) {
  try {
    ir::Graph::build(m, "tied.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<char> mask(const ir::Graph& g, std::initializer_list<const char*> names) {
  std::vector<char> in(g.num_ops(), 0);
  for (const char* n : names) in[g.find(n).v] = 1;
  return in;
}

std::vector<OpId> ids(const ir::Graph& g, std::initializer_list<const char*> names) {
  std::vector<OpId> out;
  for (const char* n : names) out.push_back(g.find(n));
  return out;
}

TEST(SharedParams, CountedOnceWithTheCanonicalUser) {
  ir::Graph tied = ir::Graph::build(tied_model()), untied = ir::Graph::build(tied_model(false));
  EXPECT_EQ(untied.total_params(), 800 + 272 + 800);
  EXPECT_EQ(tied.total_params(), 800 + 272);
  EXPECT_EQ(tied.costs(tied.find("emb")).params, 800);
  EXPECT_EQ(tied.costs(tied.find("head")).params, 0);
  EXPECT_EQ(tied.costs(tied.find("head")).param_bytes, 0);
  // The head still reads the weight in every call.
  EXPECT_EQ(tied.costs(tied.find("head")).weight_read_bytes, untied.costs(untied.find("head")).weight_read_bytes);
  EXPECT_EQ(tied.shared_users(0), ids(tied, {"emb", "head"}));
  EXPECT_EQ(tied.shared_numel(0), 800);
  EXPECT_EQ(tied.shared_held(mask(tied, {"fc", "pool"})), std::vector<int>{});
  EXPECT_EQ(tied.shared_held(mask(tied, {"pool", "head"})), std::vector<int>{0});
}

TEST(SharedParams, BadEntriesNameTheFileFieldAndValue) {
  ir::Model m = tied_model();
  m.shared_params[0].uses = {"emb/weight"};
  EXPECT_EQ(build_error(m), "tied.json: shared_params[0] (\"table\"): 1 use, a shared parameter needs at least 2");
  m.shared_params[0].uses = {"emb/weight", "nope/weight"};
  EXPECT_EQ(build_error(m), "tied.json: shared_params[0] (\"table\"): uses[1]: unknown op \"nope\"");
  m.shared_params[0].uses = {"emb/weight", "emb/pos"};
  EXPECT_EQ(build_error(m),
            "tied.json: shared_params[0] (\"table\"): op \"emb\" is used twice (uses are distinct ops)");
  m.shared_params[0].uses = {"emb/weight", "headweight"};
  EXPECT_EQ(build_error(m), "tied.json: shared_params[0] (\"table\"): uses[1] \"headweight\" is not \"op/param\"");
  m.shared_params[0].uses = {"emb/weight", "pool/weight"};
  EXPECT_EQ(build_error(m),
            "tied.json: shared parameter \"table\" (800 elements): op \"pool\" (mean) has only 0 parameters");
  m = tied_model();
  m.shared_params[0].shape = {50, 0};
  EXPECT_EQ(build_error(m), "tied.json: shared_params[0] (\"table\"): shape [50, 0] has a non-positive dimension");
  m = tied_model();
  m.shared_params.push_back(m.shared_params[0]);
  m.shared_params[1].name = "again";
  EXPECT_EQ(build_error(m),
            "tied.json: shared_params[1] (\"again\"): \"emb/weight\" already belongs to another shared parameter");
}

TEST(SharedParams, StageHoldingOnlyTheOtherUserHoldsACopyAndSumsItsGradient) {
  ir::Graph g = ir::Graph::build(tied_model());
  CostModel cm(g, cost::testing::made_up_cluster(), Optimizer::adam);
  const double table_bytes = 800 * 4;
  // Everything on one stage: one copy, nothing to sum with anyone.
  std::vector<char> all(g.num_ops(), 1);
  StageCost whole = stage_cost(cm, g.op_ids(), all, 1, 8, 8, true);
  EXPECT_EQ(whole.shared_bytes, 0);
  EXPECT_EQ(whole.shared_allreduce_s, 0);
  EXPECT_DOUBLE_EQ(whole.state.weights, (800 + 272) * 4.0);
  // Head stage (pool, head, loss): the table's weights, gradients and Adam state, which its own
  // ops' costs do not have; and the sum with the embedding's stage.
  StageCost head = stage_cost(cm, ids(g, {"pool", "head", "loss"}), mask(g, {"pool", "head", "loss"}), 1, 8, 8, true);
  CostModel::StateParts emb = cm.state_parts(g.find("emb"));
  EXPECT_DOUBLE_EQ(head.state.weights, emb.weights);
  EXPECT_DOUBLE_EQ(head.state.gradients, emb.gradients);
  EXPECT_DOUBLE_EQ(head.state.optimizer, emb.optimizer);
  EXPECT_DOUBLE_EQ(head.shared_bytes, table_bytes);
  EXPECT_DOUBLE_EQ(head.shared_allreduce_s, cm.allreduce_time(2, true, table_bytes));
  EXPECT_GT(head.shared_allreduce_s, 0);
  // The embedding's stage (2 replicas): the table leaves its replicas' all-reduce (fc's 272
  // parameters stay) for the sum among 4 holders.
  StageCost front = stage_cost(cm, ids(g, {"emb", "fc"}), mask(g, {"emb", "fc"}), 2, 8, 8, true);
  EXPECT_DOUBLE_EQ(front.shared_bytes, table_bytes);
  EXPECT_DOUBLE_EQ(front.allreduce_s, cm.allreduce_time(2, true, 272 * 4.0));
  EXPECT_DOUBLE_EQ(front.shared_allreduce_s, cm.allreduce_time(4, true, table_bytes));
  EXPECT_NEAR(
      front.tps_s,
      (front.compute_s + front.comm_s) / 8 + (front.allreduce_s + front.shared_allreduce_s + front.optimizer_s) / 8,
      1e-15);
}

}  // namespace
