// ONNX import of decoder and dense-prediction ops (issue 34, item 1): the PyTorch exports in
// tests/fixtures/unet (make_reference.py) map ConvTranspose, Resize, MaxPool/AveragePool variants to
// the IR with PyTorch's parameter counts; what stays unsupported is refused naming the node and the
// attribute.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>

#include "importers/onnx_import.h"
#include "importers/tests/onnx_fixtures.h"
#include "support/error.h"

namespace gp::importers {
namespace {

using testing::error_of;
using ::testing::HasSubstr;
using testing::kind_counts;
namespace fx = testing;

const std::string kUnet = GP_UNET_FIXTURES;

Json reference() {
  std::ifstream f(kUnet + "/reference.json");
  return Json::parse(f);
}

/// decoder_ops.onnx with node `name`'s attribute `attr` set by `set`; returns the saved path.
template <class F>
std::string mutated(const std::string& name, const std::string& attr, F set, const std::string& tag) {
  onnx::ModelProto m = fx::load_proto(kUnet + "/decoder_ops.onnx");
  for (auto& n : *m.mutable_graph()->mutable_node()) {
    if (n.name() != name) continue;
    onnx::AttributeProto* a = nullptr;
    for (auto& x : *n.mutable_attribute())
      if (x.name() == attr) a = &x;
    if (!a) {
      a = n.add_attribute();
      a->set_name(attr);
    }
    set(*a);
  }
  return fx::save_temp(m, tag);
}

void set_string(onnx::AttributeProto& a, const std::string& s) {
  a.set_type(onnx::AttributeProto::STRING);
  a.set_s(s);
}

void set_ints(onnx::AttributeProto& a, const std::vector<int64_t>& v) {
  a.set_type(onnx::AttributeProto::INTS);
  a.clear_ints();
  for (int64_t x : v) a.add_ints(x);
}

TEST(OnnxDecoder, UnetImportsWithPyTorchsParameterCountAndItsSkipConcats) {
  const Json ref = reference();
  ir::Graph g = ir::Graph::build(import_onnx(kUnet + "/unet.onnx"), "unet");
  EXPECT_EQ(g.total_params(), ref["unet"]["params"].get<int64_t>());  // 29,465
  auto c = kind_counts(g.model());
  EXPECT_EQ(c["conv2d"], 11);
  EXPECT_EQ(c["conv_transpose2d"], 2);
  EXPECT_EQ(c["maxpool"], 2);
  EXPECT_EQ(c["concat"], 2);
  EXPECT_EQ(c["mse_loss"], 1);  // per-pixel MSE against a [B, 1, 16, 16] target
  EXPECT_EQ(g.find_input("target")->shape, (ir::Shape{ir::kBatch, 1, 16, 16}));
  const ir::Op& up2 = g.op(g.find("/up2/ConvTranspose"));
  EXPECT_EQ(up2.output_shape, (ir::Shape{ir::kBatch, 16, 8, 8}));
  EXPECT_EQ(up2.attrs.at("kernel"), 2);
  EXPECT_EQ(up2.attrs.at("stride"), 2);
  EXPECT_EQ(g.costs(g.find("/up2/ConvTranspose")).params, 32 * 16 * 2 * 2 + 16);
  // Each decoder concat joins the upsampled path with the encoder's output of the same size (a skip).
  for (const char* cat : {"/Concat", "/Concat_1"}) {
    const ir::Op& op = g.op(g.find(cat));
    ASSERT_EQ(op.inputs.size(), 2u) << cat;
    EXPECT_EQ(g.op(g.find(op.inputs[0])).kind, ir::OpKind::conv_transpose2d) << cat;
    EXPECT_THAT(op.inputs[1], HasSubstr("/enc")) << cat;
  }
}

TEST(OnnxDecoder, EveryDecoderOpVariantMapsWithItsAttributes) {
  const Json ref = reference();
  ir::Graph g = ir::Graph::build(import_onnx(kUnet + "/decoder_ops.onnx"), "decoder_ops");
  EXPECT_EQ(g.total_params(), ref["decoder_ops"]["params"].get<int64_t>());
  auto attrs = [&](const char* name) { return g.op(g.find(name)).attrs; };
  auto shape = [&](const char* name) { return g.op(g.find(name)).output_shape; };
  // ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1) on 5x5: 10x10.
  EXPECT_EQ(
      attrs("/t1/ConvTranspose"),
      (Json{{"out_channels", 3}, {"kernel", 3}, {"stride", 2}, {"padding", 1}, {"output_padding", 1}, {"bias", true}}));
  EXPECT_EQ(shape("/t1/ConvTranspose"), (ir::Shape{ir::kBatch, 3, 10, 10}));
  EXPECT_EQ(attrs("/t2/ConvTranspose"), (Json{{"out_channels", 4},
                                              {"kernel", {3, 2}},
                                              {"stride", {2, 3}},
                                              {"padding", {0, 1}},
                                              {"groups", 2},
                                              {"bias", false}}));
  EXPECT_EQ(attrs("/t3/ConvTranspose").at("dilation"), 2);
  EXPECT_EQ(attrs("/t4/ConvTranspose").at("output_padding"), Json({1, 0}));
  // interpolate(scale_factor=2, nearest): the scales (a Concat of constants in torch 2.x's export) kept.
  EXPECT_EQ(attrs("/Resize"), (Json{{"size", {10, 10}}, {"mode", "nearest"}, {"scales", {2.0, 2.0}}}));
  EXPECT_EQ(attrs("/Resize_1"), (Json{{"size", {7, 9}}, {"mode", "nearest"}}));  // size=(7, 9)
  EXPECT_EQ(attrs("/Resize_3"), (Json{{"size", {7, 7}}, {"mode", "linear"}, {"scales", {1.5, 1.5}}}));
  EXPECT_EQ(attrs("/Resize_4"), (Json{{"size", {6, 8}}, {"mode", "linear"}, {"align_corners", true}}));
  EXPECT_EQ(attrs("/MaxPool"),
            (Json{{"kernel", {3, 2}}, {"stride", {2, 1}}, {"padding", {1, 0}}, {"ceil_mode", true}}));
  EXPECT_EQ(attrs("/MaxPool_1").at("dilation"), 2);
  EXPECT_EQ(attrs("/AveragePool").at("count_include_pad"), false);
  EXPECT_FALSE(attrs("/AveragePool_1").contains("count_include_pad"));  // 1: PyTorch's and the IR's default
}

TEST(OnnxDecoder, UnsupportedVariantsAreRefusedNamingTheNodeAndAttribute) {
  EXPECT_THAT(error_of(mutated(
                  "/Resize_2", "mode", [](auto& a) { set_string(a, "cubic"); }, "cubic")),
              HasSubstr("\"/Resize_2\" (Resize): mode cubic is not supported (nearest and linear are)"));
  EXPECT_THAT(error_of(mutated(
                  "/Resize", "nearest_mode", [](auto& a) { set_string(a, "round_prefer_floor"); }, "nm")),
              HasSubstr("\"/Resize\" (Resize): nearest with coordinate_transformation_mode asymmetric and nearest_mode "
                        "round_prefer_floor"));
  EXPECT_THAT(
      error_of(mutated(
          "/Resize_2", "coordinate_transformation_mode", [](auto& a) { set_string(a, "tf_half_pixel_for_nn"); }, "ct")),
      HasSubstr("\"/Resize_2\" (Resize): linear with coordinate_transformation_mode tf_half_pixel_for_nn"));
  EXPECT_THAT(error_of(mutated(
                  "/MaxPool_1", "pads",
                  [](auto& a) {
                    set_ints(a, {1, 0, 0, 0});
                  },
                  "asym_pool")),
              HasSubstr("\"/MaxPool_1\" (MaxPool): asymmetric pads 1,0,0,0 are not supported"));
  EXPECT_THAT(error_of(mutated(
                  "/AveragePool", "dilations",
                  [](auto& a) {
                    set_ints(a, {2, 2});
                  },
                  "avg_dil")),
              HasSubstr("\"/AveragePool\" (AveragePool): dilations 2x2 are supported on MaxPool only"));
  // Every unsupported use is listed, not only the first.
  onnx::ModelProto m = fx::load_proto(kUnet + "/decoder_ops.onnx");
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.op_type() == "Resize")
      for (auto& a : *n.mutable_attribute())
        if (a.name() == "mode") a.set_s("cubic");
  const std::string all = error_of(fx::save_temp(m, "all_cubic"));
  for (const char* node : {"/Resize\"", "/Resize_1\"", "/Resize_2\"", "/Resize_3\"", "/Resize_4\""})
    EXPECT_THAT(all, HasSubstr(node)) << all;
}

TEST(OnnxDecoder, ConvTransposeOutputShapeAndAutoPadSetThePadsAsTheOnnxSpecSays) {
  // t1: 3x3, stride 2 on 5x5; output_shape 10x9: total padding 2*4 + 1 + 3 - 10 = 2 (1 + 1), and
  // 3 for the width: SAME_LOWER / NOTSET put the odd one at the start, [2, 1, 1, 1] as [t, l, b, r].
  const std::string path = mutated(
      "/t1/ConvTranspose", "output_shape",
      [](auto& a) {
        set_ints(a, {10, 9});
      },
      "oshape");
  ir::Model m = import_onnx(path);
  const ir::Op* t1 = nullptr;
  for (const auto& op : m.ops)
    if (op.name == "/t1/ConvTranspose") t1 = &op;
  ASSERT_NE(t1, nullptr);
  EXPECT_EQ(t1->output_shape, (ir::Shape{ir::kBatch, 3, 10, 9}));
  EXPECT_EQ(t1->attrs.at("padding"), Json({1, 2, 1, 1}));
  // SAME_UPPER: output = input x stride (10x10); total padding 2*4 + 3 - 10 = 1: [0, 0, 1, 1].
  auto same_upper = [](bool keep_output_padding) {
    onnx::ModelProto p = fx::load_proto(kUnet + "/decoder_ops.onnx");
    for (auto& n : *p.mutable_graph()->mutable_node())
      if (n.name() == "/t1/ConvTranspose") {
        auto* attrs = n.mutable_attribute();
        for (int k = attrs->size() - 1; k >= 0; --k)
          if (attrs->Get(k).name() == "pads" || (!keep_output_padding && attrs->Get(k).name() == "output_padding"))
            attrs->DeleteSubrange(k, 1);
        onnx::AttributeProto* a = n.add_attribute();
        a->set_name("auto_pad");
        set_string(*a, "SAME_UPPER");
      }
    return fx::save_temp(p, keep_output_padding ? "same_upper_op" : "same_upper");
  };
  ir::Model same = import_onnx(same_upper(false));
  int found = 0;
  for (const auto& op : same.ops)
    if (op.name == "/t1/ConvTranspose") {
      ++found;
      EXPECT_EQ(op.output_shape, (ir::Shape{ir::kBatch, 3, 10, 10}));
      EXPECT_EQ(op.attrs.at("padding"), Json({0, 0, 1, 1}));
    }
  EXPECT_EQ(found, 1);
  // With output_padding, libonnx's shape inference (11x11) and the spec (10x10) disagree: refused.
  EXPECT_THAT(error_of(same_upper(true)),
              HasSubstr("\"/t1/ConvTranspose\" (ConvTranspose): ONNX shape inference gives output"));
}

/// Upsample(x [B, 2, 5, 5], scales [1, 1, 2, 3]) at opset 9 (as torch exported interpolate before opset 10).
std::string upsample_model(const std::string& mode) {
  onnx::ModelProto m;
  m.set_ir_version(7);
  m.add_opset_import()->set_version(9);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("upsample");
  auto value = [](onnx::ValueInfoProto* v, const char* name, std::vector<int64_t> dims) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    t->mutable_shape()->add_dim()->set_dim_param("batch");
    for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  };
  value(g->add_input(), "x", {2, 5, 5});
  value(g->add_output(), "y", {2, 10, 15});
  onnx::TensorProto* sc = g->add_initializer();
  sc->set_name("scales");
  sc->set_data_type(onnx::TensorProto::FLOAT);
  sc->add_dims(4);
  for (float f : {1.f, 1.f, 2.f, 3.f}) sc->add_float_data(f);
  onnx::NodeProto* n = g->add_node();
  n->set_name("up");
  n->set_op_type("Upsample");
  n->add_input("x");
  n->add_input("scales");
  n->add_output("y");
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name("mode");
  set_string(*a, mode);
  return fx::save_temp(m, "upsample_" + mode);
}

TEST(OnnxDecoder, OpsetNineUpsampleNearestMapsAndLinearIsRefused) {
  ir::Model m = import_onnx(upsample_model("nearest"));
  ASSERT_EQ(m.ops.size(), 2u);  // resize + the appended mse_loss
  EXPECT_EQ(m.ops[0].kind, ir::OpKind::resize);
  EXPECT_EQ(m.ops[0].output_shape, (ir::Shape{ir::kBatch, 2, 10, 15}));
  EXPECT_EQ(m.ops[0].attrs, (Json{{"size", {10, 15}}, {"mode", "nearest"}, {"scales", {2.0, 3.0}}}));
  // Opset 9's linear Upsample uses asymmetric coordinates, which no PyTorch kernel computes.
  EXPECT_THAT(error_of(upsample_model("linear")),
              HasSubstr("\"up\" (Upsample): linear with coordinate_transformation_mode asymmetric"));
}

/// torch.export's adaptive_avg_pool2d without an integer ratio: x [B, 2, side, side] -> Transpose
/// (2, 3, 0, 1) -> GatherND(indices [o, k, o, k, 2]: output (a, b) reads rows rows(a, i), columns
/// cols(b, j)) -> Transpose (4, 5, 0, 1, 2, 3) -> ReduceMean over axes 3 and 5.
std::string index_pool_model(int64_t side, int64_t o, int64_t k, const std::function<int64_t(int64_t, int64_t)>& read,
                             const std::string& tag, const std::string& reduce = "ReduceMean") {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("index_pool");
  auto* in = g->add_input();
  in->set_name("x");
  auto* t = in->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_param("batch");
  for (int64_t d : {int64_t{2}, side, side}) t->mutable_shape()->add_dim()->set_dim_value(d);
  g->add_output()->set_name("y");
  onnx::TensorProto* idx = g->add_initializer();
  idx->set_name("idx");
  idx->set_data_type(onnx::TensorProto::INT64);
  for (int64_t d : {o, k, o, k, int64_t{2}}) idx->add_dims(d);
  for (int64_t a = 0; a < o; ++a)
    for (int64_t i = 0; i < k; ++i)
      for (int64_t b = 0; b < o; ++b)
        for (int64_t j = 0; j < k; ++j) {
          idx->add_int64_data(read(a, i));
          idx->add_int64_data(read(b, j));
        }
  auto node = [&](const std::string& type, std::vector<std::string> ins, const std::string& out) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(type);
    n->set_name("/pool/" + type + "_" + out);
    for (auto& x : ins) n->add_input(x);
    n->add_output(out);
    return n;
  };
  auto ints = [](onnx::NodeProto* n, const char* name, const std::vector<int64_t>& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    set_ints(*a, v);
  };
  ints(node("Transpose", {"x"}, "hw_first"), "perm", {2, 3, 0, 1});
  node("GatherND", {"hw_first", "idx"}, "windows");
  ints(node("Transpose", {"windows"}, "back"), "perm", {4, 5, 0, 1, 2, 3});
  auto* r = node(reduce, {"back"}, "y");
  ints(r, "axes", {-3, -1});
  auto* keep = r->add_attribute();
  keep->set_name("keepdims");
  keep->set_type(onnx::AttributeProto::INT);
  keep->set_i(0);
  return fx::save_temp(m, tag);
}

// AlexNet's AdaptiveAvgPool2d((6, 6)) on a 1x1 map (every window the one cell) is resize nearest;
// 7x7 -> 3x3 (windows of 3 every 2) is avgpool; windows the IR cannot express are refused naming the
// GatherND (tests/fixtures/dynamo_vision's alexnet trains through the first).
TEST(OnnxDecoder, AGatherOfConstantWindowsAndAMeanIsTheResizeOrPoolItIs) {
  ir::Model up = import_onnx(index_pool_model(
      1, 6, 1, [](int64_t, int64_t) { return 0; }, "replicate"));
  ASSERT_EQ(up.ops.size(), 2u);  // + the appended mse_loss
  EXPECT_EQ(up.ops[0].kind, ir::OpKind::resize);
  EXPECT_EQ(up.ops[0].output_shape, (ir::Shape{ir::kBatch, 2, 6, 6}));
  EXPECT_EQ(up.ops[0].attrs, (Json{{"size", {6, 6}}, {"mode", "nearest"}}));
  ir::Model two = import_onnx(index_pool_model(
      2, 6, 1, [](int64_t a, int64_t) { return a / 3; }, "two_to_six"));
  EXPECT_EQ(two.ops[0].kind, ir::OpKind::resize);
  ir::Model pool = import_onnx(index_pool_model(
      7, 3, 3, [](int64_t a, int64_t i) { return 2 * a + i; }, "pool"));
  EXPECT_EQ(pool.ops[0].kind, ir::OpKind::avgpool);
  EXPECT_EQ(pool.ops[0].output_shape, (ir::Shape{ir::kBatch, 2, 3, 3}));
  EXPECT_EQ(pool.ops[0].attrs, (Json{{"kernel", {3, 3}}, {"stride", {2, 2}}}));
  // 5x5 -> 3x3 reading rows [0, 1], [2, 3], [3, 4]: windows of 2 with no one stride; a shuffled replication;
  // a max over the windows.
  EXPECT_THAT(error_of(index_pool_model(
                  5, 3, 2, [](int64_t a, int64_t i) { return a == 2 ? 3 + i : 2 * a + i; }, "uneven")),
              HasSubstr("\"/pool/GatherND_windows\" (GatherND): a pool over H and W written as a gather of constant "
                        "indices and a mean (torch.export's adaptive_avg_pool2d): windows of 2x2 cells that are "
                        "neither one cell each (resize nearest) nor every stride from 0 (avgpool)"));
  EXPECT_THAT(error_of(index_pool_model(
                  2, 6, 1, [](int64_t a, int64_t) { return a % 2; }, "shuffled")),
              HasSubstr("output row 1 reads row 1, not the nearest source 0"));
  EXPECT_THAT(error_of(index_pool_model(
                  7, 3, 3, [](int64_t a, int64_t i) { return 2 * a + i; }, "max", "ReduceMax")),
              HasSubstr("\"/pool/GatherND_windows\" (GatherND): a pool over H and W written as a gather of constant "
                        "indices and a mean (torch.export's adaptive_avg_pool2d): the gathered windows are not moved "
                        "back and averaged by one ReduceMean"));
}

TEST(OnnxDecoder, LossChoiceForDenseOutputs) {
  // Default: [B, C, H, W] outputs get MSE; GRAPHPIPE_ONNX_LOSS=cross_entropy per-pixel cross-entropy.
  const std::string seg = kUnet + "/unet_seg.onnx";
  ir::Model mse = import_onnx(seg);
  EXPECT_EQ(mse.ops.back().kind, ir::OpKind::mse_loss);
  ASSERT_EQ(setenv("GRAPHPIPE_ONNX_LOSS", "cross_entropy", 1), 0);
  ir::Model ce = import_onnx(seg);
  EXPECT_EQ(ce.ops.back().kind, ir::OpKind::cross_entropy);
  EXPECT_EQ(ce.inputs.back().name, "label");
  EXPECT_EQ(ce.inputs.back().shape, (ir::Shape{ir::kBatch, 16, 16}));
  EXPECT_EQ(ce.inputs.back().dtype, ir::DType::i64);
  ASSERT_EQ(setenv("GRAPHPIPE_ONNX_LOSS", "dice", 1), 0);
  EXPECT_EQ(error_of(seg), "GRAPHPIPE_ONNX_LOSS: expected auto, cross_entropy, mse or bce, found \"dice\"");
  unsetenv("GRAPHPIPE_ONNX_LOSS");
}

}  // namespace
}  // namespace gp::importers
