// Masked attention in training (issue 34, item 2): torch 2.x's export of a GPT-2-style decoder
// (causal attention, learned positions, LM head tied to the token embedding) and of a BERT-style
// encoder with an attention-mask input train on a 2-stage pipeline exactly like --single (losses and
// every final weight within 1e-5). The GPT's stages hold one user of the tied table each; both of
// the BERT's stages read the mask input (each stage feeds its own external inputs), whose synthetic
// values are padding masks (a kept prefix of random length, never all keys masked).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "runtime/data/data_feed.h"
#include "runtime/tests/dist_plans.h"
#include "runtime/base/train.h"
#include "runtime/launch/launcher.h"
#include "support/json.h"

namespace gp::runtime {
namespace {

const std::string kOnnx = std::string(GP_SOURCE_DIR) + "/tests/fixtures/onnx/";

/// testing::expect_equivalent (losses and final weights within 1e-5 of --single's), then prints the
/// largest relative loss difference and weight difference measured.
void expect_like_single(const plan::Plan& p, const std::string& what) {
  const int steps = 4;
  const double lr = 0.05;
  testing::expect_equivalent(p, steps, "sgd", lr);
  auto results = testing::run_threads(prepare_run(p, "1f1b"), testing::options(steps, "sgd", lr));
  auto ref = testing::single_reference(p.model_spec, p.mini_batch_size, steps, "sgd", lr);
  double loss_diff = 0, weight_diff = 0;
  for (const auto& r : results) {
    for (int s = 0; s < steps; ++s)
      loss_diff = std::max(loss_diff,
                           std::abs(r.step_losses[static_cast<size_t>(s)] - ref.losses[static_cast<size_t>(s)]) /
                               std::abs(ref.losses[static_cast<size_t>(s)]));
    for (const auto& [n, t] : r.final_params)
      for (const auto& [rn, rt] : ref.params)
        if (rn == n) weight_diff = std::max(weight_diff, (t - rt).abs().max().item<double>());
  }
  std::printf(
      "[masked attention] %s: %d SGD steps on %zu stages, losses %.4f -> %.4f, largest relative loss "
      "difference to --single %.2e, largest weight difference %.2e\n",
      what.c_str(), steps, p.stages.size(), ref.losses.front(), ref.losses.back(), loss_diff, weight_diff);
}

TEST(MaskedAttention, Gpt2CausalTiedTrainsOnTwoStagesLikeSingle) {
  const std::string spec = kOnnx + "gpt2_torch2.onnx";
  plan::Plan p = testing::make_plan(spec, 8, {{{"/tok/", "/blocks.0/"}, {0}, 4}, {{}, {1}, 4}});
  ir::Graph g = importers::load_graph(spec);
  ASSERT_EQ(g.model().shared_params.size(), 1u);
  // The embedding and the tied LM head are on different stages: both hold the table.
  EXPECT_NE(std::find(p.stages[0].ops.begin(), p.stages[0].ops.end(), "/tok/Gather"), p.stages[0].ops.end());
  EXPECT_NE(std::find(p.stages[1].ops.begin(), p.stages[1].ops.end(), "/lm_head/MatMul"), p.stages[1].ops.end());
  EXPECT_EQ(g.op(g.find("/blocks.1/attn/attention")).attrs.at("causal"), true);
  expect_like_single(p, "gpt2_torch2");
}

TEST(MaskedAttention, BertWithAttentionMaskTrainsOnTwoStagesLikeSingle) {
  const std::string spec = kOnnx + "bert_mask_torch2.onnx";
  plan::Plan p = testing::make_plan(spec, 8, {{{"/tok/", "/ln/", "/layers.0/"}, {0}, 4}, {{}, {1}, 4}});
  ir::Graph g = importers::load_graph(spec);
  for (const auto& st : p.stages) {  // each stage has an attention op reading the mask
    StageModule m(
        g,
        [&] {
          std::vector<OpId> ids;
          for (const auto& n : st.ops) ids.push_back(g.find(n));
          return ids;
        }(),
        1);
    const auto& ext = m.external_inputs();
    EXPECT_TRUE(std::binary_search(ext.begin(), ext.end(), "input1")) << "stage " << st.id;
  }
  // The synthetic masks keep a prefix of 1..seq keys: some padding, never a row with none kept.
  const int mask = static_cast<int>(std::find_if(g.model().inputs.begin(), g.model().inputs.end(),
                                                 [](const ir::Input& in) { return in.name == "input1"; }) -
                                    g.model().inputs.begin());
  torch::Tensor m = synthetic_input(g, mask, 0, 64, 1, 0);
  EXPECT_EQ(m.scalar_type(), torch::kLong);
  EXPECT_TRUE(m.select(1, 0).eq(1).all().item<bool>());
  EXPECT_GT(m.eq(0).sum().item<int64_t>(), 0);
  EXPECT_TRUE((m.slice(1, 1) <= m.slice(1, 0, -1)).all().item<bool>());  // a prefix
  expect_like_single(p, "bert_mask_torch2");
}

// torchvision's Swin (tiny, torch 2.x export): the stem and the first (shifted) stage on one stage,
// the patch merging and second stage on the other; 2 stages train like --single.
TEST(MaskedAttention, TinySwinTrainsOnTwoStagesLikeSingle) {
  const std::string spec = kOnnx + "tiny_swin_torch2.onnx";
  plan::Plan p = testing::make_plan(spec, 8,
                                    {{{"/features/features.0/", "/features/features.1/"}, {0}, 4}, {{}, {1}, 4}});
  ir::Graph g = importers::load_graph(spec);
  EXPECT_EQ(g.op(g.find("/features/features.1/features.1.1/attn/window_attention")).attrs.at("shift"), Json({2, 2}));
  expect_like_single(p, "tiny_swin_torch2");
}

// PyTorch's own training (tests/fixtures/torch2_lm/make_reference.py, re-run by fixtures_reproduce):
// the GPT-2-style decoder (MSE on its [B, S, vocab] logits, the importer's appended loss) and the
// BERT-style encoder with an attention-mask input (cross-entropy) train --single like PyTorch's SGD
// with momentum and Adam (losses within 1e-4), and on 2 stages like --single (within 1e-5).
const std::filesystem::path kLm = std::filesystem::path(GP_SOURCE_DIR) / "tests/fixtures/torch2_lm";

void trains_like_pytorch(const std::string& which, const plan::Plan& p, const std::string& model = "") {
  std::ifstream f(kLm / "reference.json");
  const Json all = Json::parse(f), ref = all.at(which);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("gp_torch2_lm_" + which);
  std::filesystem::create_directories(dir);
  for (const std::string optimizer : {"sgd", "adam"}) {
    auto options = [&] {
      TrainOptions o = testing::options(all.at("steps").get<int>(), optimizer,
                                        ref.at(optimizer).at("lr").get<double>());
      if (optimizer == "sgd") o.momentum = ref.at(optimizer).at("momentum").get<double>();
      o.model_spec = (kLm / (model.empty() ? ref.at("model").get<std::string>() : model)).string();
      o.data_dir = (kLm / ref.at("train").get<std::string>()).string();
      return o;
    };
    TrainOptions s = options();
    s.single = true;
    s.batch = all.at("batch").get<int>();
    s.log_path = (dir / (optimizer + ".jsonl")).string();
    ASSERT_EQ(run_single(s), 0);
    std::vector<double> single;
    std::ifstream log(s.log_path);
    for (std::string line; std::getline(log, line);) single.push_back(Json::parse(line).at("loss").get<double>());
    const std::vector<double> torch_losses = ref.at(optimizer).at("losses").get<std::vector<double>>();
    ASSERT_EQ(single.size(), torch_losses.size());
    double worst = 0, worst_pipe = 0;
    for (size_t k = 0; k < single.size(); ++k) {
      EXPECT_LE(std::abs(single[k] - torch_losses[k]), 1e-4 * std::abs(torch_losses[k]))
          << which << " " << optimizer << " step " << k;
      worst = std::max(worst, std::abs(single[k] - torch_losses[k]) / std::abs(torch_losses[k]));
    }
    TrainOptions o = options();
    PreparedRun run = prepare_run(p, "1f1b");
    RunData data = open_run_data(o, run.graph, true);
    run.data = data.train;
    for (const auto& r : testing::run_threads(run, o)) {
      ASSERT_EQ(r.step_losses.size(), single.size());
      for (size_t k = 0; k < single.size(); ++k) {
        EXPECT_LE(std::abs(r.step_losses[k] - single[k]), 1e-5 * std::abs(single[k]))
            << which << " 2 stages step " << k;
        worst_pipe = std::max(worst_pipe, std::abs(r.step_losses[k] - single[k]) / std::abs(single[k]));
      }
    }
    std::printf(
        "[torch2 lm] %s %s: %zu steps, --single vs PyTorch largest relative difference %.2e, 2 stages vs "
        "--single %.2e\n",
        which.c_str(), optimizer.c_str(), single.size(), worst, worst_pipe);
  }
  std::filesystem::remove_all(dir);
}

// The same modules exported with torch 2.x's default exporter (dynamo=True; make_reference.py): the
// optimizer's merged LayerNorms, folded weight transposes and the LM head's folded copy of the tied
// embedding are read back from the nodes' metadata: PyTorch's parameter counts, and the same training.
TEST(MaskedAttention, DynamoExportsHavePyTorchsParametersAndTrainLikePyTorch) {
  std::ifstream f(kLm / "reference.json");
  const Json ref = Json::parse(f);
  const std::string gpt2 = (kLm / "gpt2_dynamo.onnx").string(), bert = (kLm / "bert_dynamo.onnx").string();
  ir::Graph g = importers::load_graph(gpt2);
  EXPECT_EQ(g.total_params(), ref.at("gpt2").at("params").get<int64_t>());  // 7,520: the head tied to tok
  EXPECT_EQ(g.model().shared_params.size(), 1u);
  EXPECT_EQ(importers::load_graph(bert).total_params(), ref.at("bert").at("params").get<int64_t>());  // 5,731
  trains_like_pytorch("gpt2", testing::make_plan(gpt2, 8, {{{"/tok/", "/blocks.0/"}, {0}, 4}, {{}, {1}, 4}}),
                      "gpt2_dynamo.onnx");
  trains_like_pytorch("bert", testing::make_plan(bert, 8, {{{"/tok/", "/ln/", "/layers.0/"}, {0}, 4}, {{}, {1}, 4}}),
                      "bert_dynamo.onnx");
}

TEST(MaskedAttention, Gpt2TrainsLikePyTorchSingleAndOnTwoStages) {
  trains_like_pytorch(
      "gpt2", testing::make_plan(kOnnx + "gpt2_torch2.onnx", 8, {{{"/tok/", "/blocks.0/"}, {0}, 4}, {{}, {1}, 4}}));
}

TEST(MaskedAttention, BertWithAttentionMaskTrainsLikePyTorchSingleAndOnTwoStages) {
  trains_like_pytorch("bert", testing::make_plan(kOnnx + "bert_mask_torch2.onnx", 8,
                                                 {{{"/tok/", "/ln/", "/layers.0/"}, {0}, 4}, {{}, {1}, 4}}));
}

}  // namespace
}  // namespace gp::runtime
