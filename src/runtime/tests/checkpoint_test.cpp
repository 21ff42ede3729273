// Checkpoints that survive any crash, know their run and move between plans (issue 36), through the
// built graphpipe binary: random kills with resumes (a short scripts/crashtest.sh), a file of
// another run refused, the folder lock, outputs on a full device, SIGTERM to the launcher, and
// resharding to other plans (in place and with `checkpoint reshard`) equal to --single.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>

#include "runtime/checkpoint/checkpoint_set.h"
#include "runtime/tests/dist_plans.h"
#include "runtime/tests/scratch_dir.h"
#include "support/json.h"

namespace gp::runtime {
namespace {

namespace fs = std::filesystem;
using testing::make_plan;
using testing::Proc;
using testing::slurp;

const char* kMmt = "mmt:branches=2,layers=1,hidden=32,seq=8,heads=2,ffn=64";
const char* kTiedGpt = "gpt:layers=2,seq=8,hidden=32,heads=2,ffn=64,vocab=50,tie_embeddings=1";

class Checkpoints : public testing::ScratchDirTest {
 protected:
  Checkpoints() : ScratchDirTest("gp_ckpt_") {}
  std::string write_plan(const std::string& name, const plan::Plan& p) {
    plan::save_plan((dir_ / name).string(), p);
    return name;
  }
  std::vector<double> losses(const std::string& log) {
    std::vector<double> out;
    std::ifstream f(dir_ / log);
    for (std::string line; std::getline(f, line);) out.push_back(Json::parse(line)["loss"].get<double>());
    return out;
  }
  int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

  /// Trains --single for `steps` (the reference), then `from` for `at` steps with checkpoints, then
  /// resumes under `to` (in place) and from `checkpoint reshard`'s copy: losses of the resumed steps
  /// within 1e-6 of --single's, and the two resumed runs identical.
  void expect_resharded_run_matches_single(const std::string& spec, const plan::Plan& from, const plan::Plan& to,
                                           const std::string& optimizer, bool with_tool) {
    const fs::path& dir = dir_;
    plan::save_plan((dir / "from.json").string(), from);
    plan::save_plan((dir / "to.json").string(), to);
    const std::string opt = " --optimizer " + optimizer + " --lr 0.02 --timeout 20 --seed 3";
    const int at = 6, steps = 9;
    Proc single = graphpipe("train --single --model " + spec + " --batch 8 --steps " + std::to_string(steps) + opt +
                            " --log single.jsonl");
    ASSERT_EQ(single.code, 0) << single.err;
    Proc first = graphpipe("train --plan from.json --steps " + std::to_string(at) + opt + " --checkpoint-dir ck");
    ASSERT_EQ(first.code, 0) << first.err;
    if (with_tool) {
      Proc tool = graphpipe("checkpoint reshard --from ck --plan to.json --out ck2");
      ASSERT_EQ(tool.code, 0) << tool.err;
      EXPECT_NE(tool.out.find("resharding: the checkpoint of step 6"), std::string::npos) << tool.out;
    }
    Proc resumed = graphpipe("train --plan to.json --resume --steps " + std::to_string(steps) + opt +
                             " --checkpoint-dir ck --log resumed.jsonl");
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    EXPECT_NE(resumed.out.find("resharding: the checkpoint of step 6 in ck was written under a plan of " +
                               std::to_string(from.stages.size()) + " stages"),
              std::string::npos)
        << resumed.out;
    std::ifstream fa(dir / "single.jsonl"), fb(dir / "resumed.jsonl");
    std::vector<double> a, b;
    for (std::string l; std::getline(fa, l);) a.push_back(Json::parse(l)["loss"].get<double>());
    for (std::string l; std::getline(fb, l);) b.push_back(Json::parse(l)["loss"].get<double>());
    ASSERT_EQ(a.size(), size_t(steps));
    ASSERT_EQ(b.size(), size_t(steps - at));
    for (int i = at; i < steps; ++i) EXPECT_NEAR(b[i - at], a[i], 1e-6 * std::abs(a[i])) << optimizer << " step " << i;
    EXPECT_NE(a[at], a[steps - 1]) << "training did not move";
    if (with_tool) {
      Proc again = graphpipe("train --plan to.json --resume --steps " + std::to_string(steps) + opt +
                             " --checkpoint-dir ck2 --log tool.jsonl");
      ASSERT_EQ(again.code, 0) << again.err;
      EXPECT_EQ(slurp(dir / "tool.jsonl").substr(0, 30), slurp(dir / "resumed.jsonl").substr(0, 30));
      Proc same = graphpipe("checkpoint diff ck ck2");
      EXPECT_EQ(same.code, 0) << same.out << same.err;
    }
  }
};

// The ctest size of `make crashtest`: three SIGKILLs of a random worker or the launcher at random
// moments of a 3-stage run checkpointing every step; every attempt resumes from latest.json's step,
// every logged loss equals the uninterrupted run's, the final weights are identical.
TEST_F(Checkpoints, RandomKillsAlwaysResumeWithTheLossesOfAnUninterruptedRun) {
  Proc r = run("bash " + std::string(GP_SOURCE_DIR) + "/scripts/crashtest.sh",
               "GP=" + std::string(GP_BINARY) + " CRASH_KILLS=3 CRASH_STEPS=8 CRASH_SEED=" + std::to_string(::getpid()),
               240);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("crashtest passed: 3 kills"), std::string::npos) << r.out << r.err;
}

// A file of another run (another --seed) copied into the generation is refused naming the file and
// the field; interrupted saves' leftovers are named on --resume and removed once it has loaded.
TEST_F(Checkpoints, AFileOfAnotherRunIsRefusedAndLeftoversAreNamedThenRemoved) {
  std::string plan = write_plan("two.json", make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}}));
  std::string common = "train --plan " + plan + " --timeout 10";
  ASSERT_EQ(graphpipe(common + " --steps 2 --checkpoint-dir a").code, 0);
  ASSERT_EQ(graphpipe(common + " --steps 2 --checkpoint-dir b --seed 5").code, 0);
  fs::copy_file(current_checkpoint_file((dir_ / "b").string(), 1, 1),
                current_checkpoint_file((dir_ / "a").string(), 1, 1), fs::copy_options::overwrite_existing);
  Proc mixed = graphpipe(common + " --checkpoint-dir a --resume --steps 3");
  EXPECT_EQ(mixed.code, 2) << mixed.err;
  EXPECT_TRUE(std::regex_search(mixed.err, std::regex("a/step-00000002-[0-9a-f]{8}/stage1-rank1.pt: the checkpoint "
                                                      "was written by a different run: --seed: 5 in the checkpoint, 1 "
                                                      "in this run")))
      << mixed.err;
  EXPECT_EQ(lines(mixed.err), 1) << mixed.err;

  // Leftovers of an interrupted save: a generation folder and a pointer temporary.
  fs::create_directories(dir_ / "b" / "step-00000003-deadbeef");
  std::ofstream(dir_ / "b" / "step-00000003-deadbeef" / "stage0-rank0.pt.tmp") << "partial";
  std::ofstream(dir_ / "b" / "latest.json.0badf00d-r1.tmp") << "{";
  Proc resumed = graphpipe(common + " --checkpoint-dir b --seed 5 --resume --steps 3");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("holds 2 entries left by an interrupted save (latest.json.0badf00d-r1.tmp, "
                             "step-00000003-deadbeef)"),
            std::string::npos)
      << resumed.err;
  EXPECT_FALSE(fs::exists(dir_ / "b" / "step-00000003-deadbeef"));
  EXPECT_FALSE(fs::exists(dir_ / "b" / "latest.json.0badf00d-r1.tmp"));
  EXPECT_TRUE(stale_entries((dir_ / "b").string()).empty());
  EXPECT_EQ(published_generation((dir_ / "b").string())->steps_done, 3);

  // A crash after publishing step 3 but before removing step 2 leaves an older generation; a resume
  // with no step left to run (so no save) still removes it.
  fs::create_directories(dir_ / "b" / "step-00000002-deadbeef");
  std::ofstream(dir_ / "b" / "step-00000002-deadbeef" / "stage0-rank0.pt") << "older";
  Proc done = graphpipe(common + " --checkpoint-dir b --seed 5 --resume --steps 3");
  ASSERT_EQ(done.code, 0) << done.err;
  EXPECT_NE(done.err.find("holds 1 entry left by an interrupted save (step-00000002-deadbeef)"), std::string::npos)
      << done.err;
  EXPECT_TRUE(stale_entries((dir_ / "b").string()).empty());
  EXPECT_EQ(published_generation((dir_ / "b").string())->steps_done, 3);
}

// The lock: a second run on a folder in use is exit 2 naming the holder; a lock file left by a
// process that died is taken over with a note.
TEST_F(Checkpoints, ALockedFolderIsRefusedNamingTheHolderAndAStaleLockIsTakenOver) {
  std::string single = std::string("train --single --model ") + kMmt + " --batch 8 --steps 1 --checkpoint-dir ck";
  {
    CheckpointLock held((dir_ / "ck").string());
    Proc second = graphpipe(single);
    EXPECT_EQ(second.code, 2) << second.err;
    EXPECT_NE(second.err.find("--checkpoint-dir ck is in use by another run: pid " + std::to_string(::getpid()) +
                              " on host "),
              std::string::npos)
        << second.err;
    EXPECT_EQ(lines(second.err), 1) << second.err;
    std::string plan = write_plan("two.json", make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}}));
    Proc pipe = graphpipe("train --plan " + plan + " --steps 1 --checkpoint-dir ck");
    EXPECT_EQ(pipe.code, 2) << pipe.err;
    EXPECT_NE(pipe.err.find("is in use by another run: pid " + std::to_string(::getpid())), std::string::npos)
        << pipe.err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "ck" / "lock"));  // released
  // A lock file written by a process that has exited (nobody holds the flock).
  Proc dead = run("sh -c 'echo $$'");
  std::string pid = dead.out.substr(0, dead.out.find('\n'));
  std::ofstream(dir_ / "ck" / "lock") << R"({"pid": )" << pid << R"(, "host": "elsewhere", "started": "earlier"})";
  Proc took = graphpipe(single);
  EXPECT_EQ(took.code, 0) << took.err;
  EXPECT_NE(took.err.find("note: took over the lock ck/lock left by pid " + pid +
                          " on host elsewhere (since earlier), which is no longer running"),
            std::string::npos)
      << took.err;
}

// Every output the user asked for is checked: --log, --trace and --json's stdout on a full device
// are exit 1 naming the file.
TEST_F(Checkpoints, OutputsOnAFullDeviceAreExit1NamingTheFile) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  std::string single = std::string("train --single --model ") + kMmt + " --batch 8 --steps 2";
  Proc log = graphpipe(single + " --log /dev/full");
  EXPECT_EQ(log.code, 1) << log.err;
  EXPECT_NE(log.err.find("--log: cannot write /dev/full: No space left on device"), std::string::npos) << log.err;
  std::ofstream(dir_ / "json.sh") << GP_BINARY << " " << single << " --json >/dev/full\n";
  Proc json = run("sh json.sh");
  EXPECT_EQ(json.code, 1) << json.err;
  EXPECT_NE(json.err.find("stdout: cannot write the output: No space left on device"), std::string::npos) << json.err;
  std::string plan = write_plan("two.json", make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}}));
  Proc trace = graphpipe("train --plan " + plan + " --steps 1 --trace /dev/full");
  EXPECT_EQ(trace.code, 1) << trace.err;
  EXPECT_NE(trace.err.find("--trace: cannot write /dev/full: No space left on device"), std::string::npos) << trace.err;
  EXPECT_EQ(lines(trace.err), 1) << trace.err;
  Proc plog = graphpipe("train --plan " + plan + " --steps 2 --log-file /dev/full");
  EXPECT_EQ(plog.code, 1) << plog.err;
  EXPECT_NE(plog.err.find("--log: cannot write /dev/full: No space left on device"), std::string::npos) << plog.err;
}

// SIGTERM to the launcher: the workers are killed, one line says so, the exit status is the
// signal's, and no worker is left.
TEST_F(Checkpoints, SigtermToTheLauncherStopsTheWorkersAndSaysSoInOneLine) {
  std::string plan = (dir_ / write_plan("two.json", make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}}))).string();
  std::ofstream(dir_ / "term.sh") << std::string(GP_BINARY) << " train --plan " << plan
                                  << " --steps 100000 --checkpoint-dir ck --checkpoint-every 5 >t.out 2>t.err &\n"
                                  << "pid=$!\nwhile [ ! -e ck/latest.json ]; do sleep 0.05; done\n"
                                  << "kill -TERM $pid\nwait $pid\necho $? >t.rc\n"
                                  << "sleep 0.3; pgrep -f 'graphpipe worker --plan " << plan << " ' >t.left\n";
  Proc r = run("sh term.sh", "", 60);
  std::string err = slurp(dir_ / "t.err");
  EXPECT_EQ(slurp(dir_ / "t.rc"), "143\n") << err;
  EXPECT_TRUE(std::regex_search(err, std::regex("^graphpipe train: stopped by SIGTERM: killed all 2 workers \\(rank 0 "
                                                "was (in step [0-9]+ at action '[^']+'|before its first action)\\); "
                                                "the checkpoint of step [0-9]+ in ck is complete\n$")))
      << err;
  EXPECT_EQ(slurp(dir_ / "t.left"), "");
  EXPECT_FALSE(fs::exists(dir_ / "ck" / "lock"));
}

// "A 3-stage run checkpointed at step 6 resumes under a 2-device plan with other devices and
// continues equal to --single" (Adam), also through `checkpoint reshard`; a checkpoint of another
// model is refused naming the op.
TEST_F(Checkpoints, ThreeStagesResumeOnTwoOtherDevicesLikeSingleWithAdam) {
  plan::Plan three = make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{"m1."}, {1}, 4}, {{}, {2}, 2}});
  plan::Plan two = make_plan(kMmt, 8, {{{"m0.", "m1."}, {1}, 2}, {{}, {0}, 8}});
  expect_resharded_run_matches_single(kMmt, three, two, "adam", /*with_tool=*/true);
  const char* narrower = "mmt:branches=2,layers=1,hidden=16,seq=8,heads=2,ffn=64";
  write_plan("other.json", make_plan(narrower, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}}));
  Proc other = graphpipe("checkpoint reshard --from ck --plan other.json --out ck3");
  EXPECT_EQ(other.code, 2) << other.err;
  EXPECT_NE(other.err.find("written by a different run: a different model: op m0."), std::string::npos) << other.err;
  EXPECT_FALSE(fs::exists(dir_ / "ck3" / "latest.json"));
}

// SGD with momentum, a model whose token embedding and LM head share one table (held on two
// stages), resumed under a plan with a replicated stage and other micro-batches.
TEST_F(Checkpoints, TiedGptResumesUnderAReplicatedPlanLikeSingleWithSgd) {
  plan::Plan two = make_plan(kTiedGpt, 8, {{{"wte", "l0."}, {0}, 4}, {{}, {1}, 4}});
  plan::Plan replicated = make_plan(kTiedGpt, 8, {{{"wte"}, {2}, 8}, {{}, {0, 1}, 2}});
  expect_resharded_run_matches_single(kTiedGpt, two, replicated, "sgd", /*with_tool=*/false);
}

// `checkpoint export`: one file of named tensors that PyTorch (torch.load with its default
// weights_only) and NumPy read back with the checkpoint's names, shapes, dtypes and values.
TEST_F(Checkpoints, ExportedCheckpointLoadsInPyTorchAndNumPyWithTheSameTensors) {
  std::string plan = write_plan("two.json", make_plan(kMmt, 8, {{{"m0."}, {0}, 4}, {{}, {1}, 4}}));
  ASSERT_EQ(graphpipe("train --plan " + plan + " --steps 2 --checkpoint-dir ck").code, 0);
  Proc pt = graphpipe("checkpoint export ck --format pt --out ck.pt");
  ASSERT_EQ(pt.code, 0) << pt.err;
  Proc npz = graphpipe("checkpoint export ck --format npz --out ck.npz");
  ASSERT_EQ(npz.code, 0) << npz.err;
  Json want = Json::object();
  for (const auto& f : published_generation((dir_ / "ck").string())->files()) {
    CheckpointContents c = read_checkpoint(f);
    for (const auto* list : {&c.params, &c.optimizer_state})
      for (const auto& [n, t] : *list)
        want[n] = {{"shape", t.sizes().vec()},
                   {"sum", t.to(torch::kFloat64).sum().item<double>()},
                   {"sumsq", t.to(torch::kFloat64).square().sum().item<double>()}};
  }
  std::ofstream(dir_ / "want.json") << want.dump();
  std::ofstream(dir_ / "check.py") << R"(import json, sys
import numpy as np, torch
want = json.load(open("want.json"))
pt, npz = torch.load("ck.pt"), np.load("ck.npz")
assert sorted(pt) == sorted(want) == sorted(npz.files), (len(pt), len(want), len(npz.files))
for k, w in want.items():
    a, b = pt[k].double().numpy(), npz[k].astype(np.float64)
    assert list(a.shape) == w["shape"] == list(b.shape), k
    assert np.array_equal(pt[k].numpy(), npz[k]), k
    for got in (a, b):
        assert abs(got.sum() - w["sum"]) <= 1e-9 * max(1.0, abs(w["sum"])), (k, got.sum(), w["sum"])
        assert abs((got * got).sum() - w["sumsq"]) <= 1e-9 * max(1.0, w["sumsq"]), k
print("same", len(want), "tensors")
)";
  Proc py = run(std::string(GP_PYTHON) + " check.py", "", 120);
  EXPECT_EQ(py.code, 0) << py.out << py.err;
  EXPECT_NE(py.out.find("same " + std::to_string(want.size()) + " tensors"), std::string::npos) << py.out << py.err;
  Proc bad = graphpipe("checkpoint export ck --format h5 --out x");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--format: expected pt or npz, found \"h5\""), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace gp::runtime
