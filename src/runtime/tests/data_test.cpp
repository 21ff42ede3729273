// `train --data`: the .npy reader, every bad-data case (exit 2 before any worker starts), the
// sample order (wrap-around, --shuffle, --resume), and the check against PyTorch's own training:
// tests/fixtures/data/reference.json holds PyTorch's per-step losses and eval figures for
// multi_branch.onnx on the committed .npy files (make_reference.py; tests never run Python).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "runtime/data/dataset.h"
#include "runtime/data/data_feed.h"
#include "runtime/exec/stage_module.h"
#include "runtime/tests/dist_plans.h"
#include "runtime/tests/scratch_dir.h"
#include "runtime/base/train.h"
#include "runtime/launch/launcher.h"
#include "support/error.h"
#include "support/json.h"

namespace gp::runtime {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(GP_SOURCE_DIR) / "tests/fixtures/data";
const std::string kModel = (kFixtures / "multi_branch.onnx").string();
/// The PyTorch comparison's bound on each per-step loss (relative).
constexpr double kRelTol = 1e-4;

Json reference() {
  std::ifstream f(kFixtures / "reference.json");
  return Json::parse(f);
}

using testing::slurp;

/// Writes a version-1 .npy file: `descr` ("<f4", ...), `shape`, raw little-endian `data`.
void write_npy(const fs::path& path, const std::string& descr, const std::vector<int64_t>& shape, const void* data,
               size_t bytes, bool fortran = false) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': (" +
                       dims + "), }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f << header;
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

template <typename T>
void write_npy(const fs::path& path, const std::string& descr, const std::vector<int64_t>& shape,
               const std::vector<T>& v) {
  write_npy(path, descr, shape, v.data(), v.size() * sizeof(T));
}

class DataTest : public testing::ScratchDirTest {
 protected:
  DataTest() : ScratchDirTest("gp_data_") {}

  /// A valid dataset for multi_branch.onnx (x [n,12] f32, aux [n,8] f32, label [n] i64 in [0,5)).
  fs::path good_data(int n = 6) {
    fs::path d = dir_ / "data";
    fs::create_directories(d);
    std::vector<float> x(static_cast<size_t>(n) * 12), aux(static_cast<size_t>(n) * 8);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f;
    for (size_t i = 0; i < aux.size(); ++i) aux[i] = -static_cast<float>(i);
    std::vector<int64_t> label(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) label[static_cast<size_t>(i)] = i % 5;
    write_npy(d / "x.npy", "<f4", {n, 12}, x);
    write_npy(d / "aux.npy", "<f4", {n, 8}, aux);
    write_npy(d / "label.npy", "<i8", {n}, label);
    return d;
  }

  /// The message of the UserError Dataset::open throws for `d` (fails when it does not throw).
  std::string open_error(const fs::path& d) {
    ir::Graph g = importers::load_graph(kModel);
    try {
      Dataset::open(d.string(), g, "--data", true);
    } catch (const UserError& e) {
      return e.what();
    }
    ADD_FAILURE() << "Dataset::open accepted " << d;
    return "";
  }
};

TEST_F(DataTest, ReadsEveryDtypeAndConvertsIt) {
  fs::path d = good_data(4);
  // float16 and float64 features, int32 labels: converted to float32 / int64.
  std::vector<uint16_t> half(4 * 8);
  for (size_t i = 0; i < half.size(); ++i) half[i] = i % 2 ? 0x3c00 /* 1.0 */ : 0xc500 /* -5.0 */;
  half[2 * 8 + 2] = 0x0001;  // the smallest subnormal, 2^-24 (row 2)
  write_npy(d / "aux.npy", "<f2", {4, 8}, half);
  std::vector<double> x(4 * 12);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25 * static_cast<double>(i);
  write_npy(d / "x.npy", "<f8", {4, 12}, x);
  write_npy(d / "label.npy", "<i4", {4}, std::vector<int32_t>{4, 3, 2, 1});
  ir::Graph g = importers::load_graph(kModel);
  auto ds = Dataset::open(d.string(), g, "--data", true);
  ASSERT_EQ(ds->size(), 4);
  std::vector<float> aux(2 * 8), xs(2 * 12);
  std::vector<int64_t> label(2);
  ds->gather(1, 1, 2, aux.data());  // rows 1, 2
  ds->gather(0, 3, 2, xs.data());   // rows 3, 0 (wraps)
  ds->gather(2, 3, 2, label.data());
  EXPECT_EQ(aux[0], -5.0f);
  EXPECT_EQ(aux[1], 1.0f);
  EXPECT_EQ(aux[8 + 2], std::ldexp(1.0f, -24));
  EXPECT_EQ(xs[0], 0.25f * 36);
  EXPECT_EQ(xs[12], 0.0f);
  EXPECT_EQ(label, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(ds->rows_read(0), 2);
}

TEST_F(DataTest, EveryBadDataCaseNamesTheFileAndWhatIsWrong) {
  fs::path d = good_data();
  std::string x = (d / "x.npy").string(), label = (d / "label.npy").string();
  fs::rename(d / "aux.npy", dir_ / "aux.npy");
  EXPECT_NE(open_error(d).find("missing aux.npy for model input \"aux\" (the directory has: label.npy, x.npy)"),
            std::string::npos);
  fs::rename(dir_ / "aux.npy", d / "aux.npy");

  write_npy(d / "x.npy", "<i8", {6, 12}, std::vector<int64_t>(72));
  EXPECT_NE(open_error(d).find(x + ": dtype int64 does not fit model input \"x\""), std::string::npos);
  write_npy(d / "x.npy", "<f4", {6, 11}, std::vector<float>(66));
  EXPECT_NE(
      open_error(d).find(x + ": per-sample shape [11] (file shape [6, 11]) does not match model input \"x\" [12]"),
      std::string::npos);
  write_npy(d / "x.npy", "<f4", {5, 12}, std::vector<float>(60));
  EXPECT_NE(open_error(d).find("aux.npy: 6 samples, but x.npy has 5"), std::string::npos);
  write_npy(d / "x.npy", "<u1", {6, 12}, std::vector<uint8_t>(72));
  EXPECT_NE(open_error(d).find(x + ": unsupported dtype '<u1'"), std::string::npos);
  write_npy(d / "x.npy", ">f4", {6, 12}, std::vector<float>(72));
  EXPECT_NE(open_error(d).find(x + ": dtype '>f4' is big-endian"), std::string::npos);
  write_npy(d / "x.npy", "<f4", {6, 12}, std::vector<float>(72).data(), 72 * 4, /*fortran=*/true);
  EXPECT_NE(open_error(d).find(x + ": Fortran-ordered array"), std::string::npos);
  write_npy(d / "x.npy", "<f4", {6, 12}, std::vector<float>(71));  // one value short
  EXPECT_NE(open_error(d).find(x + ": truncated: shape [6, 12] of <f4 needs 288 data bytes, the file has 284"),
            std::string::npos);
  std::ofstream(x) << "x,y\n1,2\n";
  EXPECT_NE(open_error(d).find(x + ": not a .npy file"), std::string::npos);
  std::ofstream(x, std::ios::trunc).close();
  EXPECT_NE(open_error(d).find(x + ": empty file"), std::string::npos);
  good_data();

  write_npy(d / "label.npy", "<i8", {6}, std::vector<int64_t>{0, 1, 2, 5, 4, 3});
  EXPECT_NE(open_error(d).find(label + ": sample 3 has value 5 for model input \"label\", outside [0, 5)"),
            std::string::npos);
  write_npy(d / "label.npy", "<i4", {6}, std::vector<int32_t>{0, 1, -1, 4, 4, 3});
  EXPECT_NE(open_error(d).find(label + ": sample 2 has value -1"), std::string::npos);
  write_npy(d / "label.npy", "<f4", {6}, std::vector<float>(6));
  EXPECT_NE(
      open_error(d).find(label + ": dtype float32 does not fit model input \"label\" (indices; use int64 or int32)"),
      std::string::npos);
  write_npy(d / "label.npy", "<i8", {6, 1}, std::vector<int64_t>(6));
  EXPECT_NE(open_error(d).find("per-sample shape [1]"), std::string::npos);
  EXPECT_NE(open_error(dir_ / "nowhere").find("--data " + (dir_ / "nowhere").string() + ": not a directory"),
            std::string::npos);
}

// InputPrefetcher's one background thread: what take() returns equals a read on the spot, whether the
// micro-batch was announced (read ahead) or not (another one was), from a dataset and synthetic.
TEST_F(DataTest, InputsReadAheadEqualInputsReadNow) {
  fs::path d = good_data(6);
  ir::Graph g = importers::load_graph(kModel);
  auto data = Dataset::open(d.string(), g, "--data", true);
  StageModule m(g, g.op_ids(), 1, {}, torch::kCPU);
  for (const Dataset* source : {static_cast<const Dataset*>(data.get()), static_cast<const Dataset*>(nullptr)}) {
    SCOPED_TRACE(source ? "dataset" : "synthetic");
    InputPrefetcher feed(m, source, /*spare_core=*/true);
    auto info = [](int64_t step, int64_t begin) { return MicroBatchInfo{begin, 2, 4, step}; };
    // Announced each time; then a micro-batch other than the announced one; then nothing ahead.
    const std::vector<std::pair<MicroBatchInfo, std::optional<MicroBatchInfo>>> calls{{info(0, 0), info(0, 2)},
                                                                                      {info(0, 2), info(1, 0)},
                                                                                      {info(1, 2), info(2, 0)},
                                                                                      {info(2, 0), std::nullopt},
                                                                                      {info(2, 2), std::nullopt}};
    for (const auto& [now, next] : calls) {
      TensorMap got = feed.take(now, next), want = stage_inputs(m, now, source);
      ASSERT_EQ(got.size(), want.size());
      ASSERT_FALSE(want.empty());
      for (const auto& [name, t] : want) {
        ASSERT_TRUE(got.count(name)) << name;
        EXPECT_TRUE(torch::equal(got.at(name), t)) << name << " at step " << now.step << " sample " << now.sample_begin;
      }
    }
  }
}

TEST_F(DataTest, StepsWrapInFileOrderAndShuffleIsAPermutationPerEpoch) {
  fs::path d = good_data(5);
  ir::Graph g = importers::load_graph(kModel);
  auto plain = Dataset::open(d.string(), g, "--data", true);
  for (int64_t p = 0; p < 12; ++p) EXPECT_EQ(plain->row_of(p), p % 5);
  EXPECT_EQ(plain->epoch_of(9), 1);
  auto a = Dataset::open(d.string(), g, "--data", true, true, 7),
       b = Dataset::open(d.string(), g, "--data", true, true, 7);
  auto c = Dataset::open(d.string(), g, "--data", true, true, 8);
  std::vector<std::vector<int64_t>> epochs(4);
  bool seed_differs = false;
  for (int64_t p = 0; p < 20; ++p) {
    EXPECT_EQ(a->row_of(p), b->row_of(p)) << "same seed, same order (every rank)";
    seed_differs = seed_differs || a->row_of(p) != c->row_of(p);
    epochs[static_cast<size_t>(p / 5)].push_back(a->row_of(p));
  }
  EXPECT_TRUE(seed_differs);
  std::set<std::vector<int64_t>> distinct;
  for (auto e : epochs) {
    distinct.insert(e);
    std::sort(e.begin(), e.end());
    EXPECT_EQ(e, (std::vector<int64_t>{0, 1, 2, 3, 4})) << "each epoch visits every sample once";
  }
  EXPECT_GT(distinct.size(), 1u) << "the order changes between epochs";
}

TEST_F(DataTest, EvalSumsAddUpToTheTrainingLossAndSkipThePadding) {
  // A regression model (target.npy for the mse_loss) and the classifier: over counted samples
  // the eval loss sum is the mini-batch mean loss times the count; the last batch's wrapped
  // padding (positions >= N) does not count.
  fs::path d = dir_ / "reg";
  fs::create_directories(d);
  const std::string reg = "candle-uno:branches=2,layers=1,hidden=8";
  std::vector<float> a(80), b(80), t(10);
  for (size_t i = 0; i < 80; ++i) a[i] = std::sin(0.1f * float(i)), b[i] = std::cos(0.3f * float(i));
  for (size_t i = 0; i < 10; ++i) t[i] = 0.1f * float(i);
  write_npy(d / "tower0.input.npy", "<f4", {10, 8}, a);
  write_npy(d / "tower1.input.npy", "<f4", {10, 8}, b);
  write_npy(d / "target.npy", "<f4", {10, 1}, t);
  for (const auto& [spec, dir] : {std::pair{reg, d}, std::pair{kModel, good_data(10)}}) {
    ir::Graph g = importers::load_graph(spec);
    auto ds = Dataset::open(dir.string(), g, "--eval-data", true);
    StageModule m(g, g.op_ids(), 1);
    torch::NoGradGuard no_grad;
    MicroBatchInfo full{0, 4, 4, 1, false}, padded{0, 4, 4, 2, false};  // positions 4..7 and 8..11
    TensorMap ext = stage_inputs(m, full, ds.get());
    double mean = m.scaled_loss(m.forward(ext, full), full).item<double>();
    EvalSums s;
    add_eval_sums(m, ext, m.forward(ext, full), full, ds->size(), s);
    EXPECT_NEAR(s.loss, 4 * mean, 1e-5 * std::abs(4 * mean)) << spec;
    EXPECT_EQ(s.samples, 4) << spec;
    EXPECT_EQ(s.classified, spec == reg ? 0 : 4) << spec;
    EvalSums p;
    TensorMap pext = stage_inputs(m, padded, ds.get());
    add_eval_sums(m, pext, m.forward(pext, padded), padded, ds->size(), p);
    EXPECT_EQ(p.samples, 2) << spec << ": positions 8, 9 count, 10 and 11 (rows 0, 1 again) do not";
    MicroBatchInfo rows89{0, 2, 2, 4, false};  // positions 8, 9 alone
    TensorMap e89 = stage_inputs(m, rows89, ds.get());
    double mean89 = m.scaled_loss(m.forward(e89, rows89), rows89).item<double>();
    EXPECT_NEAR(p.loss, 2 * mean89, 1e-5 * std::abs(2 * mean89)) << spec;
  }
}

/// Per-step JSON records of a --log file.
std::vector<Json> read_log(const fs::path& p) {
  std::vector<Json> out;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);) out.push_back(Json::parse(line));
  return out;
}

TrainOptions reference_options(const Json& ref, const std::string& optimizer) {
  TrainOptions o = testing::options(ref["steps"].get<int>(), optimizer, ref[optimizer]["lr"].get<double>());
  if (optimizer == "sgd") o.momentum = ref[optimizer]["momentum"].get<double>();
  o.model_spec = kModel;
  o.data_dir = (kFixtures / ref["train"].get<std::string>()).string();
  o.eval_data_dir = (kFixtures / ref["eval"].get<std::string>()).string();
  o.eval_every = ref["eval_every"].get<int>();
  return o;
}

void expect_loss(double got, double want, const std::string& what) {
  EXPECT_LE(std::abs(got - want), kRelTol * std::abs(want)) << what << ": " << got << " vs PyTorch " << want;
}

/// Per-step losses and the eval figures of `evals` ((step, loss, accuracy)) against PyTorch's.
void expect_matches_pytorch(const Json& want, const std::vector<double>& losses,
                            const std::vector<std::tuple<int64_t, double, double>>& evals, const std::string& what) {
  const auto& wl = want["losses"];
  ASSERT_EQ(losses.size(), wl.size()) << what;
  double worst = 0;
  for (size_t s = 0; s < losses.size(); ++s) {
    expect_loss(losses[s], wl[s].get<double>(), what + " step " + std::to_string(s));
    worst = std::max(worst, std::abs(losses[s] - wl[s].get<double>()) / std::abs(wl[s].get<double>()));
  }
  std::printf("%s: %zu steps, largest relative difference from PyTorch's loss %.2e\n", what.c_str(), losses.size(),
              worst);
  const auto& we = want["eval"];
  ASSERT_EQ(evals.size(), we.size()) << what;
  for (size_t i = 0; i < evals.size(); ++i) {
    EXPECT_EQ(std::get<0>(evals[i]), we[i]["step"].get<int64_t>()) << what;
    expect_loss(std::get<1>(evals[i]), we[i]["loss"].get<double>(), what + " eval loss");
    EXPECT_NEAR(std::get<2>(evals[i]), we[i]["accuracy"].get<double>(), 1e-12) << what << " eval accuracy";
  }
}

TEST_F(DataTest, SingleMatchesPyTorchWithSgdMomentumAndAdam) {
  Json ref = reference();
  for (const std::string optimizer : {"sgd", "adam"}) {
    TrainOptions o = reference_options(ref, optimizer);
    o.single = true;
    o.batch = ref["batch"].get<int>();
    o.log_path = (dir_ / (optimizer + ".jsonl")).string();
    ASSERT_EQ(run_single(o), 0);
    std::vector<double> losses;
    std::vector<std::tuple<int64_t, double, double>> evals;
    for (const Json& j : read_log(o.log_path)) {
      losses.push_back(j["loss"].get<double>());
      EXPECT_EQ(j["epoch"].get<int64_t>(), j["step"].get<int64_t>() * o.batch / ref["n_train"].get<int64_t>());
      EXPECT_GE(j["data_time_s"].get<double>(), 0.0);
      if (j.contains("eval_loss"))
        evals.emplace_back(j["step"].get<int64_t>(), j["eval_loss"].get<double>(), j["eval_accuracy"].get<double>());
    }
    expect_matches_pytorch(ref[optimizer], losses, evals, "--single " + optimizer);
  }
}

void expect_pipeline_matches_pytorch(const plan::Plan& p, const std::string& what) {
  Json ref = reference();
  for (const std::string optimizer : {"sgd", "adam"}) {
    PreparedRun run = prepare_run(p, "1f1b");
    TrainOptions o = reference_options(ref, optimizer);
    RunData data = open_run_data(o, run.graph, true);
    run.data = data.train;
    run.eval_data = data.eval;
    auto results = testing::run_threads(run, o);
    for (size_t r = 0; r < results.size(); ++r) {
      std::vector<std::tuple<int64_t, double, double>> evals;
      for (const auto& [step, s] : results[r].evals)
        evals.emplace_back(step, s.loss / s.samples, s.correct / s.classified);
      expect_matches_pytorch(ref[optimizer], results[r].step_losses, evals,
                             what + " " + optimizer + " rank " + std::to_string(r));
    }
    // Every training sample is read once per step over a stage's replicas (each replica its
    // share), plus 3 padded eval batches of 8 per evaluation.
    int64_t rows = ref["steps"].get<int64_t>() * ref["batch"].get<int64_t>();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(data.train->rows_read(i), rows) << what << " input " << i;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(data.eval->rows_read(i), 2 * 24) << what << " eval input " << i;
  }
}

TEST_F(DataTest, PipelineOnThreeWorkersWithADataParallelStageMatchesPyTorch) {
  // Stage 0: the x tower (reads only x.npy), micro-batches of 4; stage 1: the aux tower, the head
  // and the loss on two replicas (each reads its 2 samples of every micro-batch of aux and label).
  expect_pipeline_matches_pytorch(testing::make_plan(kModel, 8, {{{"/tower_x/"}, {0}, 4}, {{}, {1, 2}, 4}}),
                                  "2 stages, 3 workers");
}

TEST_F(DataTest, PipelineOfThreeStagesWithOwnMicroBatchesMatchesPyTorch) {
  expect_pipeline_matches_pytorch(
      testing::make_plan(kModel, 8, {{{"/tower_x/"}, {0}, 2}, {{"/tower_aux/"}, {1}, 4}, {{}, {2}, 8}}),
      "3 stages, 3 workers");
}

TEST_F(DataTest, ResumeContinuesAtTheRightSample) {
  Json ref = reference();
  TrainOptions o = reference_options(ref, "adam");
  o.single = true;
  o.batch = ref["batch"].get<int>();
  o.eval_data_dir.clear();
  o.eval_every = 0;
  o.checkpoint_dir = (dir_ / "ckpt").string();
  o.log_path = (dir_ / "log.jsonl").string();
  o.steps = 4;  // stops mid-epoch 0 (36 samples, 8 per step): step 4 wraps into epoch 1
  ASSERT_EQ(run_single(o), 0);
  o.steps = ref["steps"].get<int>();
  o.resume = true;
  ASSERT_EQ(run_single(o), 0);
  std::vector<double> losses;
  for (const Json& j : read_log(o.log_path)) losses.push_back(j["loss"].get<double>());
  ASSERT_EQ(losses.size(), ref["adam"]["losses"].size());
  for (size_t s = 0; s < losses.size(); ++s)
    expect_loss(losses[s], ref["adam"]["losses"][s].get<double>(), "resumed step " + std::to_string(s));
}

TEST_F(DataTest, ShuffledPipelineTrainsLikeShuffledSingle) {
  fs::path d = good_data(13);
  TrainOptions o = testing::options(6, "sgd", 0.05);
  o.data_dir = d.string();
  o.shuffle = true;
  o.seed = 3;
  plan::Plan p = testing::make_plan(kModel, 4, {{{"/tower_x/"}, {0}, 2}, {{}, {1, 2}, 4}});
  PreparedRun run = prepare_run(p, "1f1b");
  run.data = open_run_data(o, run.graph, true).train;
  auto results = testing::run_threads(run, o);
  TrainOptions s = o;
  s.single = true;
  s.model_spec = kModel;
  s.batch = 4;
  s.log_path = (dir_ / "single.jsonl").string();
  ASSERT_EQ(run_single(s), 0);
  auto log = read_log(s.log_path);
  ASSERT_EQ(log.size(), 6u);
  for (size_t k = 0; k < log.size(); ++k)
    EXPECT_NEAR(results[0].step_losses[k], log[k]["loss"].get<double>(), 1e-5 * std::abs(log[k]["loss"].get<double>()));
  o.shuffle = false;  // and the order matters: unshuffled training differs
  PreparedRun plain = prepare_run(p, "1f1b");
  plain.data = open_run_data(o, plain.graph, true).train;
  auto unshuffled = testing::run_threads(plain, o);
  EXPECT_NE(unshuffled[0].step_losses, results[0].step_losses);
}

TEST_F(DataTest, PipelinedShuffledResumeContinuesAtTheRightSample) {
  // 13 samples, 4 per step: the run stops after step 2 (epoch 0) and resumes into epoch 1.
  fs::path d = good_data(13);
  TrainOptions o = testing::options(6, "adam", 0.01);
  o.data_dir = d.string();
  o.shuffle = true;
  o.seed = 5;
  PreparedRun run = prepare_run(testing::make_plan(kModel, 4, {{{"/tower_x/"}, {0}, 2}, {{}, {1, 2}, 4}}), "1f1b");
  run.data = open_run_data(o, run.graph, true).train;
  auto full = testing::run_threads(run, o);
  o.checkpoint_dir = (dir_ / "ckpt").string();
  o.steps = 3;
  testing::run_threads(run, o);
  o.steps = 6;
  o.resume = true;
  auto resumed = testing::run_threads(run, o);
  ASSERT_EQ(resumed[0].step_losses.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(resumed[0].step_losses[k], full[0].step_losses[k + 3]) << "step " << k + 3;
}

TEST_F(DataTest, CliTrainsOnDataAndRejectsBadDataBeforeAnyWorkerStarts) {
  auto run = [&](const std::string& args) {  // exit code, stdout + stderr
    testing::Proc p = graphpipe(args);
    return std::make_pair(p.code, p.out + p.err);
  };
  fs::path d = good_data(6);
  plan::save_plan((dir_ / "plan.json").string(),
                  testing::make_plan(kModel, 4, {{{"/tower_x/"}, {0}, 2}, {{}, {1}, 4}}));
  auto [code, out] = run("train --plan " + (dir_ / "plan.json").string() + " --steps 3 --data " + d.string() +
                         " --shuffle --eval-data " + d.string() + " --eval-every 2");
  ASSERT_EQ(code, 0) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("step 1 loss [0-9.]+ time [0-9.]+ s epoch 0 data [0-9.]+ s"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("step 2 loss [0-9.]+ time [0-9.]+ s epoch 1 data"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("eval after step 1: loss [0-9.]+ accuracy [0-9.]+ \\(6 samples\\)")))
      << out;
  write_npy(d / "label.npy", "<i8", {6}, std::vector<int64_t>{0, 1, 2, 3, 4, 9});
  std::tie(code, out) = run("train --plan " + (dir_ / "plan.json").string() + " --steps 3 --data " + d.string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find((d / "label.npy").string() + ": sample 5 has value 9"), std::string::npos) << out;
  EXPECT_EQ(out.find("worker"), std::string::npos) << "no worker started: " << out;
  std::tie(code, out) = run("train --single --model " + kModel + " --batch 4 --steps 1 --data " + d.string() +
                            " --eval-every 2");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--eval-every needs --eval-data DIR"), std::string::npos) << out;
}

}  // namespace
}  // namespace gp::runtime
