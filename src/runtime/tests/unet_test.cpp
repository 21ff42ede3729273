// Decoder and dense-prediction ops end to end (issue 34, item 1). conv_transpose2d against its
// definition (every input pixel scatters a weighted kernel window), resize against
// torch.nn.functional.interpolate, per-position cross-entropy against log-softmax by hand, forward
// and backward; then the PyTorch exports of tests/fixtures/unet (make_reference.py): decoder_ops'
// output equals PyTorch's, and the U-Net (MaxPool down, ConvTranspose2d up, concat skips, per-pixel
// MSE) and its segmentation variant (per-pixel cross-entropy) train like PyTorch's own SGD, in one
// process and on a GraphPipe plan of 4 devices whose stage DAG has the skip connections as branches.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cost/cost_model.h"
#include "planner/planner.h"
#include "runtime/data/data_feed.h"
#include "runtime/tests/dist_plans.h"
#include "runtime/tests/scratch_dir.h"
#include "runtime/base/train.h"
#include "runtime/launch/launcher.h"
#include "support/json.h"

namespace gp::runtime {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = fs::path(GP_SOURCE_DIR) / "tests/fixtures/unet";

Json reference() {
  std::ifstream f(kDir / "reference.json");
  return Json::parse(f);
}

/// A graph of one op over x [B, shape...] (and its mse loss), the module holding the op, and its output.
struct OneOp {
  ir::Graph g;
  std::unique_ptr<StageModule> m;
};

OneOp one_op(ir::OpKind kind, Json attrs, ir::Shape x) {
  ir::ModelBuilder b("one");
  std::string in = b.input("x", x);
  std::string y = b.op("op", kind, {in}, std::move(attrs));
  ir::Shape t(b.shape_of(y).begin() + 1, b.shape_of(y).end());
  b.output(b.op("loss", ir::OpKind::mse_loss, {y, b.input("t", t)}));
  OneOp o{ir::Graph::build(b.build()), nullptr};
  o.m = std::make_unique<StageModule>(o.g, std::vector<OpId>{o.g.find("op")}, 3);
  return o;
}

torch::Tensor run(const OneOp& o, const torch::Tensor& x) {
  MicroBatchInfo info{0, x.size(0), x.size(0), 0};
  return o.m->forward({{"x", x}}, info).at("op");
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_LT((got - want).abs().max().item<double>(), tol) << what;
}

/// ConvTranspose2d by its definition: output (i*s - top + a*d, j*s - left + b*d) += x(i, j) w(a, b),
/// per group, built from strided slices (autograd flows through it), then the bias.
torch::Tensor conv_transpose_by_definition(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                           std::array<int64_t, 2> s, std::array<int64_t, 4> pad,
                                           std::array<int64_t, 2> d, std::array<int64_t, 2> out_pad, int64_t groups) {
  const int64_t n = x.size(0), h = x.size(2), wd = x.size(3), kh = w.size(2), kw = w.size(3);
  const int64_t cig = x.size(1) / groups, cog = w.size(1);
  const int64_t fh = (h - 1) * s[0] + d[0] * (kh - 1) + 1 + out_pad[0],
                fw = (wd - 1) * s[1] + d[1] * (kw - 1) + 1 + out_pad[1];
  std::vector<torch::Tensor> per_group;
  for (int64_t grp = 0; grp < groups; ++grp) {
    torch::Tensor xg = x.narrow(1, grp * cig, cig), wg = w.narrow(0, grp * cig, cig);
    torch::Tensor full = torch::zeros({n, cog, fh, fw});
    for (int64_t a = 0; a < kh; ++a)
      for (int64_t b = 0; b < kw; ++b) {
        torch::Tensor contrib = torch::einsum("nchw,co->nohw", {xg, wg.select(2, a).select(2, b)});
        using torch::indexing::Slice;
        full.index({Slice(), Slice(), Slice(a * d[0], a * d[0] + (h - 1) * s[0] + 1, s[0]),
                    Slice(b * d[1], b * d[1] + (wd - 1) * s[1] + 1, s[1])})
            .add_(contrib);
      }
    per_group.push_back(full);
  }
  torch::Tensor full = torch::cat(per_group, 1);
  const int64_t oh = fh - out_pad[0] - pad[0] - pad[2] + out_pad[0],
                ow = fw - out_pad[1] - pad[1] - pad[3] + out_pad[1];
  torch::Tensor y = full.narrow(2, pad[0], oh).narrow(3, pad[1], ow);
  return bias.defined() ? y + bias.view({1, -1, 1, 1}) : y;
}

struct TransposeCase {
  Json attrs;
  std::array<int64_t, 2> s, d, out_pad;
  std::array<int64_t, 4> pad;
  int64_t groups;
  bool bias;
};

TEST(UnetOps, ConvTransposeForwardAndBackwardEqualItsDefinition) {
  const std::vector<TransposeCase> cases = {
      // PyTorch's own path: symmetric padding, output_padding < stride.
      {{{"out_channels", 6}, {"kernel", 3}, {"stride", 2}, {"padding", 1}, {"output_padding", 1}},
       {2, 2},
       {1, 1},
       {1, 1},
       {1, 1, 1, 1},
       1,
       true},
      // Groups, a rectangular kernel and stride, no bias.
      {{{"out_channels", 4},
        {"kernel", {3, 2}},
        {"stride", {2, 3}},
        {"padding", {0, 1}},
        {"groups", 2},
        {"bias", false}},
       {2, 3},
       {1, 1},
       {0, 0},
       {0, 1, 0, 1},
       2,
       false},
      // Asymmetric padding (ONNX [top, left, bottom, right]) and dilation: the cropped path.
      {{{"out_channels", 3}, {"kernel", 3}, {"stride", 2}, {"dilation", 2}, {"padding", {1, 0, 2, 3}}},
       {2, 2},
       {2, 2},
       {0, 0},
       {1, 0, 2, 3},
       1,
       true},
      // output_padding beyond the stride and the bottom padding: zero rows past the full output.
      {{{"out_channels", 2}, {"kernel", 2}, {"stride", 1}, {"output_padding", {2, 1}}},
       {1, 1},
       {1, 1},
       {2, 1},
       {0, 0, 0, 0},
       1,
       true},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const TransposeCase& c = cases[k];
    SCOPED_TRACE(c.attrs.dump());
    OneOp o = one_op(ir::OpKind::conv_transpose2d, c.attrs, {4, 5, 5});
    torch::manual_seed(static_cast<uint64_t>(k));
    torch::Tensor x = torch::randn({2, 4, 5, 5}).requires_grad_(true);
    torch::Tensor y = run(o, x);
    EXPECT_EQ(y.sizes().vec(),
              (std::vector<int64_t>{2, o.g.op(o.g.find("op")).output_shape[1], o.g.op(o.g.find("op")).output_shape[2],
                                    o.g.op(o.g.find("op")).output_shape[3]}));
    std::vector<torch::Tensor> ps = o.m->parameters();
    ASSERT_EQ(ps.size(), c.bias ? 2u : 1u);
    torch::Tensor xr = x.detach().clone().requires_grad_(true);
    std::vector<torch::Tensor> pr;
    for (auto& p : ps) pr.push_back(p.detach().clone().requires_grad_(true));
    torch::Tensor want = conv_transpose_by_definition(xr, pr[0], c.bias ? pr[1] : torch::Tensor(), c.s, c.pad, c.d,
                                                      c.out_pad, c.groups);
    expect_close(y, want, "forward");
    torch::Tensor r = torch::randn(y.sizes());
    (y * r).sum().backward();
    (want * r).sum().backward();
    expect_close(x.grad(), xr.grad(), "input gradient");
    for (size_t i = 0; i < ps.size(); ++i)
      expect_close(ps[i].grad(), pr[i].grad(), "parameter gradient " + std::to_string(i));
  }
}

TEST(UnetOps, ResizeEqualsInterpolateForwardAndBackward) {
  namespace F = torch::nn::functional;
  struct Case {
    Json attrs;
    F::InterpolateFuncOptions opt;
  };
  const std::vector<Case> cases = {
      {{{"size", {10, 10}}, {"scales", {2.0, 2.0}}},
       F::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest)},
      {{{"size", {7, 9}}}, F::InterpolateFuncOptions().size(std::vector<int64_t>{7, 9}).mode(torch::kNearest)},
      {{{"size", {7, 7}}, {"scales", {1.5, 1.5}}, {"mode", "linear"}},
       F::InterpolateFuncOptions()
           .scale_factor(std::vector<double>{1.5, 1.5})
           .mode(torch::kBilinear)
           .align_corners(false)},
      {{{"size", {6, 8}}, {"mode", "linear"}, {"align_corners", true}},
       F::InterpolateFuncOptions().size(std::vector<int64_t>{6, 8}).mode(torch::kBilinear).align_corners(true)},
      {{{"size", {3, 4}}, {"mode", "linear"}},  // downsampling
       F::InterpolateFuncOptions().size(std::vector<int64_t>{3, 4}).mode(torch::kBilinear).align_corners(false)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.attrs.dump());
    OneOp o = one_op(ir::OpKind::resize, c.attrs, {3, 5, 5});
    torch::Tensor x = torch::randn({2, 3, 5, 5}).requires_grad_(true);
    torch::Tensor xr = x.detach().clone().requires_grad_(true);
    torch::Tensor y = run(o, x), want = F::interpolate(xr, c.opt);
    expect_close(y, want, "forward");
    torch::Tensor r = torch::randn(y.sizes());
    (y * r).sum().backward();
    (want * r).sum().backward();
    expect_close(x.grad(), xr.grad(), "input gradient");
  }
}

TEST(UnetOps, PoolsWithRectangularWindowsCeilModeDilationAndCountIncludePadEqualTorch) {
  namespace F = torch::nn::functional;
  torch::Tensor x = torch::randn({2, 3, 6, 7});
  auto pooled = [&](ir::OpKind kind, Json attrs) { return run(one_op(kind, std::move(attrs), {3, 6, 7}), x); };
  expect_close(
      pooled(ir::OpKind::maxpool, {{"kernel", {3, 2}}, {"stride", {2, 1}}, {"padding", {1, 0}}, {"ceil_mode", true}}),
      F::max_pool2d(x, F::MaxPool2dFuncOptions({3, 2}).stride({2, 1}).padding({1, 0}).ceil_mode(true)), "max");
  expect_close(pooled(ir::OpKind::maxpool, {{"kernel", 2}, {"stride", 1}, {"dilation", 2}}),
               F::max_pool2d(x, F::MaxPool2dFuncOptions(2).stride(1).dilation(2)), "dilated max");
  expect_close(
      pooled(ir::OpKind::avgpool,
             {{"kernel", 3}, {"stride", 2}, {"padding", 1}, {"ceil_mode", true}, {"count_include_pad", false}}),
      F::avg_pool2d(x, F::AvgPool2dFuncOptions(3).stride(2).padding(1).ceil_mode(true).count_include_pad(false)),
      "avg excluding the padding");
  expect_close(pooled(ir::OpKind::avgpool, {{"kernel", {2, 3}}, {"stride", {1, 2}}, {"padding", 1}}),
               F::avg_pool2d(x, F::AvgPool2dFuncOptions({2, 3}).stride({1, 2}).padding(1)), "avg");
}

TEST(UnetOps, PerPositionCrossEntropyIsTheMeanOverBatchAndPositions) {
  ir::ModelBuilder b("seg");
  std::string x = b.input("x", {3, 4, 5});
  std::string lab = b.input("label", {4, 5}, ir::DType::i64);
  b.output(b.op("loss", ir::OpKind::cross_entropy, {x, lab}));
  ir::Graph g = ir::Graph::build(b.build());
  StageModule m(g, g.op_ids(), 1);
  torch::Tensor logits = torch::randn({2, 3, 4, 5}).requires_grad_(true);
  torch::Tensor labels = torch::randint(0, 3, {2, 4, 5}, torch::kLong);
  MicroBatchInfo info{0, 2, 2, 0};
  torch::Tensor loss = m.forward({{"x", logits}, {"label", labels}}, info).at("loss");
  torch::Tensor want = -torch::log_softmax(logits.detach(), 1).gather(1, labels.unsqueeze(1)).mean();
  EXPECT_NEAR(loss.item<double>(), want.item<double>(), 1e-6);
  // Synthetic labels (no --data) are per position, in [0, classes).
  torch::Tensor synth = synthetic_input(g, 1, 0, 6, 1, 0);
  EXPECT_EQ(synth.sizes().vec(), (std::vector<int64_t>{6, 4, 5}));
  EXPECT_GE(synth.min().item<int64_t>(), 0);
  EXPECT_LT(synth.max().item<int64_t>(), 3);
  EXPECT_EQ(index_range(g, 1), 3);
}

// --- The PyTorch exports (tests/fixtures/unet) ---

std::vector<double> log_losses(const fs::path& p) {
  std::vector<double> out;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);) out.push_back(Json::parse(line)["loss"].get<double>());
  return out;
}

void expect_losses(const std::vector<double>& got, const std::vector<double>& want, double rel,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t s = 0; s < got.size(); ++s) {
    EXPECT_LE(std::abs(got[s] - want[s]), rel * std::abs(want[s])) << what << " step " << s;
    worst = std::max(worst, std::abs(got[s] - want[s]) / std::abs(want[s]));
  }
  std::printf("%s: %zu steps, largest relative loss difference %.2e\n", what.c_str(), got.size(), worst);
}

TrainOptions fixture_options(const Json& ref, const std::string& name) {
  TrainOptions o = testing::options(ref["steps"].get<int>(), "sgd", ref["lr"].get<double>());
  o.momentum = ref["momentum"].get<double>();
  o.model_spec = (kDir / ref[name]["model"].get<std::string>()).string();
  o.data_dir = (kDir / ref[name]["data"].get<std::string>()).string();
  return o;
}

class UnetFixture : public testing::ScratchDirTest {
 protected:
  UnetFixture() : ScratchDirTest("gp_unet_") {}

  std::vector<double> train_single(const Json& ref, const std::string& name) {
    TrainOptions s = fixture_options(ref, name);
    s.single = true;
    s.batch = ref["batch"].get<int>();
    s.log_path = (dir_ / (name + ".jsonl")).string();
    EXPECT_EQ(run_single(s), 0);
    return log_losses(s.log_path);
  }
};

TEST_F(UnetFixture, DecoderOpsForwardEqualsPyTorchAndTrainsLikeIt) {
  const Json ref = reference();
  const std::string spec = (kDir / "decoder_ops.onnx").string();
  importers::ParamValues w;
  ir::Graph g = importers::load_graph(spec, w);
  EXPECT_EQ(g.total_params(), ref["decoder_ops"]["params"].get<int64_t>());
  StageModule m(g, g.op_ids(), 1, w);
  TrainOptions o = fixture_options(ref, "decoder_ops");
  RunData data = open_run_data(o, g, true);
  MicroBatchInfo info{0, 1, 1, 0, false};
  TensorMap ext = stage_inputs(m, info, data.train.get());
  const std::string out = g.op(g.find("loss")).inputs[0];
  torch::Tensor y = m.forward(ext, info).at(out).flatten();
  torch::Tensor want = torch::tensor(ref["decoder_ops"]["output_first"].get<std::vector<double>>(), torch::kFloat32);
  ASSERT_EQ(y.numel(), want.numel());
  const double diff = (y - want).abs().max().item<double>();
  std::printf("decoder_ops forward: %lld values, largest difference from PyTorch %.2e\n",
              static_cast<long long>(y.numel()), diff);
  EXPECT_LT(diff, 1e-5);
  expect_losses(train_single(ref, "decoder_ops"), ref["decoder_ops"]["sgd_losses"].get<std::vector<double>>(), 1e-4,
                "decoder_ops --single vs PyTorch");
}

/// `graphpipe plan --cluster summit --devices N --batch B --micro-batch M --optimizer sgd`.
plan::Plan unet_plan(const std::string& spec, int devices, int batch, int micro_batch) {
  ir::Graph g = importers::load_graph(spec);
  cost::CostModel cm(g, cost::load_cluster("summit", devices), cost::Optimizer::sgd);
  planner::PlannerOptions o;
  o.mini_batch = batch;
  o.micro_batch = micro_batch;
  o.planner = "graphpipe";
  o.time_limit_s = 30;
  plan::Plan p = planner::run_planner(cm, o);
  p.model_spec = spec;
  p.cluster_spec = "summit";
  return p;
}

/// A stage sending to two stages (a skip connection leaving the encoder stage).
bool stage_dag_branches(const plan::Plan& p) {
  for (const auto& s : p.stages)
    if (s.outputs_to.size() >= 2) return true;
  return false;
}

TEST_F(UnetFixture, UnetTrainsLikePyTorchSingleAndOnAFourDevicePlanWithSkipBranches) {
  const Json ref = reference();
  const std::vector<double> torch_losses = ref["unet"]["sgd_losses"].get<std::vector<double>>();
  const std::vector<double> single = train_single(ref, "unet");
  expect_losses(single, torch_losses, 1e-4, "unet --single vs PyTorch");

  const std::string spec = (kDir / "unet.onnx").string();
  const plan::Plan p = unet_plan(spec, 4, ref["batch"].get<int>(), 2);  // 4 micro-batches in flight
  std::string stages;
  for (const auto& s : p.stages)
    stages += fmt::format(" s{}:{}ops/dev[{}]/mb{}->[{}]", s.id, s.ops.size(), fmt::join(s.devices, ","),
                          s.micro_batch_size, fmt::join(s.outputs_to, ","));
  std::printf("unet on 4 summit devices, micro-batch 2:%s\n", stages.c_str());
  EXPECT_GE(p.stages.size(), 3u) << stages;
  EXPECT_TRUE(stage_dag_branches(p)) << "no stage feeds two stages:" << stages;
  TrainOptions o = fixture_options(ref, "unet");
  PreparedRun run = prepare_run(p, "1f1b");
  RunData data = open_run_data(o, run.graph, true);
  run.data = data.train;
  auto results = testing::run_threads(run, o);
  for (size_t r = 0; r < results.size(); ++r) {
    expect_losses(results[r].step_losses, single, 1e-5, "unet pipelined rank " + std::to_string(r) + " vs --single");
    expect_losses(results[r].step_losses, torch_losses, 1e-4,
                  "unet pipelined rank " + std::to_string(r) + " vs PyTorch");
  }
}

TEST_F(UnetFixture, SegmentationUnetTrainsWithPerPixelCrossEntropyLikePyTorch) {
  const Json ref = reference();
  ASSERT_EQ(setenv("GRAPHPIPE_ONNX_LOSS", "cross_entropy", 1), 0);
  ir::Graph g = importers::load_graph((kDir / "unet_seg.onnx").string());
  const ir::Op& loss = g.op(g.find("loss"));
  EXPECT_EQ(loss.kind, ir::OpKind::cross_entropy);
  EXPECT_EQ(g.find_input("label")->shape, (ir::Shape{ir::kBatch, 16, 16}));
  EXPECT_EQ(g.total_params(), ref["unet_seg"]["params"].get<int64_t>());
  const std::vector<double> single = train_single(ref, "unet_seg");
  unsetenv("GRAPHPIPE_ONNX_LOSS");
  expect_losses(single, ref["unet_seg"]["sgd_losses"].get<std::vector<double>>(), 1e-4, "unet_seg --single vs PyTorch");
}

}  // namespace
}  // namespace gp::runtime
