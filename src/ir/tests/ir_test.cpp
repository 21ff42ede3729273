#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ir/model.h"

using namespace gp;
using namespace gp::ir;
using ::testing::HasSubstr;

namespace {

Model tiny() {
  ModelBuilder b("tiny");
  b.input("x", {16});
  b.input("label", {}, DType::i64);
  std::string h = b.linear("fc1", "x", 32);
  h = b.unary("act", OpKind::relu, h);
  h = b.linear("fc2", h, 10);
  b.output(b.op("loss", OpKind::cross_entropy, {h, "label"}));
  return b.build();
}

std::string error_of(const Model& m) {
  try {
    validate(m, "m.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(IrTest, LinearCostsAreClosedForm) {
  Graph g = Graph::build(tiny());
  ASSERT_EQ(g.num_ops(), 4u);
  const OpCosts& fc1 = g.costs(g.find("fc1"));
  EXPECT_EQ(fc1.params, 16 * 32 + 32);
  EXPECT_EQ(fc1.param_bytes, (16 * 32 + 32) * 4);
  EXPECT_DOUBLE_EQ(fc1.fwd_flops, 2.0 * 16 * 32);
  EXPECT_DOUBLE_EQ(fc1.bwd_flops, 4.0 * 16 * 32);
  EXPECT_DOUBLE_EQ(fc1.saved_bytes, 16 * 4);
  EXPECT_DOUBLE_EQ(fc1.output_bytes, 32 * 4);
  EXPECT_EQ(g.total_params(), 16 * 32 + 32 + 32 * 10 + 10);
  EXPECT_EQ(g.op(g.find("loss")).output_shape, Shape{});
}

TEST(IrTest, AttentionCostsAreClosedForm) {
  ModelBuilder b("att");
  b.input("x", {8, 16});
  std::string a = b.op("attn", OpKind::attention, {"x"}, {{"heads", 4}});
  b.output(b.op("loss", OpKind::mse_loss, {a, "x"}));
  Graph g = Graph::build(b.build());
  const OpCosts& c = g.costs(g.find("attn"));
  const double s = 8, h = 16;
  EXPECT_EQ(c.params, 4 * 16 * 16 + 4 * 16);
  EXPECT_DOUBLE_EQ(c.fwd_flops, 8 * s * h * h + 4 * s * s * h + 5 * 4 * s * s);
  EXPECT_DOUBLE_EQ(c.saved_bytes, (5 * s * h + 4 * s * s) * 4);
}

TEST(IrTest, EmbeddingBagReadsRowsPerSample) {
  ModelBuilder b("emb");
  b.input("idx", {100}, DType::i64);
  b.input("t", {64});
  std::string e = b.op("emb", OpKind::embedding_bag, {"idx"}, {{"rows", 1000000}, {"dim", 64}});
  b.output(b.op("loss", OpKind::mse_loss, {e, "t"}));
  Graph g = Graph::build(b.build());
  const OpCosts& c = g.costs(g.find("emb"));
  EXPECT_EQ(c.params, 64000000);
  EXPECT_EQ(c.weight_read_bytes, 0);
  EXPECT_DOUBLE_EQ(c.input_bytes, 100 * 8 + 100 * 64 * 4);
}

TEST(IrTest, EmbeddingAppendsDimAndCountsPositions) {
  ModelBuilder b("tok");
  b.input("ids", {12}, DType::i64);
  b.input("t", {12, 32});
  std::string e = b.op("emb", OpKind::embedding, {"ids"}, {{"rows", 50}, {"dim", 32}, {"positions", true}});
  b.output(b.op("loss", OpKind::mse_loss, {e, "t"}));
  Graph g = Graph::build(b.build());
  EXPECT_EQ(g.op(g.find("emb")).output_shape, (Shape{kBatch, 12, 32}));
  const OpCosts& c = g.costs(g.find("emb"));
  EXPECT_EQ(c.params, 50 * 32 + 12 * 32);                 // the table and the positions
  EXPECT_EQ(c.weight_read_bytes, 12 * 32 * 4);            // positions per call; table rows per sample
  EXPECT_DOUBLE_EQ(c.input_bytes, 12 * 8 + 12 * 32 * 4);  // indices + gathered rows
  EXPECT_DOUBLE_EQ(c.fwd_flops, 2 * 12 * 32);             // copy + add
}

TEST(IrTest, EmbeddingRejectsFloatIndicesAndPositionsOnRank3) {
  ModelBuilder b("tok");
  b.input("x", {12});
  b.input("t", {12, 32});
  b.output(b.op("loss", OpKind::mse_loss, {b.op("emb", OpKind::embedding, {"x"}, {{"rows", 50}, {"dim", 32}}), "t"}));
  EXPECT_THAT(error_of(b.build()), HasSubstr("input 0 (\"x\") is f32, expected i64"));
  ModelBuilder c("tok3");  // the builder infers shapes as ops are added
  c.input("ids", {2, 3}, DType::i64);
  try {
    c.op("emb", OpKind::embedding, {"ids"}, {{"rows", 5}, {"dim", 4}, {"positions", true}});
    ADD_FAILURE() << "positions on [B, 2, 3] indices were accepted";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("attrs.positions needs [B, seq] indices, found [B, 2, 3]"));
  }
  ModelBuilder d("short_table");
  d.input("ids", {8}, DType::i64);
  try {
    d.op("emb", OpKind::embedding, {"ids"}, {{"rows", 5}, {"dim", 4}, {"positions", true}, {"position_rows", 6}});
    ADD_FAILURE() << "a 6-row position table for 8 positions was accepted";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("attrs.position_rows = 6 is less than the sequence length 8"));
  }
}

// Sizes that would wrap int64 are errors (session 3: an embedding with 2^62 rows reported 0
// parameters; a linear of two 2^40 extents would overflow the count).
TEST(IrTest, SizesBeyondTheLimitsAreErrorsNotWrapped) {
  auto error_building = [](auto&& build) -> std::string {
    try {
      build();
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THAT(error_building([] {
                ModelBuilder b("big");
                b.input("ids", {4}, DType::i64);
                b.op("e", OpKind::embedding, {"ids"}, {{"rows", int64_t{1} << 62}, {"dim", 4}});
              }),
              HasSubstr("attrs.rows = 4611686018427387904 is larger than 2^40"));
  EXPECT_THAT(error_building([] {
                ModelBuilder b("wide");  // costs (and parameter counts) are derived by Graph::build
                b.input("x", {int64_t{1} << 30});
                b.input("t", {int64_t{1} << 30});
                b.output(b.op("loss", OpKind::mse_loss, {b.linear("fc", "x", int64_t{1} << 30), "t"}));
                Graph::build(b.build());
              }),
              HasSubstr("has 1.153e+18 parameters, more than 2^44"));
  EXPECT_THAT(error_building([] {
                ModelBuilder b("reshape");
                b.input("x", {4});
                b.op("r", OpKind::reshape, {"x"}, {{"shape", {int64_t{1} << 20, int64_t{1} << 41}}});
              }),
              HasSubstr("attrs.shape has dimension 2199023255552, not in [1, 2^40]"));
  Model m;
  m.name = "input";
  m.inputs.push_back(Input{"x", {kBatch, int64_t{1} << 30, int64_t{1} << 30}});
  EXPECT_THAT(error_of(m), HasSubstr("input \"x\": shape [B, 1073741824, 1073741824] has more than 2^40 elements"));
}

TEST(IrTest, TopologicalOrderAndEdges) {
  Model m = tiny();
  std::swap(m.ops[0], m.ops[2]);  // fc2 before fc1 in the file
  Graph g = Graph::build(m);
  EXPECT_EQ(g.op(OpId(0)).name, "fc1");
  EXPECT_EQ(g.succs(g.find("fc1")).size(), 1u);
  EXPECT_EQ(g.graph_inputs_of(g.find("loss")).size(), 1u);
}

TEST(IrTest, RejectsDuplicateName) {
  Model m = tiny();
  m.ops[1].name = "fc1";
  EXPECT_THAT(error_of(m), HasSubstr("duplicate op name \"fc1\""));
}

TEST(IrTest, RejectsUnknownInput) {
  Model m = tiny();
  m.ops[2].inputs[0] = "enc.l3";
  EXPECT_THAT(error_of(m), HasSubstr("op \"fc2\": inputs[0]: unknown input \"enc.l3\""));
}

TEST(IrTest, RejectsCycleNamingItsOps) {
  Model m = tiny();
  m.ops[0].inputs[0] = "fc2";  // fc1 <- fc2 <- act <- fc1
  EXPECT_THAT(error_of(m), HasSubstr("cycle"));
  EXPECT_THAT(error_of(m), HasSubstr("\"fc1\""));
  EXPECT_THAT(error_of(m), HasSubstr("\"act\""));
  EXPECT_THAT(error_of(m), HasSubstr("\"fc2\""));
}

TEST(IrTest, RejectsShapeMismatchNamingBothShapes) {
  Model m = tiny();
  m.ops[2].output_shape = {kBatch, 11};
  EXPECT_THAT(
      error_of(m),
      HasSubstr("op \"fc2\" (linear): shape mismatch: declared output shape [B, 11] but its inputs give [B, 10]"));
  ModelBuilder b("bad");
  b.input("a", {4});
  b.input("c", {5});
  EXPECT_THROW(b.op("s", OpKind::add, {"a", "c"}), UserError);
  try {
    b.op("s", OpKind::add, {"a", "c"});
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("shape mismatch: [B, 4], [B, 5] do not broadcast"));
  }
}

TEST(IrTest, RejectsOpWithoutPathToOutput) {
  Model m = tiny();
  Op dead = m.ops[1];
  dead.name = "dead";
  m.ops.push_back(dead);
  EXPECT_THAT(error_of(m), HasSubstr("op \"dead\" has no path to an output"));
}

TEST(IrTest, RejectsWrongDtype) {
  Model m = tiny();
  m.inputs[1].dtype = DType::f32;
  EXPECT_THAT(error_of(m), HasSubstr("input 1 (\"label\") is f32, expected i64"));
}

TEST(IrTest, ShapeInferenceForStructuralOps) {
  ModelBuilder b("s");
  b.input("img", {3, 32, 32});
  std::string c = b.op("conv", OpKind::conv2d, {"img"}, {{"out_channels", 8}, {"kernel", 3}, {"padding", 1}});
  EXPECT_EQ(b.shape_of(c), (Shape{kBatch, 8, 32, 32}));
  std::string p = b.op("pool", OpKind::maxpool, {c}, {{"kernel", 2}});
  EXPECT_EQ(b.shape_of(p), (Shape{kBatch, 8, 16, 16}));
  std::string cat = b.op("cat", OpKind::concat, {p, p}, {{"axis", 1}});
  EXPECT_EQ(b.shape_of(cat), (Shape{kBatch, 16, 16, 16}));
  std::string t = b.op("t", OpKind::transpose, {cat}, {{"perm", {0, 2, 1, 3}}});
  EXPECT_EQ(b.shape_of(t), (Shape{kBatch, 16, 16, 16}));
  std::string r = b.op("r", OpKind::reshape, {t}, {{"shape", {256, 16}}});
  EXPECT_EQ(b.shape_of(r), (Shape{kBatch, 256, 16}));
  std::string mn = b.op("mean", OpKind::mean, {r}, {{"axis", 1}});
  EXPECT_EQ(b.shape_of(mn), (Shape{kBatch, 16}));
  std::string sl = b.op("sl", OpKind::slice, {mn}, {{"axis", -1}, {"start", 4}, {"end", 12}});
  EXPECT_EQ(b.shape_of(sl), (Shape{kBatch, 8}));
  std::string gp = b.op("gap", OpKind::global_avgpool, {c});
  EXPECT_EQ(b.shape_of(gp), (Shape{kBatch, 8}));
  EXPECT_THROW(b.op("bad", OpKind::attention, {r}, {{"heads", 3}}), UserError);
  EXPECT_THROW(b.op("bad2", op_kind_from_string("nope"), {r}), UserError);
}

TEST(IrTest, KindNamesRoundTrip) {
  for (int k = 0; k <= static_cast<int>(OpKind::cross_entropy); ++k)
    EXPECT_EQ(static_cast<int>(op_kind_from_string(to_string(static_cast<OpKind>(k)))), k);
  try {
    op_kind_from_string("convolution");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("valid kinds: linear, matmul"));
  }
}

// Issue 15: general convolution, padding, broadcasting elementwise ops and parameter operands.
TEST(IrTest, GeneralConvolutionShapesAndCosts) {
  ModelBuilder b("conv");
  b.input("x", {8, 17, 20});
  // 1x7 kernel, stride (2, 1), dilation (1, 2), asymmetric pads [top 1, left 3, bottom 0, right 2], 4 groups.
  std::string c = b.op("c", OpKind::conv2d, {"x"},
                       {{"out_channels", 12},
                        {"kernel", {1, 7}},
                        {"stride", {2, 1}},
                        {"dilation", {1, 2}},
                        {"padding", {1, 3, 0, 2}},
                        {"groups", 4},
                        {"bias", false}});
  // H: (17 + 1 + 0 - 1) / 2 + 1 = 9; W: 20 + 3 + 2 - 2 * 6 - 1 + 1 = 13.
  EXPECT_EQ(b.shape_of(c), (Shape{kBatch, 12, 9, 13}));
  std::string d = b.op("dw", OpKind::conv2d, {c},
                       {{"out_channels", 12}, {"kernel", 3}, {"padding", 1}, {"groups", 12}});
  b.output(b.op("loss", OpKind::mse_loss, {d, d}));
  Graph g = Graph::build(b.build());
  EXPECT_EQ(g.costs(g.find("c")).params, 12 * 2 * 1 * 7);
  EXPECT_DOUBLE_EQ(g.costs(g.find("c")).fwd_flops, 2.0 * 12 * 9 * 13 * 2 * 7);
  EXPECT_EQ(g.costs(g.find("dw")).params, 12 * 9 + 12);  // depthwise: one 3x3 filter per channel
  ModelBuilder bad("bad");
  bad.input("x", {6, 8, 8});
  EXPECT_THROW(bad.op("c", OpKind::conv2d, {"x"}, {{"out_channels", 4}, {"kernel", 3}, {"groups", 4}}), UserError);
  EXPECT_THROW(bad.op("c", OpKind::conv2d, {"x"}, {{"out_channels", 4}, {"kernel", {3, 3, 3}}}), UserError);
}

TEST(IrTest, BroadcastingParameterOperandsAndPad) {
  ModelBuilder b("bc");
  b.input("x", {8, 6, 6});
  b.input("g", {8, 1, 1});
  std::string gate = b.op("gate", OpKind::mul, {"x", "g"});  // squeeze-and-excitation
  EXPECT_EQ(b.shape_of(gate), (Shape{kBatch, 8, 6, 6}));
  std::string scale = b.op("scale", OpKind::mul, {gate}, {{"param", {8, 1, 1}}});  // layer scale
  std::string p = b.op("pad", OpKind::pad, {scale}, {{"pads", {0, 1, 0, 0, 2, 3}}});
  EXPECT_EQ(b.shape_of(p), (Shape{kBatch, 8, 9, 9}));
  std::string f = b.op("f", OpKind::reshape, {p}, {{"shape", {81, 8}}});
  std::string tok = b.op("tok", OpKind::concat, {f}, {{"axis", 1}, {"param", {1, 8}}});  // a class token
  EXPECT_EQ(b.shape_of(tok), (Shape{kBatch, 82, 8}));
  std::string pos = b.op("pos", OpKind::add, {tok}, {{"param", {82, 8}}});
  std::string act = b.op("act", OpKind::hardswish, {b.op("clip", OpKind::clip, {pos}, {{"min", 0}, {"max", 6}})});
  b.output(b.op("loss", OpKind::mse_loss, {act, act}));
  Graph g = Graph::build(b.build());
  EXPECT_EQ(g.costs(g.find("scale")).params, 8);
  EXPECT_EQ(g.costs(g.find("tok")).params, 8);
  EXPECT_EQ(g.costs(g.find("pos")).params, 82 * 8);
  EXPECT_EQ(g.costs(g.find("gate")).params, 0);
  EXPECT_DOUBLE_EQ(g.costs(g.find("gate")).fwd_flops, 8.0 * 36);
  ModelBuilder bad("bad");
  bad.input("x", {8, 6, 6});
  bad.input("y", {4, 1, 1});
  try {
    bad.op("m", OpKind::mul, {"x", "y"});
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("[B, 8, 6, 6], [B, 4, 1, 1] do not broadcast"));
  }
  EXPECT_THROW(bad.op("p", OpKind::pad, {"x"}, {{"pads", {0, 1, 0, 0}}}), UserError);
  EXPECT_THROW(bad.op("a", OpKind::add, {"x"}), UserError);  // one operand and no parameter
}

// Masked attention (issue 34, item 2): attrs.causal and a padding mask [B, seq] as input 1 (i64 or
// f32), read as "keep" or "ignore", with an optional finite negative mask_fill; the costs are full
// attention's plus the mask's read and one byte per key kept.
TEST(IrTest, AttentionMasksAreCheckedAndCostFullAttention) {
  auto build = [](Json attrs, bool mask_input, DType mask_dtype = DType::i64, Shape mask_shape = {8}) {
    ModelBuilder b("att");
    b.input("x", {8, 16});
    std::vector<std::string> in{"x"};
    if (mask_input) in.push_back(b.input("m", mask_shape, mask_dtype));
    attrs["heads"] = 4;
    std::string a = b.op("attn", OpKind::attention, in, attrs);
    b.output(b.op("loss", OpKind::mse_loss, {a, "x"}));
    return Graph::build(b.build());
  };
  Graph full = build(Json::object(), false);
  Graph causal = build({{"causal", true}}, false);
  EXPECT_EQ(causal.costs(causal.find("attn")), full.costs(full.find("attn")));
  Graph masked = build({{"mask", "keep"}, {"mask_fill", -10000.0}}, true);
  const OpCosts &m = masked.costs(masked.find("attn")), &f = full.costs(full.find("attn"));
  EXPECT_DOUBLE_EQ(m.input_bytes, f.input_bytes + 8 * 8);
  EXPECT_DOUBLE_EQ(m.saved_bytes, f.saved_bytes + 8);
  EXPECT_DOUBLE_EQ(m.fwd_flops, f.fwd_flops);
  EXPECT_EQ(m.params, f.params);
  EXPECT_NO_THROW(build({{"mask", "ignore"}}, true, DType::f32));
  auto error = [&](Json attrs, bool mask_input, Shape mask_shape = {8}) {
    try {
      build(std::move(attrs), mask_input, DType::i64, std::move(mask_shape));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(error(Json::object(), true, {7}),
              HasSubstr("input 1 (the padding mask) has shape [B, 7], expected [B, 8]"));
  EXPECT_THAT(error(Json::object(), true, {8, 8}), HasSubstr("expected [B, 8] (one value per key position)"));
  EXPECT_THAT(error({{"mask", "drop"}}, true), HasSubstr("mask"));
  EXPECT_THAT(error({{"mask_fill", 5.0}}, true), HasSubstr("attrs.mask_fill must be a finite negative number"));
  EXPECT_THAT(error({{"mask", "keep"}}, false), HasSubstr("without a padding-mask input"));
  EXPECT_THAT(error({{"causal", 1}}, false), HasSubstr("attrs.causal: expected true or false"));
}
