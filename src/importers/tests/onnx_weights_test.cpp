// ONNX weights: import_onnx_weights / load_weights map the committed fixtures' initializers to the IR
// parameters (one entry per parameter, PyTorch's parameter count in total), give nothing for files
// exported without weights, read raw_data, float_data, float16 and double initializers, and report a
// size mismatch naming the file, the initializer and the op.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "importers/onnx_import.h"
#include "importers/tests/onnx_fixtures.h"
#include "importers/resolve.h"
#include "importers/weights.h"
#include "ir/attrs.h"
#include "support/error.h"

namespace gp::importers {
namespace {

using testing::expected;
using ::testing::HasSubstr;
using testing::kDir;
using testing::load_proto;
using testing::save_temp;

/// The runtime's parameter names and shapes (runtime/exec/params.cpp param_specs), written out again
/// here without LibTorch for the kinds the importer produces.
std::map<std::string, std::vector<int64_t>> ir_params(const ir::Graph& g) {
  std::map<std::string, std::vector<int64_t>> out;
  auto shape_of = [&](const std::string& n) -> const ir::Shape& {
    if (const ir::Input* in = g.find_input(n)) return in->shape;
    return g.op(g.find(n)).output_shape;
  };
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const ir::Op& op = g.op(OpId(static_cast<int32_t>(i)));
    const ir::Shape& x = op.inputs.empty() ? ir::Shape{} : shape_of(op.inputs[0]);
    auto add = [&](const char* p, std::vector<int64_t> s) { out[op.name + "/" + p] = std::move(s); };
    switch (op.kind) {
      case ir::OpKind::linear: {
        int64_t o = ir::attr_int(op, "out_features", std::nullopt, "t");
        add("weight", {o, x.back()});
        if (ir::attr_bool(op, "bias", true, "t")) add("bias", {o});
        break;
      }
      case ir::OpKind::conv2d: {
        int64_t co = ir::attr_int(op, "out_channels", std::nullopt, "t"),
                k = ir::attr_int(op, "kernel", std::nullopt, "t");
        add("weight", {co, x[1], k, k});
        if (ir::attr_bool(op, "bias", true, "t")) add("bias", {co});
        break;
      }
      case ir::OpKind::layernorm: add("weight", {x.back()}), add("bias", {x.back()}); break;
      case ir::OpKind::batchnorm: add("weight", {x[1]}), add("bias", {x[1]}); break;
      case ir::OpKind::embedding: {
        int64_t d = ir::attr_int(op, "dim", std::nullopt, "t");
        add("weight", {ir::attr_int(op, "rows", std::nullopt, "t"), d});
        if (ir::attr_bool(op, "positions", false, "t"))
          add("pos", {ir::attr_int(op, "position_rows", x.at(1), "t"), d});
        break;
      }
      case ir::OpKind::attention: {
        int64_t h = x.back();
        for (const char* p : {"wq", "wk", "wv", "wo"}) add(p, {h, h});
        for (const char* p : {"bq", "bk", "bv", "bo"}) add(p, {h});
        break;
      }
      default: break;
    }
  }
  return out;
}

void check_one_entry_per_param(const std::string& name) {
  SCOPED_TRACE(name);
  const std::string path = kDir + "/" + name + ".onnx";
  ir::Graph g = ir::Graph::build(import_onnx(path), name);
  auto want = ir_params(g);
  auto t0 = std::chrono::steady_clock::now();
  ParamValues w = load_weights(path);
  std::printf("[weights] %s: %zu parameters read in %.1f ms\n", name.c_str(), w.size(),
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_EQ(w.size(), want.size());
  int64_t total = 0;
  for (const auto& [key, shape] : want) {
    auto it = w.find(key);
    ASSERT_NE(it, w.end()) << key;
    EXPECT_EQ(it->second.shape, shape) << key;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    EXPECT_EQ(static_cast<int64_t>(it->second.data.size()), n) << key;
    total += static_cast<int64_t>(it->second.data.size());
  }
  EXPECT_EQ(total, expected().at(name).at("params").get<int64_t>());
  EXPECT_EQ(total, g.total_params());
  // The one-pass form training uses gives the same model and weights.
  ParamValues w2;
  ir::Graph g2 = load_graph(path, w2);
  EXPECT_TRUE(g2.model() == g.model());
  EXPECT_EQ(w2.size(), w.size());
  for (const auto& [key, v] : w) EXPECT_EQ(w2.at(key).data, v.data) << key;
}

TEST(OnnxWeights, TwoBranchOneEntryPerParameter) { check_one_entry_per_param("two_branch"); }
TEST(OnnxWeights, EncoderOp13OneEntryPerParameter) { check_one_entry_per_param("encoder_op13"); }
TEST(OnnxWeights, EncoderOp17OneEntryPerParameter) { check_one_entry_per_param("encoder_op17"); }
TEST(OnnxWeights, SeparateQkvOneEntryPerParameter) { check_one_entry_per_param("attention_qkv"); }
TEST(OnnxWeights, TokenEncoderOneEntryPerParameter) { check_one_entry_per_param("token_encoder"); }
TEST(OnnxWeights, TokenPositionEmbeddingOneEntryPerParameter) { check_one_entry_per_param("token_posemb"); }

onnx::TensorProto* initializer(onnx::ModelProto& m, const std::string& name) {
  for (auto& t : *m.mutable_graph()->mutable_initializer())
    if (t.name() == name) return &t;
  ADD_FAILURE() << "no initializer " << name;
  return nullptr;
}

std::vector<float> raw_floats(const onnx::TensorProto& t) {
  std::vector<float> v(t.raw_data().size() / sizeof(float));
  std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
  return v;
}

// Three [h, h] input projections (not torch's packed in_proj): Q, K and V told apart by data flow.
TEST(OnnxWeights, SeparateQkvProjectionsByDataFlow) {
  const std::string path = kDir + "/attention_qkv.onnx";
  onnx::ModelProto m = load_proto(path);
  auto values = [&](const std::string& name) {
    const onnx::TensorProto* t = initializer(m, name);
    return t ? raw_floats(*t) : std::vector<float>{};
  };
  ParamValues w = load_weights(path);
  ir::Graph g = load_graph(path);
  std::string att;
  for (size_t i = 0; i < g.num_ops(); ++i)
    if (g.op(OpId(static_cast<int32_t>(i))).kind == ir::OpKind::attention)
      att = g.op(OpId(static_cast<int32_t>(i))).name;
  ASSERT_FALSE(att.empty());
  for (const char* p : {"q", "k", "v", "o"}) {
    EXPECT_EQ(w.at(att + "/w" + p).data, values(std::string(p) + ".weight")) << p;
    EXPECT_EQ(w.at(att + "/b" + p).data, values(std::string(p) + ".bias")) << p;
  }
}

TEST(OnnxWeights, ExportedWithoutWeightsGivesNothing) {
  EXPECT_TRUE(load_weights(kDir + "/resnet18.onnx").empty());
  EXPECT_TRUE(load_weights(kDir + "/googlenet.onnx").empty());
  EXPECT_TRUE(load_weights("mmt:branches=2,layers=1,hidden=16,seq=4,heads=2,ffn=32").empty());
}

// Values and transforms: Gemm transB=1 weights keep [out, in]; the packed in_proj [3h, h] is split into
// Q, K, V rows; the MatMul weights (behind a Transpose of [out, in]) come back as [out, in].
TEST(OnnxWeights, ValuesComeFromTheNamedInitializers) {
  onnx::ModelProto m = load_proto(kDir + "/encoder_op17.onnx");
  ParamValues w = load_weights(kDir + "/encoder_op17.onnx");
  auto in_proj = raw_floats(*initializer(m, "encoder.layers.1.self_attn.in_proj_weight"));
  auto in_bias = raw_floats(*initializer(m, "encoder.layers.1.self_attn.in_proj_bias"));
  const int64_t h = 64;
  const std::string att = "/encoder/layers.1/self_attn/attention/";
  const char* ws[3] = {"wq", "wk", "wv"};
  const char* bs[3] = {"bq", "bk", "bv"};
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(w.at(att + ws[k]).data,
              std::vector<float>(in_proj.begin() + k * h * h, in_proj.begin() + (k + 1) * h * h));
    EXPECT_EQ(w.at(att + bs[k]).data, std::vector<float>(in_bias.begin() + k * h, in_bias.begin() + (k + 1) * h));
  }
  EXPECT_EQ(w.at(att + "wo").data, raw_floats(*initializer(m, "encoder.layers.1.self_attn.out_proj.weight")));
  // linear1: MatMul(x, Transpose(W)) + Add(b): W as stored ([128, 64], torch's [out, in]).
  ir::Graph g = load_graph(kDir + "/encoder_op17.onnx");
  std::string lin1;
  for (size_t i = 0; i < g.num_ops(); ++i)
    if (g.op(OpId(static_cast<int32_t>(i))).name.find("layers.0/linear1") != std::string::npos)
      lin1 = g.op(OpId(static_cast<int32_t>(i))).name;
  ASSERT_FALSE(lin1.empty());
  EXPECT_EQ(w.at(lin1 + "/weight").shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(w.at(lin1 + "/weight").data, raw_floats(*initializer(m, "encoder.layers.0.linear1.weight")));
  EXPECT_EQ(w.at(lin1 + "/bias").data, raw_floats(*initializer(m, "encoder.layers.0.linear1.bias")));
}

// The same weights stored as float_data, float16 raw data and double raw data.
TEST(OnnxWeights, FloatDataFloat16AndDoubleInitializers) {
  const std::string name = "head.3.weight";
  onnx::ModelProto m = load_proto(kDir + "/two_branch.onnx");
  const std::vector<float> orig = raw_floats(*initializer(m, name));
  std::string head;  // IR op of head.3 (the last Gemm)
  for (const auto& [key, v] : load_weights(kDir + "/two_branch.onnx"))
    if (v.data == orig) head = key;
  ASSERT_FALSE(head.empty());

  onnx::ModelProto typed = m;
  auto* t = initializer(typed, name);
  t->clear_raw_data();
  for (float f : orig) t->add_float_data(f);
  EXPECT_EQ(load_weights(save_temp(typed, "float_data")).at(head).data, orig);

  onnx::ModelProto dbl = m;
  t = initializer(dbl, name);
  std::string raw;
  for (float f : orig) {
    double d = f;
    raw.append(reinterpret_cast<const char*>(&d), sizeof d);
  }
  t->set_data_type(onnx::TensorProto::DOUBLE);
  t->set_raw_data(raw);
  EXPECT_EQ(load_weights(save_temp(dbl, "double")).at(head).data, orig);

  // float16: values rounded to 11 significant bits; 0.5, -2 and 1/1024 exactly.
  onnx::ModelProto half = m;
  t = initializer(half, name);
  std::vector<uint16_t> bits(orig.size(), 0x3c00);  // 1.0
  bits[0] = 0x3800;                                 // 0.5
  bits[1] = 0xc000;                                 // -2
  bits[2] = 0x1400;                                 // 2^-10
  bits[3] = 0x0001;                                 // smallest subnormal 2^-24
  t->set_data_type(onnx::TensorProto::FLOAT16);
  t->set_raw_data(std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2));
  auto v = load_weights(save_temp(half, "float16")).at(head).data;
  ASSERT_EQ(v.size(), orig.size());
  EXPECT_EQ(v[0], 0.5f);
  EXPECT_EQ(v[1], -2.0f);
  EXPECT_EQ(v[2], std::ldexp(1.0f, -10));
  EXPECT_EQ(v[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(v[4], 1.0f);
}

TEST(OnnxWeights, SizeMismatchNamesFileInitializerAndOp) {
  onnx::ModelProto m = load_proto(kDir + "/two_branch.onnx");
  auto* t = initializer(m, "left.2.weight");
  t->set_raw_data(t->raw_data().substr(0, t->raw_data().size() - 4));  // one float short
  std::string path = save_temp(m, "short");
  try {
    load_weights(path);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
    EXPECT_THAT(e.what(), HasSubstr("initializer \"left.2.weight\""));
    EXPECT_THAT(e.what(), HasSubstr("of op \"/left/left.2/Gemm\""));
    EXPECT_THAT(e.what(), HasSubstr("16380 bytes of raw data, expected 16384"));
  }
  // Planning never reads the values: the import itself still succeeds.
  EXPECT_NO_THROW(import_onnx(path));
}

}  // namespace
}  // namespace gp::importers
