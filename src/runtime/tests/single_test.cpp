// run_single: logs, determinism, checkpoint + resume equals an uninterrupted run, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "importers/model_json.h"
#include "runtime/checkpoint/checkpoint_set.h"
#include "runtime/exec/optim.h"
#include "runtime/tests/test_models.h"
#include "runtime/base/train.h"
#include "runtime/launch/launcher.h"

namespace gp::runtime {
namespace {

namespace fs = std::filesystem;

struct SingleTest : ::testing::Test {
  fs::path dir;
  std::string spec;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("gp_single_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    spec = (dir / "model.json").string();
    importers::write_model_json(spec, testing::all_kinds_model(/*with_batchnorm=*/true));
  }
  void TearDown() override { fs::remove_all(dir); }
  TrainOptions opts(const std::string& tag, int steps) const {
    TrainOptions o;
    o.model_spec = spec;
    o.batch = 6;
    o.steps = steps;
    o.seed = 9;
    o.single = true;
    o.log_path = (dir / (tag + ".jsonl")).string();
    return o;
  }
  std::vector<Json> read_log(const std::string& tag) const {
    std::ifstream in(dir / (tag + ".jsonl"));
    std::vector<Json> out;
    for (std::string line; std::getline(in, line);) out.push_back(Json::parse(line));
    return out;
  }
};

std::vector<torch::Tensor> checkpoint_params(const ir::Graph& g, const std::string& path) {
  StageModule m(g, g.op_ids(), 12345);  // other seed: values must come from the file
  auto opt = make_optimizer("adam", m.parameters(), 1e-3, 0.9);
  load_checkpoint(path, m, *opt);
  return m.parameters();
}

TEST_F(SingleTest, ResumeContinuesExactlyAsUninterrupted) {
  TrainOptions full = opts("full", 4);
  full.checkpoint_dir = (dir / "ck_full").string();
  ASSERT_EQ(run_single(full), 0);

  TrainOptions first = opts("split", 2);
  first.checkpoint_dir = (dir / "ck_split").string();
  first.checkpoint_every = 1;
  ASSERT_EQ(run_single(first), 0);
  TrainOptions rest = first;
  rest.steps = 4;
  rest.resume = true;
  ASSERT_EQ(run_single(rest), 0);

  auto a = read_log("full"), b = read_log("split");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i]["step"], static_cast<int>(i));
    EXPECT_EQ(b[i]["step"], static_cast<int>(i));
    EXPECT_DOUBLE_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i;
    EXPECT_GT(a[i]["step_time_s"].get<double>(), 0);
  }
  EXPECT_NE(a[0]["loss"], a[3]["loss"]) << "training did not change the loss";

  ir::Graph g = ir::Graph::build(testing::all_kinds_model(true));
  auto pa = checkpoint_params(g, current_checkpoint_file(full.checkpoint_dir, -1, 0));
  auto pb = checkpoint_params(g, current_checkpoint_file(first.checkpoint_dir, -1, 0));
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
  // Only the pointer and the last generation remain: older generations and temporaries are gone.
  EXPECT_TRUE(stale_entries(first.checkpoint_dir).empty());
  EXPECT_EQ(std::distance(fs::directory_iterator(first.checkpoint_dir), fs::directory_iterator{}), 2);
}

TEST_F(SingleTest, SgdAndAdamStartFromTheSameLossAndDiverge) {
  TrainOptions sgd = opts("sgd", 6);
  sgd.optimizer = "sgd";
  sgd.lr = 0.05;
  TrainOptions adam = opts("adam", 1);
  ASSERT_EQ(run_single(sgd), 0);
  ASSERT_EQ(run_single(adam), 0);
  auto s = read_log("sgd"), a = read_log("adam");
  EXPECT_DOUBLE_EQ(s[0]["loss"].get<double>(), a[0]["loss"].get<double>());
  EXPECT_GT(s[0]["loss"].get<double>(), 0);
  for (const Json& j : s) EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
  TrainOptions adam2 = opts("adam2", 2);
  ASSERT_EQ(run_single(adam2), 0);
  TrainOptions sgd2 = opts("sgd2", 2);
  sgd2.optimizer = "sgd";
  ASSERT_EQ(run_single(sgd2), 0);
  // Different update rules give different second-step losses.
  EXPECT_NE(read_log("adam2")[1]["loss"].get<double>(), read_log("sgd2")[1]["loss"].get<double>());
}

TEST_F(SingleTest, BadInputIsAUserError) {
  TrainOptions o = opts("bad", 2);
  o.optimizer = "lamb";
  EXPECT_THROW(run_single(o), UserError);
  o = opts("bad", 2);
  o.resume = true;
  o.checkpoint_dir = (dir / "nothing").string();
  try {
    run_single(o);
    FAIL() << "resume without a checkpoint must fail";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  o = opts("bad", 0);
  EXPECT_THROW(run_single(o), UserError);
}

// The synthetic targets are a function of the features (exec/synthetic.h), so a small multi-branch
// model learns: the loss falls well below its start within a few dozen steps.
TEST_F(SingleTest, SyntheticTargetsAreLearnable) {
  TrainOptions o = opts("learn", 40);
  o.model_spec = "mmt:branches=2,layers=1,seq=8,hidden=32,heads=2,ffn=64,classes=10";
  o.batch = 32;
  o.lr = 0.01;
  ASSERT_EQ(run_single(o), 0);
  auto log = read_log("learn");
  ASSERT_EQ(log.size(), 40u);
  double first = log[0]["loss"].get<double>(), last = 0;
  for (size_t i = 35; i < 40; ++i) last += log[i]["loss"].get<double>() / 5;
  EXPECT_NEAR(first, std::log(10.0), 0.3);
  EXPECT_LT(last, 0.8 * first) << "first " << first << " mean of the last 5 " << last;
}

// make_optimizer's multi-tensor SGD and Adam against LibTorch's per-parameter loops on the CPU: the
// same parameters and state bit for bit after every step, including a parameter that gets its first
// gradient later than the others (its Adam step count differs) and one that has none in a step.
TEST(Optimizers, MultiTensorStepsEqualLibTorchsLoopBitForBit) {
  for (const std::string kind : {"sgd", "adam"}) {
    torch::manual_seed(4);
    const std::vector<std::vector<int64_t>> shapes{{5, 3}, {7}, {2, 3, 4}, {1}};
    std::vector<torch::Tensor> a, b;
    for (const auto& s : shapes) {
      torch::Tensor t = torch::randn(s);
      a.push_back(t.clone().requires_grad_(true));
      b.push_back(t.clone().requires_grad_(true));
    }
    auto ours = make_optimizer(kind, a, 0.05, 0.9);
    std::unique_ptr<torch::optim::Optimizer> ref;
    if (kind == "sgd") ref = std::make_unique<torch::optim::SGD>(b, torch::optim::SGDOptions(0.05).momentum(0.9));
    else ref = std::make_unique<torch::optim::Adam>(b, torch::optim::AdamOptions(0.05));
    EXPECT_EQ(optimizer_kind(*ours), kind);
    for (int step = 0; step < 6; ++step) {
      ours->zero_grad();
      ref->zero_grad();
      for (size_t i = 0; i < a.size(); ++i) {
        if ((i == 2 && step < 2) || (i == 3 && step == 4)) continue;  // late first gradient; a step without one
        torch::Tensor g = torch::randn(a[i].sizes()) * (1 + static_cast<double>(step));
        a[i].mutable_grad() = g.clone();
        b[i].mutable_grad() = g.clone();
      }
      ours->step();
      ref->step();
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_TRUE(torch::equal(a[i], b[i])) << kind << " step " << step << " parameter " << i;
    }
    const std::vector<std::string> names{"p0", "p1", "p2", "p3"};
    auto sa = optimizer_state_tensors(*ours, names), sb = optimizer_state_tensors(*ref, names);
    ASSERT_EQ(sa.size(), sb.size()) << kind;
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sa[i].first, sb[i].first);
      EXPECT_TRUE(torch::equal(sa[i].second, sb[i].second)) << kind << " " << sa[i].first;
    }
  }
}

}  // namespace
}  // namespace gp::runtime
