// Zoo: closed-form parameter counts, op counts, every builtin builds and validates, spec errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "models/tests/presets.h"
#include "models/zoo.h"
#include "support/error.h"

namespace gp::models {
namespace {

using ::testing::HasSubstr;

ir::Graph build(const std::string& spec) { return ir::Graph::build(build_builtin(spec), spec); }

// One post-LN transformer layer: attention 4h^2+4h, two layernorms 2h each, FFN 2hf + f + h.
int64_t transformer_layer_params(int64_t h, int64_t f) { return 4 * h * h + 4 * h + 2 * 2 * h + 2 * h * f + f + h; }

int64_t linear_params(int64_t in, int64_t out) { return in * out + out; }

TEST(Zoo, ListsTheContractModelsAndParameters) {
  std::vector<std::string> names;
  for (const auto& m : builtin_models()) names.push_back(m.name);
  EXPECT_EQ(names, (std::vector<std::string>{"mmt", "dlrm", "candle-uno", "gpt", "inception"}));
  auto params_of = [](const std::string& model) {
    std::vector<std::string> v;
    for (const auto& m : builtin_models())
      if (m.name == model)
        for (const auto& p : m.params) v.push_back(p.name + "=" + std::to_string(p.default_value));
    return v;
  };
  EXPECT_EQ(params_of("mmt"), (std::vector<std::string>{"branches=4", "layers=8", "seq=256", "hidden=1024", "heads=16",
                                                        "ffn=4096", "classes=1000"}));
  EXPECT_EQ(params_of("dlrm"), (std::vector<std::string>{"dense_branches=7", "embedding_branches=7", "layers=4",
                                                         "hidden=4096", "rows=1000000", "dim=64", "bag=100"}));
  EXPECT_EQ(params_of("candle-uno"), (std::vector<std::string>{"branches=7", "layers=4", "hidden=4096"}));
  EXPECT_EQ(params_of("gpt"), (std::vector<std::string>{"layers=12", "seq=1024", "hidden=768", "heads=12", "ffn=3072",
                                                        "vocab=50257", "tie_embeddings=0"}));
  EXPECT_EQ(params_of("inception"), (std::vector<std::string>{"blocks=9", "channels=64", "image=224", "classes=1000"}));
}

TEST(Zoo, MmtParamsAndOpsMatchClosedForm) {
  for (auto [br, l, h, f, c] :
       {std::tuple{2, 2, 64, 128, 10}, std::tuple{4, 8, 1024, 4096, 1000}, std::tuple{1, 1, 32, 64, 5}}) {
    std::string spec = fmt::format("mmt:branches={},layers={},hidden={},heads=4,ffn={},classes={},seq=8", br, l, h, f,
                                   c);
    ir::Graph g = build(spec);
    EXPECT_EQ(g.total_params(), int64_t{br} * l * transformer_layer_params(h, f) + linear_params(int64_t{br} * h, c))
        << spec;
    // 8 ops per layer + a pool per branch; concat (when > 1 branch), head, loss.
    EXPECT_EQ(g.num_ops(), size_t(br * (8 * l + 1) + (br > 1) + 2)) << spec;
  }
}

TEST(Zoo, MmtDefaultsAreThePaperConfiguration) {
  ir::Graph g = build("mmt");
  EXPECT_EQ(g.name(), "mmt");
  EXPECT_EQ(g.num_ops(), 4u * 65 + 3);
  EXPECT_EQ(g.total_params(), 4 * 8 * transformer_layer_params(1024, 4096) + linear_params(4 * 1024, 1000));
  ASSERT_NE(g.find_input("m3.input"), nullptr);
  EXPECT_EQ(g.find_input("m3.input")->shape, (ir::Shape{ir::kBatch, 256, 1024}));
  EXPECT_TRUE(g.find("m1.l3.attn").valid());
  EXPECT_TRUE(g.find("m1.l3.ffn1").valid());
  EXPECT_EQ(g.op(g.find("m1.l3.attn")).attrs.at("heads"), 16);
}

TEST(Zoo, GptParamsMatchClosedForm) {
  ir::Graph g = build("gpt:layers=2,seq=16,hidden=64,heads=4,ffn=128,vocab=100");
  EXPECT_EQ(g.total_params(), 2 * transformer_layer_params(64, 128) + 2 * 64 + linear_params(64, 100));
  EXPECT_EQ(g.num_ops(), 2u * 8 + 4);
  ir::Graph d = build("gpt");
  EXPECT_EQ(d.total_params(), 12 * transformer_layer_params(768, 3072) + 2 * 768 + linear_params(768, 50257));
}

// tie_embeddings=1: token ids -> wte (vocab x hidden table + seq x hidden positions); the LM head
// has no bias and shares wte's table, counted once (GPT-2's parameter count).
TEST(Zoo, GptTiedEmbeddingsCountTheTableOnce) {
  ir::Graph g = build("gpt:layers=2,seq=16,hidden=64,heads=4,ffn=128,vocab=100,tie_embeddings=1");
  EXPECT_EQ(g.total_params(), 100 * 64 + 16 * 64 + 2 * transformer_layer_params(64, 128) + 2 * 64);
  EXPECT_EQ(g.num_ops(), 2u * 8 + 5);
  ASSERT_EQ(g.model().shared_params.size(), 1u);
  EXPECT_EQ(g.model().shared_params[0].uses, (std::vector<std::string>{"wte/weight", "final.lm_head/weight"}));
  EXPECT_EQ(g.model().inputs[0].dtype, ir::DType::i64);
  EXPECT_EQ(g.name(), "gpt:layers=2,seq=16,hidden=64,heads=4,ffn=128,vocab=100,tie_embeddings=1");
  try {
    build("gpt:tie_embeddings=2");
    FAIL() << "accepted";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tie_embeddings = 2 must be 1 (tied) or left out (untied)"));
  }
}

TEST(Zoo, DlrmParamsMatchClosedForm) {
  const int64_t D = 2, E = 3, L = 2, h = 32, rows = 100, dim = 8;
  ir::Graph g = build("dlrm:dense_branches=2,embedding_branches=3,layers=2,hidden=32,rows=100,dim=8,bag=4");
  int64_t embeddings = E * rows * dim;
  int64_t dense = D * L * linear_params(h, h);
  int64_t top = linear_params(D * h + E * dim, h) + linear_params(h, h) + linear_params(h, 2);
  EXPECT_EQ(g.total_params(), embeddings + dense + top);
  EXPECT_EQ(g.num_ops(), size_t(D * 2 * L + E + 1 + 4 + 1 + 1));
  EXPECT_EQ(g.find_input("emb2.input")->dtype, ir::DType::i64);
  EXPECT_EQ(g.find_input("emb2.input")->shape, (ir::Shape{ir::kBatch, 4}));

  ir::Graph d = build("dlrm");
  EXPECT_EQ(d.total_params(), 7 * int64_t{1000000} * 64 + 7 * 4 * linear_params(4096, 4096) +
                                  linear_params(7 * 4096 + 7 * 64, 4096) + linear_params(4096, 4096) +
                                  linear_params(4096, 2));
}

TEST(Zoo, CandleUnoParamsMatchClosedForm) {
  ir::Graph g = build("candle-uno:branches=3,layers=2,hidden=32");
  EXPECT_EQ(g.total_params(),
            3 * 2 * linear_params(32, 32) + linear_params(3 * 32, 32) + linear_params(32, 32) + linear_params(32, 1));
  ir::Graph d = build("candle-uno");
  EXPECT_EQ(d.total_params(), 7 * 4 * linear_params(4096, 4096) + linear_params(7 * 4096, 4096) +
                                  linear_params(4096, 4096) + linear_params(4096, 1));
  EXPECT_EQ(d.op(d.find("loss")).kind, ir::OpKind::mse_loss);
}

TEST(Zoo, InceptionParamsMatchClosedForm) {
  const int64_t c = 8, classes = 10;
  auto conv = [](int64_t in, int64_t out, int64_t k) { return out * in * k * k + out; };
  auto block = [&](int64_t in) {
    return conv(in, c, 1) + conv(in, c, 1) + conv(c, c, 3) + conv(in, c, 1) + conv(c, c, 5) + conv(in, c, 1);
  };
  ir::Graph g = build("inception:blocks=3,channels=8,image=32,classes=10");
  int64_t stem = conv(3, c, 7) + 2 * c;
  EXPECT_EQ(g.total_params(), stem + block(c) + 2 * block(4 * c) + linear_params(4 * c, classes));
  // 32 -> stem conv 16 -> pool 8 -> after block 0: 4 -> after block 1: 2.
  EXPECT_EQ(g.op(g.find("b2.concat")).output_shape, (ir::Shape{ir::kBatch, 32, 2, 2}));
  EXPECT_FALSE(g.find("b2.down").valid());
}

TEST(Zoo, EveryBuiltinBuildsAtDefaultsAndSmallPresets) {
  std::vector<std::string> specs = testing::small_presets();
  for (const auto& m : builtin_models()) specs.push_back(m.name);
  for (const auto& spec : specs) {
    ir::Model m = build_builtin(spec);
    ir::Graph g = ir::Graph::build(m, spec);
    ASSERT_EQ(m.outputs, std::vector<std::string>{"loss"}) << spec;
    const ir::Op& loss = g.op(g.find("loss"));
    EXPECT_TRUE(ir::is_loss(loss.kind)) << spec;
    EXPECT_EQ(loss.output_shape, ir::Shape{}) << spec;
    // The loss target is a graph input, and exactly one op is a loss.
    EXPECT_NE(g.find_input(loss.inputs[1]), nullptr) << spec;
    int losses = 0;
    for (const auto& op : m.ops) losses += ir::is_loss(op.kind);
    EXPECT_EQ(losses, 1) << spec;
    EXPECT_GT(g.total_fwd_flops(), 0) << spec;
  }
}

TEST(Zoo, CanonicalNamesListNonDefaultParameters) {
  EXPECT_EQ(build_builtin("mmt").name, "mmt");
  EXPECT_EQ(build_builtin("mmt:layers=8,branches=2").name, "mmt:branches=2");
  EXPECT_EQ(parse_builtin_spec("gpt:vocab=10,layers=3").canonical(), "gpt:layers=3,vocab=10");
}

std::string error_of(const std::string& spec) {
  try {
    build_builtin(spec);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Zoo, BadSpecsNameTheProblemAndTheValidNames) {
  EXPECT_EQ(error_of("resnet"),
            "unknown model \"resnet\" (builtin models: mmt, dlrm, candle-uno, gpt, inception; or a model file "
            "ending in .json or .onnx)");
  EXPECT_EQ(error_of("mmt:depth=3"),
            "model spec \"mmt:depth=3\": unknown parameter \"depth\" (parameters of mmt: branches, layers, seq, "
            "hidden, heads, ffn, classes)");
  EXPECT_EQ(error_of("mmt:layers=x"),
            "model spec \"mmt:layers=x\": layers = \"x\" is not a positive integer (1 to 2147483647)");
  for (const char* bad :
       {"mmt:layers=0", "mmt:layers=-2", "mmt:layers=2.5", "mmt:layers=", "mmt:layers=1e3", "mmt:layers=99999999999"})
    EXPECT_THAT(error_of(bad), HasSubstr("is not a positive integer")) << bad;
  EXPECT_THAT(error_of("mmt:layers"), HasSubstr("expected key=value, found \"layers\""));
  EXPECT_THAT(error_of("mmt:"), HasSubstr("expected key=value, found \"\""));
  EXPECT_THAT(error_of("mmt:layers=2,"), HasSubstr("expected key=value"));
  EXPECT_EQ(error_of("mmt:layers=2,layers=3"),
            "model spec \"mmt:layers=2,layers=3\": parameter \"layers\" given twice");
  EXPECT_EQ(error_of("mmt:heads=5"),
            "mmt: heads = 5 must divide hidden = 1024 (each head gets hidden / heads features)");
  EXPECT_THAT(error_of("gpt:heads=7"), HasSubstr("heads = 7 must divide hidden = 768"));
  EXPECT_THAT(error_of("inception:image=8"), HasSubstr("image = 8 is too small"));
  EXPECT_THAT(error_of(""), HasSubstr("empty model spec"));
  EXPECT_THAT(error_of("candle-uno:heads=2"), HasSubstr("(parameters of candle-uno: branches, layers, hidden)"));
}

}  // namespace
}  // namespace gp::models
