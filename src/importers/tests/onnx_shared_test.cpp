// Tied parameters in ONNX files (issue 20): one initializer read by the weight slots of several IR
// ops becomes one ir::SharedParam, so the imported model counts it once, as PyTorch does; the
// weights load for every use with the same values; a tie in two different layouts is refused; the
// model JSON writes and reads the shared parameters back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

#include "importers/model_json.h"
#include "importers/onnx_import.h"
#include "importers/resolve.h"
#include "importers/tests/onnx_fixtures.h"
#include "support/error.h"

namespace gp::importers {
namespace {

using testing::expected;
using ::testing::HasSubstr;
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

// --- default exports (issue 34): folded transposed copies, --ties, graphpipe.export metadata ---

// tied_embedding.onnx as constant folding writes it: the head's Transpose(tok.weight) replaced by an
// anonymous initializer holding the transpose (`change` edits its values, e.g. to break the copy).
onnx::ModelProto folded_tie(const std::function<void(std::vector<float>&)>& change = {}) {
  onnx::ModelProto m = testing::load_proto(kDir + "/tied_embedding.onnx");
  onnx::GraphProto* g = m.mutable_graph();
  const onnx::TensorProto* tok = nullptr;
  for (const auto& init : g->initializer())
    if (init.name() == "tok.weight") tok = &init;
  EXPECT_NE(tok, nullptr);
  const int64_t rows = tok->dims(0), cols = tok->dims(1);
  std::vector<float> table(static_cast<size_t>(rows * cols)), copy(table.size());
  std::memcpy(table.data(), tok->raw_data().data(), table.size() * sizeof(float));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      copy[static_cast<size_t>(j * rows + i)] = table[static_cast<size_t>(i * cols + j)];
  if (change) change(copy);
  onnx::TensorProto* c = g->add_initializer();
  c->set_name("onnx::MatMul_9");
  c->set_data_type(onnx::TensorProto::FLOAT);
  c->add_dims(cols);
  c->add_dims(rows);
  for (float x : copy) c->add_float_data(x);
  for (int i = 0; i < g->node_size(); ++i)
    if (g->node(i).op_type() == "Transpose" && g->node(i).input(0) == "tok.weight") {
      const std::string out = g->node(i).output(0);
      g->mutable_node()->DeleteSubrange(i, 1);
      for (auto& n : *g->mutable_node())
        for (auto& in : *n.mutable_input())
          if (in == out) in = "onnx::MatMul_9";
      break;
    }
  return m;
}

struct TiesEnv {
  explicit TiesEnv(const char* mode) { setenv("GRAPHPIPE_ONNX_TIES", mode, 1); }
  ~TiesEnv() { unsetenv("GRAPHPIPE_ONNX_TIES"); }
};

TEST(OnnxTies, AFoldedTransposedCopyIsTheWeightItCopies) {
  const std::string path = save_temp(folded_tie(), "folded_tie");
  OnnxImportReport report;
  ir::Graph g = ir::Graph::build(import_onnx(path, &report));
  EXPECT_EQ(g.total_params(), 4256);  // PyTorch's count; the file holds the table twice (7,456)
  ASSERT_EQ(g.model().shared_params.size(), 1u);
  EXPECT_EQ(g.model().shared_params[0].name, "tok.weight");
  EXPECT_EQ(g.model().shared_params[0].uses, (std::vector<std::string>{"/tok/Gather/weight", "/out/MatMul/weight"}));
  EXPECT_EQ(report.ties_mode, "auto");
  ASSERT_EQ(report.shared.size(), 1u);
  EXPECT_EQ(report.shared[0].kind, "transposed copy");
  EXPECT_EQ(report.shared[0].names, (std::vector<std::string>{"onnx::MatMul_9"}));
  EXPECT_TRUE(report.shared[0].trained_as_one);
  // Both uses load the table (the copy turned back), as for the unfolded file.
  ParamValues w = load_weights(path);
  EXPECT_EQ(w.at("/out/MatMul/weight").data, w.at("/tok/Gather/weight").data);
  for (const char* mode : {"keep", "split"}) {
    TiesEnv env(mode);
    OnnxImportReport r;
    EXPECT_EQ(ir::Graph::build(import_onnx(path, &r)).total_params(), 7456) << mode;
    EXPECT_EQ(r.ties_mode, mode);
    ASSERT_EQ(r.shared.size(), 1u);
    EXPECT_FALSE(r.shared[0].trained_as_one);
  }
}

TEST(OnnxTies, OnlyAnExactNonConstantTransposeIsACopy) {
  // One element off: two parameters that happen to be close, not a fold.
  const std::string off = save_temp(folded_tie([](std::vector<float>& c) { c[17] += 1e-6f; }), "folded_off");
  OnnxImportReport r;
  EXPECT_EQ(ir::Graph::build(import_onnx(off, &r)).total_params(), 7456);
  EXPECT_TRUE(r.shared.empty());
  // All equal (zeros, ones): equal values say nothing about a tie.
  const std::string zeros = save_temp(folded_tie([](std::vector<float>& c) { std::fill(c.begin(), c.end(), 0.f); }),
                                      "folded_zeros");
  EXPECT_EQ(load_graph(zeros).total_params(), 7456);
}

TEST(OnnxTies, ABadModeIsOneLineNamingTheVariable) {
  TiesEnv env("merge");
  try {
    load_graph(kDir + "/tied_embedding.onnx");
    FAIL() << "imported";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("GRAPHPIPE_ONNX_TIES (--ties): expected auto"));
    EXPECT_THAT(e.what(), HasSubstr("found \"merge\""));
  }
}

onnx::ModelProto with_metadata(const std::string& value) {
  onnx::ModelProto m = folded_tie();
  auto* p = m.add_metadata_props();
  p->set_key("graphpipe.export");
  p->set_value(value);
  return m;
}

TEST(OnnxTies, GraphpipeExportMetadataDecidesExactly) {
  // The metadata names the parameters: nothing is guessed, the anonymous copy is not read as a tie.
  const std::string path = save_temp(
      with_metadata(R"({"format":"graphpipe.export/1","torch":"2.11.0","parameters":{"tok.weight":["tok.weight"],)"
                    R"("fc.weight":["fc.weight"],"fc.bias":["fc.bias"]}})"),
      "meta_ok");
  OnnxImportReport r;
  EXPECT_EQ(ir::Graph::build(import_onnx(path, &r)).total_params(), 7456);
  EXPECT_EQ(r.ties_mode, "exact");
  EXPECT_TRUE(r.shared.empty());
  // The committed tie, described by its metadata: one parameter with both PyTorch names listed.
  onnx::ModelProto tied = testing::load_proto(kDir + "/tied_embedding.onnx");
  auto* p = tied.add_metadata_props();
  p->set_key("graphpipe.export");
  p->set_value(R"({"format":"graphpipe.export/1","parameters":{"tok.weight":["tok.weight","out.weight"]}})");
  OnnxImportReport rt;
  EXPECT_EQ(ir::Graph::build(import_onnx(save_temp(tied, "meta_tied"), &rt)).total_params(), 4256);
  ASSERT_EQ(rt.shared.size(), 1u);
  EXPECT_EQ(rt.shared[0].kind, "named tie");
  EXPECT_EQ(rt.shared[0].names, (std::vector<std::string>{"tok.weight", "out.weight"}));
}

TEST(OnnxTies, BadMetadataNamesTheFieldAndValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "metadata \"graphpipe.export\" is not a JSON object"},
      {R"({"format":"graphpipe.export/9","parameters":{}})", "field \"format\" is \"graphpipe.export/9\""},
      {R"({"format":"graphpipe.export/1"})", "field \"parameters\" must be an object"},
      {R"({"format":"graphpipe.export/1","parameters":{"nope":["x"]}})", "parameters names \"nope\""},
      {R"({"format":"graphpipe.export/1","parameters":{"fc.bias":[3]}})", "parameters[\"fc.bias\"] holds 3"},
  };
  for (const auto& [value, want] : cases) {
    try {
      load_graph(save_temp(with_metadata(value), "meta_bad"));
      ADD_FAILURE() << "imported: " << value;
    } catch (const UserError& e) {
      EXPECT_THAT(e.what(), HasSubstr(want)) << value;
    }
  }
}

// --- opsets 18-21 read as 17 (onnx_opset.cpp) ---

// x [B, 4, 8] -> Gelu -> ReduceMean(axes input [1]) -> Gemm(W [8, 3]) at `opset`.
onnx::ModelProto opset_model(int opset, const std::function<void(onnx::GraphProto&)>& change = {}) {
  onnx::ModelProto m;
  m.set_ir_version(9);
  m.add_opset_import()->set_version(opset);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("opset");
  auto* in = g->add_input();
  in->set_name("x");
  auto* t = in->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_param("batch");
  t->mutable_shape()->add_dim()->set_dim_value(4);
  t->mutable_shape()->add_dim()->set_dim_value(8);
  g->add_output()->set_name("y");
  onnx::TensorProto* w = g->add_initializer();
  w->set_name("W");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(8);
  w->add_dims(3);
  for (int i = 0; i < 24; ++i) w->add_float_data(0.1f * static_cast<float>(i));
  onnx::TensorProto* axes = g->add_initializer();
  axes->set_name("axes");
  axes->set_data_type(onnx::TensorProto::INT64);
  axes->add_dims(1);
  axes->add_int64_data(1);
  auto node = [&](const std::string& type, std::vector<std::string> ins, const std::string& out) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(type);
    n->set_name("/" + out);
    for (auto& i : ins) n->add_input(i);
    n->add_output(out);
    return n;
  };
  node("Gelu", {"x"}, "g");
  auto* r = node("ReduceMean", {"g", "axes"}, "r");
  auto* keep = r->add_attribute();
  keep->set_name("keepdims");
  keep->set_type(onnx::AttributeProto::INT);
  keep->set_i(0);
  node("MatMul", {"r", "W"}, "y");
  if (change) change(*g);
  return m;
}

TEST(OnnxOpset, Opsets18To21ReadAsOpset17) {
  for (int opset : {20, 21}) {
    ir::Graph g = load_graph(save_temp(opset_model(opset), "opset" + std::to_string(opset)));
    std::map<std::string, int> kinds = testing::kind_counts(g.model());
    EXPECT_EQ(kinds["gelu"], 1) << opset;  // Gelu (opset 20) through the erf form's pattern
    EXPECT_EQ(kinds["mean"], 1) << opset;  // ReduceMean with its axes as an input (opset 18)
    EXPECT_EQ(kinds["linear"], 1) << opset;
    EXPECT_EQ(g.total_params(), 24);
  }
}

// torch 2.x's dynamo exporter with optimize=False writes mean's dims as Reshape(Constant, [-1]): axes
// computed from constants only are evaluated; axes computed from the data stay refused (below).
TEST(OnnxOpset, ReduceAxesComputedFromConstantsAreEvaluated) {
  const std::string path = save_temp(opset_model(18,
                                                 [](onnx::GraphProto& g) {
                                                   onnx::NodeProto* c = g.add_node();
                                                   c->set_op_type("Constant");
                                                   c->add_output("axes_2d");
                                                   auto* v = c->add_attribute();
                                                   v->set_name("value");
                                                   v->set_type(onnx::AttributeProto::TENSOR);
                                                   v->mutable_t()->set_data_type(onnx::TensorProto::INT64);
                                                   v->mutable_t()->add_dims(1);
                                                   v->mutable_t()->add_dims(1);
                                                   v->mutable_t()->add_int64_data(-2);
                                                   onnx::NodeProto* r = g.add_node();
                                                   r->set_op_type("Reshape");
                                                   r->set_name("/axes_flat");
                                                   r->add_input("axes_2d");
                                                   r->add_input("minus_one");
                                                   r->add_output("axes_flat");
                                                   onnx::TensorProto* m1 = g.add_initializer();
                                                   m1->set_name("minus_one");
                                                   m1->set_data_type(onnx::TensorProto::INT64);
                                                   m1->add_dims(1);
                                                   m1->add_int64_data(-1);
                                                   g.mutable_node(1)->set_input(1, "axes_flat");
                                                 }),
                                     "opset_axes_computed");
  ir::Graph g = load_graph(path);
  std::map<std::string, int> kinds = testing::kind_counts(g.model());
  EXPECT_EQ(kinds["mean"], 1);  // over dim -2 = 1, as the constant axes [1]
  EXPECT_EQ(kinds["linear"], 1);
  EXPECT_EQ(g.total_params(), 24);
  EXPECT_EQ(g.model().outputs.size(), 1u);
}

TEST(OnnxOpset, WhatOpset17CannotSayIsRefusedNamingTheNode) {
  auto set_int = [](onnx::NodeProto& n, const char* name, int64_t v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  };
  const std::string noop = save_temp(
      opset_model(18, [&](onnx::GraphProto& g) { set_int(*g.mutable_node(1), "noop_with_empty_axes", 1); }),
      "opset_noop");
  const std::string computed = save_temp(opset_model(18,
                                                     [&](onnx::GraphProto& g) {
                                                       g.mutable_node(1)->set_input(1, "x");  // axes from a data tensor
                                                     }),
                                         "opset_axes");
  for (const auto& [path, want] : {std::pair{noop, "node \"/r\" (ReduceMean): noop_with_empty_axes=1"},
                                   std::pair{computed, "axes \"x\" is computed, not a constant"}}) {
    try {
      load_graph(path);
      ADD_FAILURE() << "imported " << path;
    } catch (const UserError& e) {
      EXPECT_THAT(e.what(), HasSubstr(want));
      EXPECT_THAT(e.what(), HasSubstr("opset 18 is read as opset 17"));
    }
  }
  try {
    load_graph(save_temp(opset_model(22), "opset22"));
    ADD_FAILURE() << "imported opset 22";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("opset 22 is not supported (supported: 7 to 21)"));
  }
}

}  // namespace
}  // namespace gp::importers
