// Tied parameters in ONNX files (issue 20): one initializer read by the weight slots of several IR
// ops becomes one ir::SharedParam, so the imported model counts it once, as PyTorch does; the
// weights load for every use with the same values; a tie in two different layouts is refused; the
// model JSON writes and reads the shared parameters back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "importers/model_json.h"
#include "importers/onnx_import.h"
#include "importers/resolve.h"
#include "importers/tests/onnx_fixtures.h"
#include "support/error.h"

namespace gp::importers {
namespace {

using ::testing::HasSubstr;
using testing::expected;
using testing::kDir;
using testing::save_temp;

TEST(OnnxShared, TiedEmbeddingImportsWithPyTorchsParameterCount) {
  ir::Graph g = load_graph(kDir + "/tied_embedding.onnx");
  EXPECT_EQ(g.total_params(), expected().at("tied_embedding").at("params").get<int64_t>());  // 4,256
  EXPECT_EQ(g.total_params(), 4256);
  ASSERT_EQ(g.model().shared_params.size(), 1u);
  const ir::SharedParam& sp = g.model().shared_params[0];
  EXPECT_EQ(sp.name, "tok.weight");
  EXPECT_EQ(sp.shape, (ir::Shape{100, 32}));
  EXPECT_EQ(sp.uses, (std::vector<std::string>{"/tok/Gather/weight", "/out/MatMul/weight"}));
  EXPECT_EQ(g.op(g.find("/out/MatMul")).kind, ir::OpKind::linear);
  EXPECT_EQ(g.costs(g.find("/out/MatMul")).params, 0);
  EXPECT_EQ(g.costs(g.find("/tok/Gather")).params, 3200);
}

TEST(OnnxShared, BothUsesLoadTheSameValues) {
  ParamValues w = load_weights(kDir + "/tied_embedding.onnx");
  const ParamValue& tok = w.at("/tok/Gather/weight");
  const ParamValue& out = w.at("/out/MatMul/weight");  // Transpose(tok.weight), turned back
  EXPECT_EQ(tok.shape, (std::vector<int64_t>{100, 32}));
  EXPECT_EQ(out.shape, tok.shape);
  EXPECT_EQ(out.data, tok.data);
}

// x [B, 8] -> MatMul(x, W) -> MatMul(., second) with W an [8, 8] initializer.
onnx::ModelProto two_matmuls(bool second_transposed) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(14);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("tie");
  auto value = [](onnx::ValueInfoProto* v, const std::string& name) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    t->mutable_shape()->add_dim()->set_dim_param("batch");
    t->mutable_shape()->add_dim()->set_dim_value(8);
  };
  value(g->add_input(), "x");
  value(g->add_output(), "y");
  onnx::TensorProto* w = g->add_initializer();
  w->set_name("W");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(8);
  w->add_dims(8);
  for (int i = 0; i < 64; ++i) w->add_float_data(0.01f * static_cast<float>(i));
  auto node = [&](const std::string& type, std::vector<std::string> in, const std::string& out) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(type);
    n->set_name(out);
    for (auto& i : in) n->add_input(i);
    n->add_output(out);
  };
  node("MatMul", {"x", "W"}, "a");
  if (second_transposed) node("Transpose", {"W"}, "Wt");
  node("MatMul", {"a", second_transposed ? "Wt" : "W"}, "y");
  return m;
}

TEST(OnnxShared, OneInitializerInTwoMatMulsIsOneParameter) {
  ir::Graph g = load_graph(save_temp(two_matmuls(false), "tie_same"));
  ASSERT_EQ(g.model().shared_params.size(), 1u);
  EXPECT_EQ(g.model().shared_params[0].uses, (std::vector<std::string>{"a/weight", "y/weight"}));
  EXPECT_EQ(g.total_params(), 64);
}

TEST(OnnxShared, ATieInTwoLayoutsIsRefusedNamingTheInitializerAndTheOps) {
  try {
    load_graph(save_temp(two_matmuls(true), "tie_transposed"));
    FAIL() << "imported";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("initializer \"W\" is shared by ops \"a\" and \"y\" in different layouts"));
  }
}

TEST(OnnxShared, ModelJsonRoundTripsSharedParamsAndOldFilesLoad) {
  ir::Model m = load_model(kDir + "/tied_embedding.onnx");
  const std::string path = (std::filesystem::temp_directory_path() / "gp_tied_model.json").string();
  write_model_json(path, m);
  ir::Model back = read_model_json(path);
  EXPECT_TRUE(back == m);
  EXPECT_EQ(ir::Graph::build(back).total_params(), 4256);
  EXPECT_TRUE(model_to_json(m).contains("shared_params"));
  // A model without shared parameters writes no such field (files stay as they were).
  ir::Model plain = m;
  plain.shared_params.clear();
  EXPECT_FALSE(model_to_json(plain).contains("shared_params"));
  Json bad = model_to_json(m);
  bad["shared_params"][0]["uses"][1] = "nope/weight";
  try {
    model_from_json(bad, "m.json");
    FAIL() << "accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "m.json: shared_params[0] (\"tok.weight\"): uses[1]: unknown op \"nope\"");
  }
}

}  // namespace
}  // namespace gp::importers
