// Reliability of run_single (in process): checkpoints carry checksums and the run's identity and are
// refused when corrupt or written for another run; a failed save (ENOSPC) keeps the previous
// checkpoint; a non-finite loss or gradient stops training naming step, stage and op.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "importers/model_json.h"
#include "runtime/checkpoint/checkpoint_set.h"
#include "runtime/exec/divergence.h"
#include "runtime/exec/optim.h"
#include "runtime/tests/dist_plans.h"
#include "runtime/tests/test_models.h"
#include "runtime/base/train.h"
#include "runtime/launch/launcher.h"

namespace gp::runtime {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
}

std::string bytes_of(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

/// Inverts 64 bytes in the middle of the first copy of `t`'s raw data in file `f` (the archive
/// stores tensor data uncompressed); returns false when the bytes are not found once.
bool flip_tensor_bytes(const fs::path& f, const torch::Tensor& t) {
  std::string file = slurp(f), data = bytes_of(t);
  if (data.size() < 128) return false;
  size_t at = file.find(data);
  if (at == std::string::npos || file.find(data, at + 1) != std::string::npos) return false;
  for (size_t i = at + data.size() / 2 - 32; i < at + data.size() / 2 + 32; ++i) file[i] = static_cast<char>(~file[i]);
  spit(f, file);
  return true;
}

/// The largest tensor of a list (most bytes to hit).
std::pair<std::string, torch::Tensor> largest(const std::vector<std::pair<std::string, torch::Tensor>>& ts) {
  auto best = ts.front();
  for (const auto& t : ts)
    if (t.second.numel() > best.second.numel()) best = t;
  return best;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

struct Reliability : ::testing::Test {
  fs::path dir;
  std::string spec;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("gp_reliability_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    spec = (dir / "model.json").string();
    importers::write_model_json(spec, testing::all_kinds_model(/*with_batchnorm=*/false));
  }
  void TearDown() override {
    ::unsetenv("GP_FAULT");
    fs::remove_all(dir);
  }
  TrainOptions opts(int steps) const {
    TrainOptions o;
    o.model_spec = spec;
    o.batch = 6;
    o.steps = steps;
    o.single = true;
    o.checkpoint_dir = (dir / "ck").string();
    o.log_path = (dir / "log.jsonl").string();
    return o;
  }
  /// The --single file of the published generation (the flat layout's path when there is none).
  std::string ckpt() const { return current_checkpoint_file((dir / "ck").string(), -1, 0); }
};

TEST_F(Reliability, ManifestVerifiesEveryParameterAndOptimizerTensor) {
  ASSERT_EQ(run_single(opts(2)), 0);
  CheckpointContents c = read_checkpoint(ckpt());
  ASSERT_TRUE(c.has_manifest());
  EXPECT_EQ(c.manifest["format"], "graphpipe.checkpoint/1");
  EXPECT_EQ(c.manifest["steps_done"], 2);
  EXPECT_EQ(c.manifest["identity"]["plan"]["kind"], "single");
  EXPECT_EQ(c.manifest["identity"]["plan"]["mini_batch_size"], 6);
  EXPECT_EQ(c.manifest["identity"]["optimizer"], "adam");
  // Adam keeps two state tensors per parameter with a gradient.
  EXPECT_EQ(c.manifest["params"].size(), c.params.size());
  EXPECT_GE(c.manifest["optimizer_state"].size(), c.params.size());
  EXPECT_EQ(c.verified_tensors,
            static_cast<int64_t>(c.manifest["params"].size() + c.manifest["optimizer_state"].size()));
}

TEST_F(Reliability, FlippedParameterBytesAreRefusedNamingFileAndTensor) {
  ASSERT_EQ(run_single(opts(2)), 0);
  auto [name, t] = largest(read_checkpoint(ckpt()).params);
  ASSERT_TRUE(flip_tensor_bytes(ckpt(), t)) << name;
  TrainOptions resume = opts(3);
  resume.resume = true;
  std::string err;
  try {
    run_single(resume);
  } catch (const UserError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find(ckpt()), std::string::npos) << err;
  EXPECT_NE(err.find("tensor \"" + name + "\""), std::string::npos) << err;
  EXPECT_NE(err.find("fails its checksum"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_NE(error_of([&] { read_checkpoint(ckpt()); }).find(name), std::string::npos);
}

TEST_F(Reliability, FlippedOptimizerStateBytesAreRefusedNamingTheTensor) {
  ASSERT_EQ(run_single(opts(2)), 0);
  // The optimizer state as loaded: the same bytes as in the file.
  ir::Graph g = ir::Graph::build(testing::all_kinds_model(false));
  StageModule m(g, g.op_ids(), 1);
  auto opt = make_optimizer("adam", m.parameters(), 1e-3, 0.9);
  load_checkpoint(ckpt(), m, *opt);
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  auto state = optimizer_state_tensors(*opt, names);
  ASSERT_FALSE(state.empty());
  auto [name, t] = largest(state);
  EXPECT_NE(name.find("#exp_avg"), std::string::npos) << name;
  ASSERT_TRUE(flip_tensor_bytes(ckpt(), t)) << name;
  std::string err = error_of([&] { read_checkpoint(ckpt()); });
  EXPECT_NE(err.find("tensor \"" + name + "\" (optimizer state"), std::string::npos) << err;
  TrainOptions resume = opts(3);
  resume.resume = true;
  err = error_of([&] { run_single(resume); });
  EXPECT_NE(err.find("tensor \"" + name + "\""), std::string::npos) << err;
}

TEST_F(Reliability, ResumingAnotherRunIsRefusedNamingWhatDiffers) {
  ASSERT_EQ(run_single(opts(2)), 0);
  TrainOptions other = opts(3);
  other.resume = true;
  other.batch = 12;
  std::string err = error_of([&] { run_single(other); });
  EXPECT_NE(err.find("plan mini_batch_size: 6 in the checkpoint, 12 in this run"), std::string::npos) << err;
  other = opts(3);
  other.resume = true;
  other.optimizer = "sgd";
  err = error_of([&] { run_single(other); });
  EXPECT_NE(err.find("--optimizer: adam in the checkpoint, sgd in this run"), std::string::npos) << err;
  // Same parameter names and shapes, another model: the hash tells them apart.
  ir::Model other_model = testing::all_kinds_model(false);
  for (auto& op : other_model.ops)
    if (op.name == "drop") op.attrs["p"] = 0.25;  // another dropout rate: every parameter keeps its shape
  std::string spec2 = (dir / "model2.json").string();
  importers::write_model_json(spec2, other_model);
  other = opts(3);
  other.resume = true;
  other.model_spec = spec2;
  err = error_of([&] { run_single(other); });
  EXPECT_NE(err.find("written by a different run: a different model: op drop: its kind, inputs, shape or attributes "
                     "differ"),
            std::string::npos)
      << err;
}

// A small in-process fuzz: single-byte changes anywhere in a checkpoint file (zip headers, the
// pickled records, tensor data, padding) are refused with a UserError or leave every value the
// reader returns identical; never another exception, a crash, or silently different weights.
TEST_F(Reliability, ByteMutationsAnywhereAreRefusedOrHarmless) {
  ASSERT_EQ(run_single(opts(2)), 0);
  const std::string original = slurp(ckpt());
  CheckpointContents want = read_checkpoint(ckpt());
  std::mt19937_64 rng(17);
  int refused = 0, harmless = 0;
  std::map<std::string, int> reasons;
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = original;
    size_t at = rng() % bytes.size();
    bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
    spit(ckpt(), bytes);
    try {
      CheckpointContents got = read_checkpoint(ckpt());
      ASSERT_EQ(got.steps_done, want.steps_done) << "byte " << at;
      ASSERT_EQ(got.params.size(), want.params.size()) << "byte " << at;
      for (size_t i = 0; i < got.params.size(); ++i) {
        ASSERT_EQ(got.params[i].first, want.params[i].first) << "byte " << at;
        ASSERT_TRUE(torch::equal(got.params[i].second, want.params[i].second))
            << "byte " << at << " changed " << got.params[i].first << " silently";
      }
      ++harmless;
    } catch (const UserError& e) {
      ++refused;
      std::string w = e.what();
      reasons[w.find("fails its checksum") != std::string::npos ? "checksum"
              : w.find("not a readable") != std::string::npos   ? "unreadable"
                                                                : "other check"]++;
    } catch (const std::exception& e) {
      FAIL() << "byte " << at << ": not a UserError: " << e.what();
    }
  }
  std::string summary;
  for (auto& [k, v] : reasons) summary += fmt::format(" {} {}", k, v);
  std::printf("300 single-bit flips: %d refused (%s), %d harmless (padding or unread metadata)\n", refused,
              summary.c_str(), harmless);
  EXPECT_GT(refused, 0);
}

// A checkpoint from before manifests: loads, with a warning, and nothing is verified.
TEST_F(Reliability, CheckpointWithoutManifestLoadsUnverified) {
  ir::Graph g = ir::Graph::build(testing::all_kinds_model(false));
  StageModule m(g, g.op_ids(), 3);
  auto opt = make_optimizer("adam", m.parameters(), 1e-3, 0.9);
  torch::serialize::OutputArchive ar;  // the layout save_checkpoint wrote before manifests
  c10::List<std::string> names;
  auto named = m.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    names.push_back(named[i].first);
    ar.write(fmt::format("p{}", i), named[i].second.detach(), /*is_buffer=*/true);
  }
  ar.write("names", c10::IValue(names));
  ar.write("steps_done", c10::IValue(int64_t{5}));
  torch::serialize::OutputArchive opt_ar;
  opt->save(opt_ar);
  ar.write("optimizer", opt_ar);
  fs::create_directories(dir / "ck");
  ar.save_to(ckpt());
  CheckpointContents c = read_checkpoint(ckpt());
  EXPECT_FALSE(c.has_manifest());
  EXPECT_EQ(c.verified_tensors, 0);
  EXPECT_EQ(c.steps_done, 5);
  TrainOptions resume = opts(6);
  resume.resume = true;
  EXPECT_EQ(run_single(resume), 0);
  EXPECT_TRUE(read_checkpoint(ckpt()).has_manifest());  // the next save adds one
}

TEST_F(Reliability, FullDiskWhileSavingKeepsThePreviousCheckpoint) {
  TrainOptions o = opts(3);
  o.checkpoint_every = 1;
  ::setenv("GP_FAULT", "rank=0,kind=enospc,step=2", 1);  // the save after step 2 (the third) fails
  std::string err;
  try {
    run_single(o);
  } catch (const RuntimeFailure& e) {
    err = e.what();
  }
  ::unsetenv("GP_FAULT");
  EXPECT_NE(err.find("could not save the checkpoint after 3 steps: No space left on device"), std::string::npos) << err;
  EXPECT_NE(err.find((dir / "ck" / "latest.json").string() + " still names the complete checkpoint of step 2"),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(ckpt() + ".tmp"));
  CheckpointContents c = read_checkpoint(ckpt());  // verified: the file of step 2, untouched
  EXPECT_EQ(c.steps_done, 2);
  TrainOptions resume = opts(3);
  resume.resume = true;
  EXPECT_EQ(run_single(resume), 0);
  EXPECT_EQ(read_checkpoint(ckpt()).steps_done, 3);
}

TEST_F(Reliability, NonFiniteLossStopsNamingStepStageAndOp) {
  TrainOptions o = opts(4);
  o.checkpoint_dir.clear();
  o.optimizer = "sgd";
  o.lr = 1e30;
  std::string err;
  try {
    run_single(o);
  } catch (const RuntimeFailure& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("non-finite loss"), std::string::npos) << err;
  EXPECT_NE(err.find("at step 1, stage 0 (--single: the whole model)"), std::string::npos) << err;
  EXPECT_NE(err.find("loss op '"), std::string::npos) << err;
  EXPECT_NE(err.find("output of op '"), std::string::npos) << err;
  o.allow_nonfinite = true;
  EXPECT_EQ(run_single(o), 0);
  std::ifstream log(o.log_path);
  int nonfinite = 0;
  for (std::string line; std::getline(log, line);)
    if (line.find("NaN") != std::string::npos || line.find("null") != std::string::npos) ++nonfinite;
  EXPECT_GT(nonfinite, 0) << "--allow-nonfinite trained on through a non-finite loss";
}

TEST_F(Reliability, NonFiniteGradientIsNamedWithItsOpAndParameter) {
  ir::Graph g = ir::Graph::build(testing::all_kinds_model(false));
  StageModule m(g, g.op_ids(), 1);
  MicroBatchInfo info{0, 4, 4, 0};
  TensorMap outs = m.forward(synthetic_external_inputs(m, info), info);
  m.scaled_loss(outs, info).backward();
  EXPECT_NO_THROW(check_gradients_finite(m, {7, 2}));
  poison_first_gradient(m);
  std::string err = error_of([&] { check_gradients_finite(m, {7, 2}); });
  auto first = m.named_parameters().front().first;  // "op/param"
  std::string op = first.substr(0, first.rfind('/')), param = first.substr(first.rfind('/') + 1);
  EXPECT_NE(err.find("non-finite gradient at step 7, stage 2, op '" + op + "' parameter '" + param + "': 1 nan"),
            std::string::npos)
      << err;
}

// Plans the validator accepts but the runtime's message tags cannot address are refused before
// any worker starts (they were GP_ASSERT aborts inside a worker).
TEST(RuntimeLimits, PlansBeyondTheMessageTagsAreUserErrors) {
  const std::string wide = "mmt:branches=65,layers=1,hidden=8,seq=2,heads=1,ffn=8";
  plan::Plan p = testing::make_plan(wide, 8, {{{"m"}, {0}, 8}, {{}, {1}, 8}});  // 65 branch outputs cross
  std::string err = error_of([&] { prepare_run(p, "1f1b"); });
  EXPECT_NE(err.find("plan: stage 0 sends 65 op outputs to stage 1; the runtime carries at most 64"), std::string::npos)
      << err;
  plan::Plan big = testing::make_plan("mmt:branches=2,layers=1,hidden=8,seq=2,heads=1,ffn=8", 1 << 22,
                                      {{{"m0."}, {0}, 1 << 22}, {{}, {1}, 1 << 22}});
  err = error_of([&] { prepare_run(big, "1f1b"); });
  EXPECT_NE(err.find("plan: mini_batch_size 4194304 is above what the runtime can train, 4194303"), std::string::npos)
      << err;
}

}  // namespace
}  // namespace gp::runtime
