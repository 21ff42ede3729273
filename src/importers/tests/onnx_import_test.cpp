// ONNX import: the committed fixtures (exported by tests/fixtures/onnx/export_fixtures.py) give the
// op counts and parameter counts PyTorch recorded in expected.json; malformed files give precise errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "importers/onnx_import.h"
#include "importers/tests/onnx_fixtures.h"
#include "importers/resolve.h"
#include "support/error.h"

namespace gp::importers {
namespace {

using testing::error_of;
using testing::expected;
using ::testing::HasSubstr;
using testing::kDir;
using testing::kind_counts;
using testing::load_proto;
using testing::save_temp;

int onnx_count(const Json& e, const char* op) {
  const Json& c = e.at("onnx_node_counts");
  return c.contains(op) ? c.at(op).get<int>() : 0;
}

std::string write_temp(const std::string& name, const std::string& bytes) {
  std::string path = (std::filesystem::temp_directory_path() / ("gp_onnx_test_" + name)).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Parameters equal PyTorch's sum(p.numel()); every op keeps the batch symbolic; a loss is appended.
void check_common(const std::string& name, const ir::Graph& g, const Json& e) {
  SCOPED_TRACE(name);
  EXPECT_EQ(g.total_params(), e.at("params").get<int64_t>());
  const ir::Model& m = g.model();
  ASSERT_EQ(m.outputs.size(), 1u);
  EXPECT_EQ(m.outputs[0], "loss");
  EXPECT_EQ(m.inputs[0].name, "input");
  ir::Shape want{ir::kBatch};
  for (const auto& d : e.at("input_shape")) want.push_back(d.get<int64_t>());
  EXPECT_EQ(m.inputs[0].shape, want);
  for (const auto& op : m.ops)
    if (!ir::is_loss(op.kind)) {
      EXPECT_EQ(op.output_shape.at(0), ir::kBatch) << op.name;
    }
}

TEST(OnnxImport, Resnet18CountsParamsAndFlops) {
  Json e = expected().at("resnet18");
  EXPECT_EQ(e.at("opset"), 13);
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/resnet18.onnx"), "resnet18");
  check_common("resnet18", g, e);
  auto c = kind_counts(g.model());
  // One IR op per ONNX node, except GlobalAveragePool + Flatten -> global_avgpool; plus the loss.
  EXPECT_EQ(c["conv2d"], onnx_count(e, "Conv"));
  EXPECT_EQ(c["batchnorm"], onnx_count(e, "BatchNormalization"));
  EXPECT_EQ(c["relu"], onnx_count(e, "Relu"));
  EXPECT_EQ(c["maxpool"], onnx_count(e, "MaxPool"));
  EXPECT_EQ(c["add"], onnx_count(e, "Add"));
  EXPECT_EQ(c["global_avgpool"], onnx_count(e, "GlobalAveragePool"));
  EXPECT_EQ(c["flatten"], 0);
  EXPECT_EQ(c["linear"], onnx_count(e, "Gemm"));
  EXPECT_EQ(c["cross_entropy"], 1);
  EXPECT_EQ(static_cast<int>(g.num_ops()), e.at("onnx_nodes").get<int>() - onnx_count(e, "Flatten") + 1);
  EXPECT_EQ(g.total_params(), 11689512);  // torchvision resnet18
  // Hand count: 1.814 GMACs of conv + fc at 224x224 = 3.628 GFLOP at 2 FLOPs per MAC; the elementwise
  // ops (batch norm, ReLU, add, pools) add about 1%.
  EXPECT_NEAR(g.total_fwd_flops() / 3.628e9, 1.0, 0.03);
  const auto& last = g.model().ops[g.find("/fc/Gemm").v];
  EXPECT_EQ(last.output_shape, (ir::Shape{ir::kBatch, 1000}));
}

TEST(OnnxImport, GooglenetCeilModePoolsAndConcat) {
  Json e = expected().at("googlenet");
  auto t0 = std::chrono::steady_clock::now();
  ir::Model m = import_onnx(kDir + "/googlenet.onnx");
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "googlenet import: " << ms << " ms, " << m.ops.size() << " ops\n";
  ir::Graph g = ir::Graph::build(m, "googlenet");
  check_common("googlenet", g, e);
  auto c = kind_counts(g.model());
  EXPECT_EQ(c["conv2d"], onnx_count(e, "Conv"));
  EXPECT_EQ(c["batchnorm"], onnx_count(e, "BatchNormalization"));
  EXPECT_EQ(c["relu"], onnx_count(e, "Relu"));
  EXPECT_EQ(c["maxpool"], onnx_count(e, "MaxPool"));
  EXPECT_EQ(c["concat"], onnx_count(e, "Concat"));
  EXPECT_EQ(c["dropout"], onnx_count(e, "Dropout"));
  EXPECT_EQ(c["linear"], onnx_count(e, "Gemm"));
  EXPECT_EQ(static_cast<int>(g.num_ops()),
            e.at("onnx_nodes").get<int>() - onnx_count(e, "Constant") - onnx_count(e, "Flatten") + 1);
  // The stem's 3x3/2 ceil-mode max pool turns 112x112 into 56x56 (floor mode would give 55x55).
  const auto& pool = g.model().ops[g.find("/maxpool1/MaxPool").v];
  EXPECT_EQ(pool.output_shape, (ir::Shape{ir::kBatch, 64, 56, 56}));
  EXPECT_EQ(pool.attrs.at("ceil_mode"), true);
  // torchvision lists 1.50 GMACs: 3.0 GFLOP.
  EXPECT_NEAR(g.total_fwd_flops() / 3.0e9, 1.0, 0.05);
}

TEST(OnnxImport, TwoBranchMlp) {
  Json e = expected().at("two_branch");
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/two_branch.onnx"), "two_branch");
  check_common("two_branch", g, e);
  auto c = kind_counts(g.model());
  EXPECT_EQ(c["linear"], onnx_count(e, "Gemm"));
  EXPECT_EQ(c["relu"], onnx_count(e, "Relu"));
  EXPECT_EQ(c["tanh"], 1);
  EXPECT_EQ(c["sigmoid"], 1);
  EXPECT_EQ(c["concat"], 1);
  EXPECT_EQ(c["dropout"], 1);
  EXPECT_EQ(static_cast<int>(g.num_ops()), e.at("onnx_nodes").get<int>() - onnx_count(e, "Constant") + 1);
  const auto& cat = g.model().ops[g.find("/Concat").v];
  EXPECT_EQ(cat.output_shape, (ir::Shape{ir::kBatch, 96}));
  EXPECT_EQ(g.succs(g.find("/Concat")).size(), 1u);
  EXPECT_EQ(g.preds(g.find("/Concat")).size(), 2u);  // the two towers
}

// Two nn.TransformerEncoderLayer (d_model 64, 4 heads, ffn 128, GELU) + mean over the sequence + head.
void check_encoder(const std::string& name) {
  Json e = expected().at(name);
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/" + name + ".onnx"), name);
  check_common(name, g, e);
  auto c = kind_counts(g.model());
  EXPECT_EQ(c["attention"], onnx_count(e, "Softmax"));  // one self-attention block per Softmax
  EXPECT_EQ(c["attention"], 2);
  EXPECT_EQ(c["gelu"], onnx_count(e, "Erf"));
  EXPECT_EQ(c["layernorm"], e.at("opset") == 17 ? onnx_count(e, "LayerNormalization") : onnx_count(e, "Sqrt"));
  EXPECT_EQ(c["layernorm"], 4);
  EXPECT_EQ(c["linear"], 5);  // 2 x (ffn1, ffn2) + head; attention projections live in attention
  EXPECT_EQ(c["add"], 4);     // residuals
  EXPECT_EQ(c["dropout"], onnx_count(e, "Dropout") - c["attention"]);  // attention-prob dropout is inside
  EXPECT_EQ(c["mean"], 1);
  EXPECT_EQ(g.num_ops(), 25u);
  const auto& att = g.model().ops[g.find("/encoder/layers.0/self_attn/attention").v];
  EXPECT_EQ(att.attrs.at("heads"), 4);
  EXPECT_EQ(att.output_shape, (ir::Shape{ir::kBatch, 16, 64}));
}

TEST(OnnxImport, EncoderOpset13DecomposedLayerNorm) { check_encoder("encoder_op13"); }
TEST(OnnxImport, EncoderOpset17) { check_encoder("encoder_op17"); }

// nn.Embedding(50, 32) on int64 token ids + a learned [1, 12, 32] positional table + one encoder
// layer + mean + head: Gather(weight, ids) becomes an embedding op, and Add(embedding, table) its
// learned positions (no separate op).
TEST(OnnxImport, TokenEmbeddingWithLearnedPositions) {
  Json e = expected().at("token_encoder");
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/token_encoder.onnx"), "token_encoder");
  check_common("token_encoder", g, e);
  EXPECT_EQ(g.model().inputs[0].dtype, ir::DType::i64);
  auto c = kind_counts(g.model());
  EXPECT_EQ(c["embedding"], 1);
  EXPECT_EQ(c["attention"], 1);
  EXPECT_EQ(c["add"], 2);  // the two residuals; the positional Add is folded into the embedding
  const ir::Op& emb = g.op(g.find("/tok/Gather"));
  EXPECT_EQ(emb.kind, ir::OpKind::embedding);
  EXPECT_EQ(emb.inputs, std::vector<std::string>{"input"});
  EXPECT_EQ(emb.attrs.at("rows"), 50);
  EXPECT_EQ(emb.attrs.at("dim"), 32);
  EXPECT_EQ(emb.attrs.at("positions"), true);
  EXPECT_EQ(emb.output_shape, (ir::Shape{ir::kBatch, 12, 32}));
  EXPECT_EQ(g.succs(g.find("/tok/Gather")).size(), 2u);  // attention and the residual add
}

// int32 token ids (torch.int32 inputs) import as the IR's index type, like int64 ones.
TEST(OnnxImport, Int32TokenIdsAreIndices) {
  onnx::ModelProto m = load_proto(kDir + "/token_encoder.onnx");
  m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT32);
  ir::Graph g = ir::Graph::build(import_onnx(save_temp(m, "int32_ids")), "int32_ids");
  EXPECT_EQ(g.model().inputs[0].dtype, ir::DType::i64);
  EXPECT_EQ(g.op(g.find("/tok/Gather")).kind, ir::OpKind::embedding);
  EXPECT_EQ(g.total_params(), 10693);
}

// GPT-2 style positions: nn.Embedding(20, 16) of arange(seq = 10) (Shape -> Gather -> Range folded);
// the whole 20-row table is the parameter, so the count equals PyTorch's.
TEST(OnnxImport, TokenEmbeddingWithPositionEmbeddingOfArange) {
  Json e = expected().at("token_posemb");
  EXPECT_EQ(onnx_count(e, "Range"), 1);
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/token_posemb.onnx"), "token_posemb");
  check_common("token_posemb", g, e);
  auto c = kind_counts(g.model());
  EXPECT_EQ(c["embedding"], 1);
  EXPECT_EQ(c["add"], 2);
  const ir::Op& emb = g.op(g.find("/tok/Gather"));
  EXPECT_EQ(emb.attrs.at("positions"), true);
  EXPECT_EQ(emb.attrs.at("position_rows"), 20);
  EXPECT_EQ(g.costs(g.find("/tok/Gather")).params, 40 * 16 + 20 * 16);
}

TEST(OnnxImport, ResolveUsesTheImporter) {
  ir::Graph g = load_graph(kDir + "/two_branch.onnx");
  EXPECT_EQ(g.name(), "two_branch");
  EXPECT_EQ(g.total_params(), 17322);
}

TEST(OnnxImportErrors, MissingEmptyWrongMagicTruncated) {
  EXPECT_EQ(error_of("/nonexistent/m.onnx"), "/nonexistent/m.onnx: cannot open the ONNX file");
  std::string empty = write_temp("empty.onnx", "");
  EXPECT_EQ(error_of(empty), empty + ": the ONNX file is empty");
  std::string png = write_temp("png.onnx", "\x89PNG\r\n\x1a\n0000");
  EXPECT_EQ(error_of(png), png + ": not an ONNX model (first byte 0x89 is not the start of an ONNX ModelProto)");
  std::string bytes = read_bytes(kDir + "/resnet18.onnx");
  std::string cut = write_temp("cut.onnx", bytes.substr(0, bytes.size() / 2));
  EXPECT_EQ(error_of(cut),
            fmt::format("{}: corrupt or truncated ONNX file (protobuf parsing failed after {} bytes read)", cut,
                        bytes.size() / 2));
  // Cut right after the graph: the opset list is missing.
  std::string head = bytes.substr(0, bytes.size() - 4);
  std::string cut2 = write_temp("cut2.onnx", head);
  EXPECT_THAT(error_of(cut2), HasSubstr(cut2 + ": corrupt or truncated ONNX file"));
}

TEST(OnnxImportErrors, UnknownOperatorsListedWithCounts) {
  std::string path = kDir + "/unknown_op.onnx";
  EXPECT_EQ(error_of(path), path +
                                ": cannot import the ONNX model (nothing was imported): unsupported operators: "
                                "FancyOp x2, WarpDrive x1");
}

TEST(OnnxImportErrors, Cycle) {
  std::string path = kDir + "/cyclic.onnx";
  EXPECT_EQ(error_of(path), path + ": the ONNX graph has a cycle: \"relu_b\" -> \"add_a\" -> \"relu_b\"");
}

TEST(OnnxImport, NonSquareKernel) {
  // nonsquare_conv.onnx: a 3x5 kernel over [B, 3, 16, 16] -> [B, 4, 14, 12] (issue 15: general convolution).
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/nonsquare_conv.onnx"));
  const ir::Op& conv = g.op(g.find("conv3x5"));
  EXPECT_EQ(conv.attrs.at("kernel"), Json({3, 5}));
  EXPECT_EQ(conv.output_shape, (ir::Shape{ir::kBatch, 4, 14, 12}));
  EXPECT_EQ(g.costs(g.find("conv3x5")).params, 4 * 3 * 3 * 5);  // no bias
}

TEST(OnnxImportErrors, AutoPadAndReflectPadNameTheNode) {
  onnx::ModelProto m = load_proto(kDir + "/nonsquare_conv.onnx");
  auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
  a->set_name("auto_pad");
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s("SAME_UPPER");
  std::string path = save_temp(m, "auto_pad");
  EXPECT_THAT(error_of(path), HasSubstr("\"conv3x5\" (Conv): auto_pad SAME_UPPER is not supported"));
  // densenet121's transitions pad before AveragePool: a reflect mode there is reported.
  onnx::ModelProto d = load_proto(kDir + "/densenet121.onnx");
  int changed = 0;
  for (auto& n : *d.mutable_graph()->mutable_node())
    if (n.op_type() == "Pad" && changed++ == 0) {
      onnx::AttributeProto* mode = nullptr;
      for (auto& attr : *n.mutable_attribute())
        if (attr.name() == "mode") mode = &attr;
      if (!mode) mode = n.add_attribute();
      mode->set_name("mode");
      mode->set_type(onnx::AttributeProto::STRING);
      mode->set_s("reflect");
    }
  ASSERT_GT(changed, 0);
  EXPECT_THAT(error_of(save_temp(d, "reflect_pad")), HasSubstr("only constant padding, found mode reflect"));
}

// Every torchvision classification family (issue 15): parameters equal PyTorch's, the batch stays
// symbolic, the ops the family needs are there; the import time is printed (docs/onnx.md).
struct Family {
  const char* name;
  std::map<std::string, int> min_kinds;  // IR op kinds the family must produce, at least this many
};

TEST(OnnxImport, EveryTorchvisionFamily) {
  const Json e = expected();
  const std::vector<Family> families = {
      {"alexnet", {{"conv2d", 5}, {"linear", 3}}},
      {"vgg11", {{"conv2d", 8}, {"maxpool", 5}}},
      {"resnext50_32x4d", {{"conv2d", 53}, {"add", 16}}},
      {"wide_resnet50_2", {{"conv2d", 53}, {"add", 16}}},
      {"squeezenet1_1", {{"conv2d", 26}, {"concat", 8}}},
      {"densenet121", {{"conv2d", 120}, {"pad", 3}, {"concat", 58}}},
      {"inception_v3", {{"conv2d", 94}, {"pad", 9}, {"concat", 11}}},
      {"shufflenet_v2_x0_5", {{"conv2d", 56}, {"transpose", 16}, {"slice", 1}}},
      {"mobilenet_v2", {{"conv2d", 52}, {"clip", 35}}},
      {"mobilenet_v3_small", {{"conv2d", 52}, {"hardsigmoid", 28}, {"mul", 28}}},
      {"mnasnet0_5", {{"conv2d", 52}}},
      {"efficientnet_b0", {{"conv2d", 81}, {"mul", 65}, {"sigmoid", 65}}},
      {"regnet_y_400mf", {{"conv2d", 85}, {"mul", 16}}},
      {"convnext_tiny", {{"conv2d", 22}, {"layernorm", 23}, {"mul", 18}}},
      {"vit_b_16", {{"attention", 12}, {"concat", 1}, {"add", 1}}},
  };
  for (const Family& f : families) {
    SCOPED_TRACE(f.name);
    auto t0 = std::chrono::steady_clock::now();
    ir::Model m = import_onnx(kDir + "/" + f.name + ".onnx");
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ir::Graph g = ir::Graph::build(m);
    check_common(f.name, g, e.at(f.name));
    auto kinds = kind_counts(m);
    for (const auto& [kind, n] : f.min_kinds) EXPECT_GE(kinds[kind], n) << kind;
    std::printf("[onnx family] %s: %d ONNX nodes -> %zu IR ops, %.3g GFLOP/sample forward, import %.1f ms\n", f.name,
                e.at(f.name).at("onnx_nodes").get<int>(), m.ops.size(), g.total_fwd_flops() / 1e9, ms);
  }
}

TEST(OnnxImport, GroupedDepthwiseAndLayerScaleCosts) {
  // regnet: grouped 3x3 (group width 8); mobilenet_v3: depthwise (groups = channels); convnext: the
  // layer scale is a [C, 1, 1] parameter operand of a mul. Parameters per op from the geometry.
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/tiny_convnext.onnx"));
  int scales = 0, depthwise = 0;
  for (OpId id : g.op_ids()) {
    const ir::Op& op = g.op(id);
    if (op.kind == ir::OpKind::mul && op.attrs.contains("param")) {
      ++scales;
      EXPECT_EQ(g.costs(id).params, op.output_shape[1]) << op.name;
    }
    if (op.kind == ir::OpKind::conv2d && op.attrs.value("groups", int64_t{1}) > 1) {
      ++depthwise;
      const int64_t c = op.output_shape[1];
      EXPECT_EQ(op.attrs.at("groups").get<int64_t>(), c) << op.name;
      EXPECT_EQ(g.costs(id).params, c * 7 * 7 + c) << op.name;
      EXPECT_DOUBLE_EQ(g.costs(id).fwd_flops, 2.0 * ir::per_sample_elems(op.output_shape) * 49) << op.name;
    }
  }
  EXPECT_EQ(scales, 2);
  EXPECT_EQ(depthwise, 2);
}

TEST(OnnxImport, VitClassTokenAndPositionsAreParameterOperands) {
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/tiny_vit.onnx"));
  const Json e = expected().at("tiny_vit");
  check_common("tiny_vit", g, e);
  int tokens = 0, positions = 0;
  for (OpId id : g.op_ids()) {
    const ir::Op& op = g.op(id);
    if (op.kind == ir::OpKind::concat && op.attrs.contains("param")) {
      ++tokens;
      EXPECT_EQ(op.attrs.at("param"), Json({1, 32}));  // one [1, hidden] token before the 16 patches
      EXPECT_EQ(op.output_shape, (ir::Shape{ir::kBatch, 17, 32}));
    }
    if (op.kind == ir::OpKind::add && op.attrs.contains("param")) {
      ++positions;
      EXPECT_EQ(op.attrs.at("param"), Json({17, 32}));
    }
  }
  EXPECT_EQ(tokens, 1);
  EXPECT_EQ(positions, 1);
}

TEST(OnnxImport, MultiModalBranchesImport) {
  // An image CNN, token ids through an embedding and an encoder layer, tabular features through an
  // MLP, concatenated: three data inputs, parameters equal PyTorch's.
  ir::Graph g = ir::Graph::build(import_onnx(kDir + "/multimodal.onnx"));
  EXPECT_EQ(g.total_params(), expected().at("multimodal").at("params").get<int64_t>());
  std::vector<std::string> names;
  for (const auto& in : g.model().inputs) names.push_back(in.name);
  EXPECT_EQ(names, (std::vector<std::string>{"input0", "input1", "input2", "label"}));
  auto kinds = kind_counts(g.model());
  EXPECT_EQ(kinds["attention"], 1);
  EXPECT_EQ(kinds["embedding"], 1);
  EXPECT_EQ(kinds["conv2d"], 2);
}
}  // namespace
}  // namespace gp::importers

// Regression (fuzz/fuzz_onnx, hardening): a node with no outputs was indexed at output(0), UB in
// protobuf's RepeatedPtrField. It must be a UserError naming the file.
TEST(OnnxImportFuzzRegression, NodeWithoutOutputsIsAUserError) {
  static const unsigned char kBytes[] = {
      0x08, 0x08, 0x3a, 0xb1, 0x01, 0x0a, 0x1b, 0x0a, 0x05, 0x69, 0x6e, 0x70, 0x75, 0x74, 0x12, 0x01, 0x61, 0x1a, 0x06,
      0x66, 0x61, 0x6e, 0x63, 0x79, 0x31, 0x22, 0x07, 0x46, 0x61, 0x6e, 0x63, 0x79, 0x4f, 0x70, 0x0a, 0x12, 0x0a, 0x01,
      0x61, 0x12, 0x01, 0x62, 0x1a, 0x04, 0x72, 0x65, 0x6c, 0x75, 0x22, 0x04, 0x52, 0x65, 0x6c, 0x75, 0x0a, 0x17, 0x0a,
      0x01, 0x62, 0x12, 0x01, 0x63, 0x1a, 0x06, 0x66, 0x61, 0x6e, 0x63, 0x79, 0x31, 0x22, 0x07, 0x46, 0x6a, 0x66, 0x63,
      0x79, 0x4f, 0x70, 0x0a, 0x1c, 0x0a, 0x01, 0x63, 0x1a, 0x06, 0x6f, 0x75, 0x74, 0x70, 0x75, 0x74, 0x1a, 0x04, 0x77,
      0x61, 0x72, 0x70, 0x22, 0x09, 0x4f, 0x61, 0x72, 0x70, 0x44, 0x72, 0x69, 0x76, 0x65, 0x12, 0x0a, 0x75, 0x6e, 0x6b,
      0x6e, 0x6f, 0x77, 0x6e, 0x5f, 0x6f, 0x70, 0x5a, 0x1c, 0x0a, 0x05, 0x69, 0x6e, 0x70, 0x75, 0x74, 0x12, 0x13, 0x0a,
      0x11, 0x08, 0x01, 0x12, 0x0d, 0x0a, 0x07, 0x12, 0x05, 0x66, 0x61, 0x74, 0x63, 0x68, 0x0a, 0x02, 0x08, 0x08, 0x6a,
      0x1d, 0x0a, 0x06, 0x6f, 0x75, 0x8a, 0x8f, 0x26, 0x74, 0x12, 0x13, 0x0a, 0x11, 0x08, 0x01, 0x18, 0x0d, 0x0a, 0x07,
      0x12, 0x05, 0x62, 0x61, 0x74, 0x63, 0x68, 0x0a, 0x02, 0x08, 0x08, 0x42, 0x04, 0x0a, 0x00, 0x10, 0x0d,
  };
  std::string path = ::testing::TempDir() + "/gp_node_without_outputs.onnx";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(kBytes), sizeof kBytes);
  }
  try {
    gp::importers::import_onnx(path);
    FAIL() << "expected a UserError";
  } catch (const gp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has no outputs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

namespace fx = gp::importers::testing;

// fuzz_onnx (with the weight decoding added) found a SIGFPE inside libonnx's own shape inference:
// a Conv stride of 0 (resnet18 with one bit flipped). Zero strides, dilations, kernel sizes and
// groups, and negative pads, of windowed ops are now rejected before ONNX shape inference runs.
TEST(OnnxImportFuzzRegression, ZeroStrideOrGroupIsAUserErrorNotACrash) {
  struct Case {
    const char* op;
    const char* attr;
    std::vector<int64_t> ints;  // empty: an INT attribute set to 0
  };
  for (const Case& c : {Case{"Conv", "strides", {1, 0}}, Case{"Conv", "dilations", {0, 1}}, Case{"Conv", "group", {}},
                        Case{"MaxPool", "kernel_shape", {0, 0}}, Case{"Conv", "pads", {1, 1, -1, 1}}}) {
    onnx::ModelProto m = fx::load_proto(fx::kDir + "/resnet18.onnx");
    onnx::NodeProto* node = nullptr;
    for (auto& n : *m.mutable_graph()->mutable_node())
      if (n.op_type() == c.op) {
        node = &n;
        break;
      }
    ASSERT_NE(node, nullptr) << c.op;
    onnx::AttributeProto* a = nullptr;
    for (auto& x : *node->mutable_attribute())
      if (x.name() == c.attr) a = &x;
    if (!a) {
      a = node->add_attribute();
      a->set_name(c.attr);
      a->set_type(c.ints.empty() ? onnx::AttributeProto::INT : onnx::AttributeProto::INTS);
    }
    a->clear_ints();
    if (c.ints.empty()) a->set_i(0);
    for (int64_t v : c.ints) a->add_ints(v);
    std::string path = fx::save_temp(m, std::string("bad_") + c.attr);
    try {
      gp::importers::import_onnx(path);
      ADD_FAILURE() << c.attr << ": expected a UserError";
    } catch (const gp::UserError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find(std::string("attribute ") + c.attr + " must be"), std::string::npos) << what;
      EXPECT_NE(what.find(path), std::string::npos) << what;
    }
  }
}

// The third fuzz_onnx finding (session 3, on token_posemb.onnx): an operator ONNX does not define
// ("Tranzpose", one letter changed) whose output feeds Shape made libonnx 1.12's data propagation
// dereference a null type (SEGV). Data propagation now runs only when every operator is known, and
// the import names the unknown operator.
TEST(OnnxImportFuzzRegression, UnknownOperatorFeedingShapeIsListedNotACrash) {
  onnx::ModelProto m = fx::load_proto(fx::kDir + "/token_posemb.onnx");
  onnx::NodeProto* node = nullptr;
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.name() == "/encoder/layers.0/self_attn/Transpose") node = &n;
  ASSERT_NE(node, nullptr);
  node->set_op_type("Tranzpose");
  std::string path = fx::save_temp(m, "tranzpose");
  try {
    gp::importers::import_onnx(path);
    FAIL() << "expected a UserError";
  } catch (const gp::UserError& e) {
    EXPECT_EQ(std::string(e.what()), path +
                                         ": cannot import the ONNX model (nothing was imported): unsupported "
                                         "operators: Tranzpose x1");
  }
}

// The fourth (session 3): an initializer whose dims multiply past int64 (signed overflow, UBSan).
TEST(OnnxImportFuzzRegression, InitializerDimsOverflowingIsACorruptFile) {
  for (std::vector<int64_t> dims : {std::vector<int64_t>{1 << 20, 1 << 20, 1 << 20, 1 << 20}, {4, -1}}) {
    onnx::ModelProto m = fx::load_proto(fx::kDir + "/two_branch.onnx");
    auto* init = m.mutable_graph()->mutable_initializer(0);
    init->clear_dims();
    for (int64_t d : dims) init->add_dims(d);
    std::string path = fx::save_temp(m, "huge_dims");
    try {
      gp::importers::import_onnx(path);
      ADD_FAILURE() << "expected a UserError";
    } catch (const gp::UserError& e) {
      EXPECT_EQ(std::string(e.what()), fmt::format("{}: corrupt ONNX file (tensor \"{}\" has dims [{}])", path,
                                                   init->name(), fmt::join(dims, ", ")));
    }
  }
}

// The second fuzz_onnx finding: a Conv without kernel_shape whose input rank (2) differs from its
// weight's (4) made libonnx's shape inference read past its arrays (SEGV). The importer now gives
// such a Conv kernel_shape from the weight, so ONNX's own rank check fails cleanly.
TEST(OnnxImportFuzzRegression, ConvInputRankUnlikeItsWeightIsAUserErrorNotACrash) {
  onnx::ModelProto m = fx::load_proto(fx::kDir + "/nonsquare_conv.onnx");
  auto* conv = m.mutable_graph()->mutable_node(0);
  ASSERT_EQ(conv->op_type(), "Conv");
  conv->clear_attribute();  // no kernel_shape: ONNX takes it from the weight
  auto* shape = m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  while (shape->dim_size() > 2) shape->mutable_dim()->RemoveLast();  // input [batch, 3], weight [4, 3, 3, 5]
  std::string path = fx::save_temp(m, "conv_rank");
  try {
    gp::importers::import_onnx(path);
    FAIL() << "expected a UserError";
  } catch (const gp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  // The untouched fixture (kernel_shape present) and one without kernel_shape still import.
  onnx::ModelProto ok = fx::load_proto(fx::kDir + "/nonsquare_conv.onnx");
  ok.mutable_graph()->mutable_node(0)->clear_attribute();
  std::string ok_path = fx::save_temp(ok, "conv_no_kernel_shape");
  try {
    gp::importers::import_onnx(ok_path);
  } catch (const gp::UserError& e) {
    // nonsquare kernels are unsupported by the mapper; what matters is that it is not a shape-inference failure
    EXPECT_EQ(std::string(e.what()).find("shape inference failed"), std::string::npos) << e.what();
  }
}

namespace gp::importers {
namespace {
// Issue 15: every parameter of the small per-family models (conv weights [co, ci/groups, kh, kw],
// layer scales, class token, position table) is read from the file, and together they are exactly
// PyTorch's parameters.
TEST(OnnxWeights, TorchvisionFamiliesEveryParameterFromTheFile) {
  const Json e = testing::expected();
  for (const char* name :
       {"tiny_mobilenet_v3", "tiny_mobilenet_v2", "tiny_efficientnet", "tiny_regnet", "tiny_shufflenet",
        "tiny_convnext", "tiny_vit", "tiny_inception", "tiny_densenet", "multimodal"}) {
    SCOPED_TRACE(name);
    ir::Model m;
    ParamValues w = import_onnx_weights(testing::kDir + "/" + name + ".onnx", &m);
    ir::Graph g = ir::Graph::build(m);
    int64_t numel = 0;
    for (const auto& [key, v] : w) {
      int64_t n = 1;
      for (int64_t d : v.shape) n *= d;
      EXPECT_EQ(static_cast<int64_t>(v.data.size()), n) << key;
      numel += n;
    }
    EXPECT_EQ(numel, g.total_params());
    EXPECT_EQ(numel, e.at(name).at("params").get<int64_t>());
  }
}
}  // namespace
}  // namespace gp::importers
