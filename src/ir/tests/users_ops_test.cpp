// Ops users' multi-branch models need: cross-attention (a decoder reading its encoder), gather of
// constant positions (DLRM's interaction), cross-entropy with ignore_index / label smoothing. Their
// shapes, costs and the errors for bad attributes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ir/attrs.h"
#include "ir/model.h"

using namespace gp;
using namespace gp::ir;
using ::testing::HasSubstr;

namespace {

/// Queries x [6, 16], keys' source mem [10, 16] -> cross-attention -> mse; `mask`: a padding mask input.
Model cross_model(Json attrs, Shape mem = {10, 16}, bool mask = false) {
  ModelBuilder b("cross");
  std::string x = b.input("x", {6, 16}), m = b.input("mem", mem);
  std::vector<std::string> in{x, m};
  if (mask) in.push_back(b.input("keep", {mem[0]}, DType::i64));
  Model md = b.build();
  Op op;
  op.name = "attn";
  op.kind = OpKind::attention;
  op.inputs = in;
  op.output_shape = {kBatch, 6, 16};
  op.attrs = std::move(attrs);
  md.ops.push_back(op);
  md.inputs.push_back(Input{"t", {kBatch, 6, 16}});
  Op loss;
  loss.name = "loss";
  loss.kind = OpKind::mse_loss;
  loss.inputs = {"attn", "t"};
  md.ops.push_back(loss);
  md.outputs = {"loss"};
  return md;
}

std::string error_of(const Model& m) {
  try {
    Graph::build(m);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(UsersOps, CrossAttentionReadsKeysFromItsSecondInput) {
  Graph g = Graph::build(cross_model({{"heads", 2}, {"cross", true}}));
  const OpId a = g.find("attn");
  EXPECT_EQ(g.attention_keys(a), 10);
  const OpCosts& c = g.costs(a);
  EXPECT_EQ(c.params, 4 * 16 * 16 + 4 * 16);  // nn.MultiheadAttention(16, 2)'s in_proj + out_proj
  // Q and output projections over 6 rows, K and V over 10, scores and weighted sum 6 x 10.
  const double s = 6, t = 10, h = 16, heads = 2;
  EXPECT_DOUBLE_EQ(c.fwd_flops, 4 * s * h * h + 4 * t * h * h + 4 * s * t * h + 5 * heads * s * t);
  EXPECT_DOUBLE_EQ(c.saved_bytes, (3 * s * h + 3 * t * h + heads * s * t) * 4);
  // Self-attention keeps its old price: one sequence for queries and keys.
  ModelBuilder b("self");
  std::string y = b.op("attn", OpKind::attention, {b.input("x", {6, 16})}, {{"heads", 2}});
  b.output(b.op("loss", OpKind::mse_loss, {y, b.input("t", {6, 16})}));
  Graph gs = Graph::build(b.build());
  EXPECT_DOUBLE_EQ(gs.costs(gs.find("attn")).fwd_flops, 8 * s * h * h + 4 * s * s * h + 5 * heads * s * s);
  EXPECT_EQ(gs.attention_keys(gs.find("attn")), 6);
}

TEST(UsersOps, CrossAttentionTakesAPaddingMaskOverTheKeysAsInputTwo) {
  Graph g = Graph::build(cross_model({{"heads", 2}, {"cross", true}, {"mask", "keep"}}, {10, 16}, true));
  EXPECT_EQ(attention_inputs(g.op(g.find("attn")), "m").mask, 2);
  EXPECT_EQ(attention_inputs(g.op(g.find("attn")), "m").kv, 1);
}

TEST(UsersOps, CrossAttentionErrorsNameWhatDoesNotFit) {
  EXPECT_THAT(error_of(cross_model({{"heads", 2}, {"cross", true}}, {10, 8})),
              HasSubstr("the keys' and values' source) has shape [B, 10, 8], expected [B, seq_kv, 16]"));
  EXPECT_THAT(error_of(cross_model({{"heads", 2}, {"cross", true}, {"causal", true}})),
              HasSubstr("attrs.causal on cross-attention needs as many keys as queries, found 10 and 6"));
  // Without attrs.cross a second [B, S, H] input is read as a padding mask, which it is not.
  EXPECT_THAT(error_of(cross_model({{"heads", 2}})), HasSubstr("(the padding mask) has shape"));
}

TEST(UsersOps, GatherPicksConstantPositionsOfANonBatchAxis) {
  ModelBuilder b("g");
  // DLRM: the strictly lower triangle of a [4, 4] interaction flattened to 16 values.
  std::string z = b.input("z", {16});
  std::string y = b.op("tri", OpKind::gather, {z}, {{"axis", 1}, {"indices", {4, 8, 9, 12, 13, 14}}});
  EXPECT_EQ(b.shape_of(y), (Shape{kBatch, 6}));
  b.output(b.op("loss", OpKind::mse_loss, {y, b.input("t", {6})}));
  Graph g = Graph::build(b.build());
  EXPECT_EQ(g.costs(g.find("tri")).fwd_flops, 0);
  EXPECT_EQ(g.costs(g.find("tri")).output_bytes, 6 * 4);
  ModelBuilder bad("g");
  std::string zz = bad.input("z", {16});
  try {
    bad.op("tri", OpKind::gather, {zz}, {{"axis", 1}, {"indices", {3, 16}}});
    FAIL() << "an index outside the axis was accepted";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("attrs.indices holds 16, outside [0, 16)"));
  }
  try {
    bad.op("tri", OpKind::gather, {zz}, {{"axis", 0}, {"indices", {1}}});
    FAIL() << "a gather along the batch was accepted";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("axis"));
  }
}

TEST(UsersOps, CrossEntropyTakesIgnoreIndexAndLabelSmoothing) {
  ModelBuilder b("lm");
  std::string logits = b.input("logits", {20, 5});  // [B, V, S]: the classes on dim 1
  std::string labels = b.input("targets", {5}, DType::i64);
  b.output(b.op("loss", OpKind::cross_entropy, {logits, labels}, {{"ignore_index", -1}, {"label_smoothing", 0.1}}));
  EXPECT_NO_THROW(Graph::build(b.build()));
  ModelBuilder bad("lm");
  std::string l2 = bad.input("logits", {20, 5});
  std::string y2 = bad.input("targets", {5}, DType::i64);
  try {
    bad.op("loss", OpKind::cross_entropy, {l2, y2}, {{"label_smoothing", 1.5}});
    FAIL() << "label_smoothing 1.5 was accepted";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("attrs.label_smoothing must be in [0, 1], found 1.5"));
  }
}
