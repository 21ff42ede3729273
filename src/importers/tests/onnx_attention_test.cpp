// Attention blocks with masks (issue 34, item 2): torch 2.x exports of a GPT-2-style decoder
// (batch-first heads, scaled_dot_product_attention(is_causal=True): Expand -> Trilu -> Equal -> Where)
// and a BERT-style encoder ((1 - m) * -10000 from an attention-mask input) import as attention ops
// with attrs.causal / a padding-mask input and PyTorch's parameter counts; masks or scales that
// are something else are refused naming the nodes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cstring>
#include <map>

#include "importers/onnx_import.h"
#include "importers/tests/onnx_fixtures.h"
#include "support/error.h"

namespace gp::importers {
namespace {

using testing::error_of;
using testing::expected;
using ::testing::HasSubstr;
using testing::kDir;
using testing::load_proto;
using testing::save_temp;

std::vector<const ir::Op*> attention_ops(const ir::Model& m) {
  std::vector<const ir::Op*> out;
  for (const auto& op : m.ops)
    if (op.kind == ir::OpKind::attention) out.push_back(&op);
  return out;
}

onnx::NodeProto* node_named(onnx::ModelProto& m, const std::string& name) {
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.name() == name) return &n;
  ADD_FAILURE() << "no node " << name;
  return nullptr;
}

// The float value of Constant node `name` (a one-element tensor) set to v.
void set_constant(onnx::ModelProto& m, const std::string& name, float v) {
  onnx::NodeProto* n = node_named(m, name);
  ASSERT_NE(n, nullptr);
  onnx::TensorProto* t = n->mutable_attribute(0)->mutable_t();
  ASSERT_EQ(t->data_type(), onnx::TensorProto::FLOAT);
  if (!t->raw_data().empty()) {
    std::string raw(sizeof v, '\0');
    std::memcpy(raw.data(), &v, sizeof v);
    t->set_raw_data(raw);
  } else {
    t->set_float_data(0, v);
  }
}

TEST(OnnxAttention, Gpt2CausalSdpaImportsAsCausalAttentionWithTiedHead) {
  Json e = expected().at("gpt2_torch2");
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/gpt2_torch2.onnx"), "gpt2_torch2");
  EXPECT_EQ(g.total_params(), e.at("params").get<int64_t>());  // 7,520: the tied table once
  EXPECT_EQ(e.at("onnx_node_counts").at("Trilu"), 2);
  auto att = attention_ops(g.model());
  ASSERT_EQ(att.size(), 2u);
  for (const ir::Op* a : att) {
    EXPECT_EQ(a->attrs.at("heads"), 2);
    EXPECT_EQ(a->attrs.at("causal"), true);
    EXPECT_EQ(a->inputs.size(), 1u);
    EXPECT_EQ(a->output_shape, (ir::Shape{ir::kBatch, 8, 16}));
  }
  ASSERT_EQ(g.model().shared_params.size(), 1u);
  EXPECT_EQ(g.model().shared_params[0].name, "tok.weight");
  // Causal costs as full attention (docs/cost-model.md).
  ir::Model full = g.model();
  for (auto& op : full.ops)
    if (op.kind == ir::OpKind::attention) op.attrs.erase("causal");
  ir::Graph gf = ir::Graph::build(full, "full");
  EXPECT_EQ(gf.costs(gf.find(att[0]->name)), g.costs(g.find(att[0]->name)));
}

TEST(OnnxAttention, BertAttentionMaskInputIsTheOpsSecondInput) {
  Json e = expected().at("bert_mask_torch2");
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/bert_mask_torch2.onnx"), "bert_mask_torch2");
  EXPECT_EQ(g.total_params(), e.at("params").get<int64_t>());  // 5,731
  ASSERT_NE(g.find_input("input1"), nullptr);
  EXPECT_EQ(g.find_input("input1")->dtype, ir::DType::i64);
  EXPECT_EQ(g.find_input("input1")->shape, (ir::Shape{ir::kBatch, 8}));
  auto att = attention_ops(g.model());
  ASSERT_EQ(att.size(), 2u);
  for (const ir::Op* a : att) {
    EXPECT_EQ(a->inputs.at(1), "input1");  // both layers read the one mask input
    EXPECT_EQ(a->attrs.at("mask"), "keep");
    EXPECT_EQ(a->attrs.at("mask_fill"), -10000.0);  // (1 - m) * -10000, added as BERT adds it
    EXPECT_FALSE(a->attrs.contains("causal"));
  }
  // The mask's Unsqueeze / Cast / Sub / Mul nodes are read into the ops, not mapped.
  std::map<std::string, int> kinds;
  for (const auto& op : g.model().ops) kinds[ir::to_string(op.kind)] += 1;
  EXPECT_EQ(kinds["add"], 4);  // the residuals only
  EXPECT_EQ(kinds["mul"], 0);
  // The mask's bytes are read (8 per key, i64), and one byte per key kept for backward.
  ir::Model unmasked = g.model();
  for (auto& op : unmasked.ops)
    if (op.kind == ir::OpKind::attention) {
      op.inputs.resize(1);
      op.attrs.erase("mask");
      op.attrs.erase("mask_fill");
    }
  ir::Graph gu = ir::Graph::build(unmasked, "unmasked");
  const OpId a = g.find(att[0]->name), au = gu.find(att[0]->name);
  EXPECT_EQ(g.costs(a).input_bytes, gu.costs(au).input_bytes + 8 * 8);
  EXPECT_EQ(g.costs(a).saved_bytes, gu.costs(au).saved_bytes + 8);
  EXPECT_EQ(g.costs(a).fwd_flops, gu.costs(au).fwd_flops);
}

// nn.TransformerEncoderLayer given generate_square_subsequent_mask (an additive triu of -inf) and
// is_causal=True: nn.MultiheadAttention's region (sequence-first, heads joined batch-first) with the
// mask's Add between the scores and the Softmax.
TEST(OnnxAttention, TransformerEncoderLayerWithACausalMaskIsCausal) {
  Json e = expected().at("causal_encoder_torch2");
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/causal_encoder_torch2.onnx"), "causal_encoder_torch2");
  EXPECT_EQ(g.total_params(), e.at("params").get<int64_t>());
  auto att = attention_ops(g.model());
  ASSERT_EQ(att.size(), 2u);
  for (const ir::Op* a : att) EXPECT_EQ(a->attrs.at("causal"), true) << a->name;
}

// Trilu(upper=1) hides the keys before the query, not after: not causal, refused naming the mask node.
TEST(OnnxAttention, AnAntiCausalConstantMaskIsRefusedNamingTheNode) {
  onnx::ModelProto m = load_proto(kDir + "/gpt2_torch2.onnx");
  for (const char* trilu : {"/blocks.0/attn/Trilu", "/blocks.1/attn/Trilu"})
    for (auto& a : *node_named(m, trilu)->mutable_attribute())
      if (a.name() == "upper") a.set_i(1);
  const std::string err = error_of(save_temp(m, "anticausal"));
  EXPECT_THAT(err, HasSubstr("are not a multi-head attention block"));
  EXPECT_THAT(err, HasSubstr("mask at node \"/blocks.0/attn/Add\" (Add): the constant mask [8, 8] is not causal"));
  EXPECT_THAT(err, HasSubstr("\"/blocks.1/attn/Softmax\" (Softmax)"));
}

// A scale other than 1/sqrt(d_head) (here SDPA's sqrt-scale of 1/sqrt(8) * 4) is refused.
TEST(OnnxAttention, AWrongScaleIsRefused) {
  onnx::ModelProto m = load_proto(kDir + "/gpt2_torch2.onnx");
  set_constant(m, "/blocks.0/attn/Constant_8", 4.0f);  // Div(4, sqrt(8)) instead of Div(1, sqrt(8))
  const std::string err = error_of(save_temp(m, "wrong_scale"));
  EXPECT_THAT(err, HasSubstr("the scores are scaled by 1.41421, expected 1/sqrt(8) = 0.353553"));
}

// BERT's mask with the sign flipped ((1 - m) * +10000) boosts padding: neither keep nor ignore.
TEST(OnnxAttention, AMaskThatAddsAPositiveValueIsRefused) {
  onnx::ModelProto m = load_proto(kDir + "/bert_mask_torch2.onnx");
  set_constant(m, "/Constant_8", 10000.0f);
  const std::string err = error_of(save_temp(m, "positive_mask"));
  EXPECT_THAT(err, HasSubstr("it adds 10000 for m = 0 and"));
  EXPECT_THAT(err, HasSubstr("expected 0 for one and a negative fill for the other"));
}

// torchvision's Swin (v1), tiny, exported by torch 2.x: each block's window attention (pad, roll,
// partition, QKV, the relative-position bias gathered from its table, the shift's mask, reverse) is
// one window_attention op; PatchMerging's x[..., 0::2, 0::2, :] are slices with step 2; PyTorch's
// parameter count (the relative_position_index buffers are no parameters).
TEST(OnnxAttention, TinySwinImportsAsWindowAttentionWithPyTorchsParameterCount) {
  Json e = expected().at("tiny_swin_torch2");
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/tiny_swin_torch2.onnx"), "tiny_swin_torch2");
  EXPECT_EQ(g.total_params(), e.at("params").get<int64_t>());  // 35,777
  std::map<std::string, Json> windows;
  int strided = 0;
  for (const auto& op : g.model().ops) {
    if (op.kind == ir::OpKind::window_attention) windows[op.name] = op.attrs;
    if (op.kind == ir::OpKind::slice && op.attrs.value("step", 1) == 2) ++strided;
  }
  const std::string s1 = "/features/features.1/features.1.", s2 = "/features/features.3/features.3.";
  ASSERT_EQ(windows.size(), 4u);
  EXPECT_EQ(windows.at(s1 + "0/attn/window_attention"), Json({{"heads", 2}, {"window", {4, 4}}}));
  EXPECT_EQ(windows.at(s1 + "1/attn/window_attention"), Json({{"heads", 2}, {"window", {4, 4}}, {"shift", {2, 2}}}));
  // Stage 2's map is 4x4, one window: torchvision does not shift it (no roll, no mask in the file).
  EXPECT_EQ(windows.at(s2 + "0/attn/window_attention"), Json({{"heads", 4}, {"window", {4, 4}}}));
  EXPECT_EQ(windows.at(s2 + "1/attn/window_attention"), Json({{"heads", 4}, {"window", {4, 4}}}));
  EXPECT_EQ(strided, 6);  // PatchMerging: H [0::2], [1::2] (the exporter shares them), then W for each of 4
}

// Scores scaled by (C / heads)^-0.25 instead of ^-0.5: refused naming the block.
TEST(OnnxAttention, ASwinBlockWithAnotherScaleIsRefused) {
  onnx::ModelProto m = load_proto(kDir + "/tiny_swin_torch2.onnx");
  set_constant(m, "/features/features.1/features.1.0/attn/Constant_33", -0.25f);
  const std::string err = error_of(save_temp(m, "swin_scale"));
  EXPECT_THAT(err, HasSubstr("are not a Swin window-attention block (the scores are scaled by 0.594604, expected "
                             "1/sqrt(8) = 0.353553)"));
}

}  // namespace
}  // namespace gp::importers
