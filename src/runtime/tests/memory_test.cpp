// Memory: the counting allocator, and the cost model's per-rank peak held to the measured one.
// `graphpipe plan` + `graphpipe train --json` on small mmt, dlrm, candle-uno presets and an imported
// ONNX model at a few micro-batch sizes and device counts: every rank's measured peak of live tensor
// bytes must be within 15% of the predicted one (docs/cost-model.md, "Memory"). More cases, with
// gpipe and larger batches: bench/memory_fidelity.sh.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "runtime/exec/memory_meter.h"
#include "runtime/tests/scratch_dir.h"
#include "support/json.h"

namespace gp::runtime {
namespace {

namespace fs = std::filesystem;

constexpr double kTolerance = 0.15;

using testing::Proc;
using testing::slurp;

class MemoryCli : public testing::ScratchDirTest {
 protected:
  MemoryCli() : ScratchDirTest("gp_memory_") {}
  Proc graphpipe(const std::string& args) { return ScratchDirTest::graphpipe(args, "", 120); }

  /// Plans `model` on `devices` cpu devices (micro-batch `micro`, 0: the planner's choice), trains 2
  /// steps (the second has the optimizer state too) and checks every rank with a stage.
  void expect_prediction_holds(const std::string& model, int devices, int batch, int micro,
                               const std::string& optimizer = "adam") {
    std::string plan = "--model '" + model + "' --cluster cpu --devices " + std::to_string(devices) + " --batch " +
                       std::to_string(batch) + " --optimizer " + optimizer + " --out plan.json";
    if (micro > 0) plan += " --micro-batch " + std::to_string(micro);
    Proc p = graphpipe("plan " + plan);
    ASSERT_EQ(p.code, 0) << p.err;
    Proc t = graphpipe("train --plan plan.json --steps 2 --json --optimizer " + optimizer);
    ASSERT_EQ(t.code, 0) << t.err;
    Json j = Json::parse(t.out);
    ASSERT_EQ(j.at("format").get<std::string>(), "graphpipe.train/1");
    int checked = 0;
    for (const Json& r : j.at("ranks")) {
      if (r.at("stage").get<int>() < 0) continue;
      double measured = r.at("peak_memory_bytes").get<double>(),
             predicted = r.at("predicted_memory_bytes").get<double>();
      ASSERT_GT(predicted, 0);
      EXPECT_NEAR(measured / predicted, 1.0, kTolerance)
          << model << " on " << devices << " devices, micro-batch " << micro << ", rank " << r.at("rank")
          << ": measured " << measured << " B, predicted " << predicted << " B\n"
          << r.dump(2);
      ++checked;
    }
    EXPECT_GE(checked, 1);
  }
};

TEST(CountingAllocator, CountsLiveAndPeakTensorBytes) {
  detail::install_counting_allocator();
  int64_t before = detail::live_tensor_bytes();
  detail::reset_peak_tensor_bytes();
  {
    torch::Tensor a = torch::empty({1000}, torch::kFloat32);
    EXPECT_EQ(detail::live_tensor_bytes() - before, 4000);
    torch::Tensor b = torch::empty({500}, torch::kFloat64);
    EXPECT_EQ(detail::live_tensor_bytes() - before, 8000);
  }
  EXPECT_EQ(detail::live_tensor_bytes(), before);
  EXPECT_GE(detail::peak_tensor_bytes() - before, 8000);
  detail::reset_peak_tensor_bytes();
  EXPECT_EQ(detail::peak_tensor_bytes(), before);
}

TEST(CountingAllocator, MeterSplitsModelStateFromActivations) {
  detail::install_counting_allocator();
  torch::Tensor w = torch::zeros({256, 256}).requires_grad_(true);
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1).momentum(0.9));
  detail::MemoryMeter meter({w}, &sgd);
  torch::Tensor x = torch::ones({64, 256}), y;
  meter.begin_action();
  y = torch::matmul(x, w);  // saves x (held already) and keeps y: 64 KB
  meter.end_action(0, 0, false);
  meter.begin_action();
  y.sum().backward();  // the gradient appears: 256 KB
  y = torch::Tensor();
  meter.end_action(0, 0, false);
  meter.begin_action();
  sgd.step();  // the momentum buffer appears: 256 KB
  meter.end_action(0, 0, false);
  EXPECT_EQ(meter.at_peak().parameters, 256 * 256 * 4);
  EXPECT_GE(meter.at_peak().gradients, 256 * 256 * 4);
  EXPECT_GE(meter.peak_bytes(), 3 * 256 * 256 * 4);
}

TEST_F(MemoryCli, SingleProcessPeakIsPredicted) {
  Proc t = graphpipe(
      "train --single --model 'mmt:branches=2,layers=2,hidden=64,seq=16,heads=2,ffn=128' --batch 16 "
      "--steps 2 --json");
  ASSERT_EQ(t.code, 0) << t.err;
  Json r = Json::parse(t.out).at("ranks").at(0);
  EXPECT_NEAR(r.at("peak_memory_bytes").get<double>() / r.at("predicted_memory_bytes").get<double>(), 1.0, kTolerance)
      << r.dump(2);
}

TEST_F(MemoryCli, MmtRanksArePredicted) {
  // Two stages, the first replicated twice, two micro-batches in flight there (bench/memory_fidelity.sh
  // runs more cases).
  expect_prediction_holds("mmt:branches=2,layers=2,hidden=64,seq=64,heads=2,ffn=128", 3, 32, 8, "sgd");
}

TEST_F(MemoryCli, DlrmAndCandleUnoRanksArePredicted) {
  expect_prediction_holds("dlrm:dense_branches=1,embedding_branches=2,layers=2,hidden=64,rows=2000,dim=32,bag=8", 2, 32,
                          8);
  expect_prediction_holds("candle-uno:branches=2,layers=2,hidden=256", 3, 32, 4);
}

TEST_F(MemoryCli, ImportedOnnxRanksArePredicted) {
  expect_prediction_holds(std::string(GP_SOURCE_DIR) + "/tests/fixtures/onnx/two_branch.onnx", 2, 16, 4);
}

TEST_F(MemoryCli, MemoryLimitStopsTheRankThatExceedsIt) {
  Proc p = graphpipe(
      "plan --model 'mmt:branches=2,layers=1,hidden=32,seq=8,heads=2,ffn=64' --cluster cpu --devices 2 --batch 8 "
      "--micro-batch 4 --out plan.json");
  ASSERT_EQ(p.code, 0) << p.err;
  Proc t = graphpipe("train --plan plan.json --steps 2 --memory-limit 0.00001");
  EXPECT_EQ(t.code, 1) << t.out << t.err;
  EXPECT_NE(t.err.find("exceeded --memory-limit"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("stage"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("step 0"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("params"), std::string::npos) << t.err;
  Proc s = graphpipe(
      "train --single --model 'mmt:branches=2,layers=1,hidden=32,seq=8,heads=2,ffn=64' --batch 8 "
      "--steps 1 --memory-limit 0.00001");
  EXPECT_EQ(s.code, 1) << s.out << s.err;
  EXPECT_NE(s.err.find("exceeded --memory-limit"), std::string::npos) << s.err;
}

}  // namespace
}  // namespace gp::runtime
