// Tests for graphpipe.plan/1 "costs": recording, the JSON round trip, strict parsing, older plans
// without the field, rebuilding the costs (with explicit overrides and their notes), and whether a
// prediction describes this machine.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "plan/costs.h"
#include "support/sha256.h"

namespace gp::plan {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

Plan small_plan() {
  Plan p;
  p.planner = "manual";
  p.model_name = "m";
  p.num_ops = 2;
  p.model_spec = "m.json";
  p.cluster_name = "summit";
  p.num_devices = 2;
  p.cluster_spec = "summit";
  p.mini_batch_size = 8;
  Stage a;
  a.ops = {"a"};
  a.devices = {0};
  a.micro_batch_size = 4;
  a.in_flight = 2;
  a.outputs_to = {1};
  Stage b;
  b.id = 1;
  b.ops = {"b"};
  b.devices = {1};
  b.micro_batch_size = 4;
  b.inputs_from = {0};
  p.stages = {a, b};
  p.predicted.iteration_time_s = 0.5;
  return p;
}

cost::Profile profile(const std::string& device, double fwd = 1e-3) {
  cost::Profile p;
  p.device = device;
  std::string sig = "linear(f32[B, 16])->f32[B, 16] {\"out_features\":16}";
  p.ops[sig] = {sig, "linear", {1, 2, 4}, {fwd, 2 * fwd, 4 * fwd}, {2 * fwd, 4 * fwd, 8 * fwd}};
  p.p2p = cost::LinkFit{5e-5, 2e9};
  return p;
}

std::string parse_error(const Json& j) {
  try {
    plan_from_json(j, "p.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

class PlanCostFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gp_costs_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // 55 / 56 / 64 bytes: the length field fits the last block, needs one more, or a whole new one.
  EXPECT_EQ(sha256_hex(std::string(55, 'a')), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha256_hex(std::string(56, 'a')), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha256_hex(std::string(64, 'a')), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(PlanCosts, RecordedAndRoundTripped) {
  Plan p = small_plan();
  cost::Profile prof = profile("cpu: Test CPU (1 thread)");
  record_costs(p, cost::load_cluster("summit", 2), &prof, "prof.json");
  Json j = plan_to_json(p);
  ASSERT_TRUE(j.contains("costs"));
  EXPECT_EQ(j["costs"]["cluster"]["format"], "graphpipe.cluster/1");
  EXPECT_EQ(j["costs"]["cluster"]["num_devices"], 2);
  EXPECT_EQ(j["costs"]["profile"]["format"], "graphpipe.profile/1");
  EXPECT_EQ(j["costs"]["profile_path"], "prof.json");
  EXPECT_EQ(j["costs"]["profile_sha256"], profile_sha256(prof));
  EXPECT_EQ(plan_from_json(j, "p.json"), p);
  // Through text, as a file holds it: the doubles come back bit for bit, so does the hash.
  EXPECT_EQ(plan_from_json(Json::parse(j.dump(1)), "p.json"), p);

  Plan none = small_plan();
  record_costs(none, cost::load_cluster("summit", 2), nullptr, "");
  Json k = plan_to_json(none);
  EXPECT_TRUE(k["costs"]["profile"].is_null());
  EXPECT_FALSE(k["costs"].contains("profile_sha256"));
  EXPECT_EQ(plan_from_json(k, "p.json"), none);
  EXPECT_FALSE(plan_from_json(k, "p.json").costs.has_profile());
}

TEST(PlanCosts, OlderPlansWithoutTheFieldStillLoad) {
  Plan p = small_plan();
  Json j = plan_to_json(p);
  EXPECT_FALSE(j.contains("costs"));
  Plan back = plan_from_json(j, "old.json");
  EXPECT_FALSE(back.costs.recorded());
  EXPECT_EQ(back, p);
}

TEST(PlanCosts, StrictErrorsNameThePath) {
  Plan p = small_plan();
  cost::Profile prof = profile("cpu: Test CPU (1 thread)");
  record_costs(p, cost::load_cluster("summit", 2), &prof, "prof.json");
  Json j = plan_to_json(p);
  Json k = j;
  k["costs"]["cluster"]["device"]["memory_bytes"] = -1;
  EXPECT_EQ(parse_error(k), "p.json: costs.cluster.device.memory_bytes: must be a positive number, found -1");
  k = j;
  k["costs"]["cluster"]["num_nodes"] = 2;
  k["costs"]["cluster"]["devices_per_node"] = 4;
  k["costs"]["cluster"]["num_devices"] = 8;
  EXPECT_THAT(parse_error(k),
              HasSubstr("p.json: costs.cluster: has 8 devices, but the plan's cluster.num_devices is 2"));
  k = j;
  k["costs"].erase("cluster");
  EXPECT_THAT(parse_error(k), HasSubstr("p.json: costs: missing required field \"cluster\""));
  k = j;
  k["costs"]["profile"]["ops"][0]["batches"] = {4, 2, 1};
  EXPECT_THAT(parse_error(k), HasSubstr("p.json: costs.profile.ops[0].batches[1]: batches must be strictly ascending"));
  k = j;
  k["costs"]["profile_sha256"] = "abc";
  EXPECT_THAT(parse_error(k), HasSubstr("costs.profile_sha256: expected 64 lowercase hex digits"));
  k = j;  // an edited measurement no longer matches the recorded hash ...
  k["costs"]["profile"]["ops"][0]["fwd_s"][0] = 0.5;
  EXPECT_THAT(parse_error(k), HasSubstr("costs.profile_sha256: does not match the embedded profile"));
  k["costs"].erase("profile_sha256");  // ... unless the hash is left out
  EXPECT_EQ(plan_from_json(k, "p.json").costs.profile_sha256,
            profile_sha256(cost::profile_from_json(k["costs"]["profile"], "x")));
  k = j;  // not embedded: path and hash are both needed
  k["costs"]["profile"] = nullptr;
  k["costs"].erase("profile_path");
  EXPECT_THAT(parse_error(k), HasSubstr("needs both \"profile_path\" and \"profile_sha256\""));
}

TEST_F(PlanCostFiles, SimulateUsesTheRecordedCostsAndNotesDifferentOnes) {
  Plan p = small_plan();
  cost::Profile prof = profile("cpu: Test CPU (1 thread)");
  cost::save_profile(path("a.json"), prof);
  record_costs(p, cost::load_cluster("summit", 2), &prof, path("a.json"));

  CostSource cs = plan_costs(p, "p.json", "simulate");
  EXPECT_TRUE(cs.notes.empty());
  EXPECT_EQ(cs.cluster.name, "summit");
  EXPECT_EQ(cs.cluster.num_devices(), 2);
  ASSERT_NE(cs.profile, nullptr);
  EXPECT_EQ(*cs.profile, prof);
  EXPECT_THAT(cs.profile_from, HasSubstr("embedded"));

  // The same profile given again, even formatted differently, is no change: no note.
  write_json_file(path("same.json"), cost::profile_to_json(prof), 4);
  cs = plan_costs(p, "p.json", "simulate", "summit", path("same.json"));
  EXPECT_TRUE(cs.notes.empty()) << cs.notes[0];

  // A different one wins, with one line saying so.
  cost::save_profile(path("b.json"), profile("cpu: Test CPU (1 thread)", 2e-3));
  cs = plan_costs(p, "p.json", "simulate", "", path("b.json"));
  ASSERT_EQ(cs.notes.size(), 1u);
  EXPECT_EQ(cs.notes[0], "simulate: using --profile " + path("b.json") +
                             " instead of the profile the plan was made with (" + path("a.json") + ")");
  EXPECT_EQ(cs.profile->ops.begin()->second.fwd_s[0], 2e-3);

  cs = plan_costs(p, "p.json", "simulate", "dgx-a100", "");
  ASSERT_EQ(cs.notes.size(), 1u);
  EXPECT_EQ(cs.notes[0],
            "simulate: using --cluster dgx-a100 (dgx-a100: 2 x A100-80GB) instead of the cluster the "
            "plan was made with (summit: 2 x V100-16GB)");
  EXPECT_EQ(cs.cluster.name, "dgx-a100");

  Plan bare = small_plan();
  record_costs(bare, cost::load_cluster("summit", 2), nullptr, "");
  cs = plan_costs(bare, "p.json", "simulate");
  EXPECT_EQ(cs.profile, nullptr);
  EXPECT_TRUE(cs.notes.empty());
  cs = plan_costs(bare, "p.json", "simulate", "", path("a.json"));
  ASSERT_EQ(cs.notes.size(), 1u);
  EXPECT_THAT(cs.notes[0], HasSubstr("the plan was made without a profile"));
}

TEST_F(PlanCostFiles, OlderPlansUseTheirClusterSpecWithANote) {
  Plan p = small_plan();
  CostSource cs = plan_costs(p, "old.json", "simulate");
  EXPECT_EQ(cs.cluster.name, "summit");
  EXPECT_EQ(cs.profile, nullptr);
  ASSERT_EQ(cs.notes.size(), 1u);
  EXPECT_THAT(cs.notes[0], HasSubstr("old.json does not record the costs it was made with"));
  p.cluster_spec = "";
  try {
    plan_costs(p, "old.json", "simulate");
    FAIL() << "no cluster at all was accepted";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("pass --cluster SPEC"));
  }
}

TEST_F(PlanCostFiles, LargeProfilesAreRecordedByPathAndHash) {
  Plan p = small_plan();
  cost::Profile prof = profile("cpu: Test CPU (1 thread)");
  cost::save_profile(path("a.json"), prof);
  record_costs(p, cost::load_cluster("summit", 2), &prof, path("a.json"), /*max_embedded_bytes=*/10);
  Json j = plan_to_json(p);
  EXPECT_TRUE(j["costs"]["profile"].is_null());
  EXPECT_EQ(j["costs"]["profile_sha256"], profile_sha256(prof));
  Plan back = plan_from_json(j, "p.json");
  EXPECT_EQ(back, p);
  CostSource cs = plan_costs(back, "p.json", "simulate");
  ASSERT_NE(cs.profile, nullptr);
  EXPECT_EQ(*cs.profile, prof);
  EXPECT_TRUE(cs.notes.empty());
  // The file changed since planning: refused, naming both hashes' field and the way out.
  cost::save_profile(path("a.json"), profile("cpu: Test CPU (1 thread)", 5e-3));
  try {
    plan_costs(back, "p.json", "simulate");
    FAIL() << "a changed profile was accepted";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("p.json: costs.profile_sha256: " + path("a.json") + " has changed"));
    EXPECT_THAT(e.what(), HasSubstr("pass --profile"));
  }
  fs::remove(path("a.json"));
  try {
    plan_costs(back, "p.json", "simulate");
    FAIL() << "a missing profile was accepted";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("p.json: costs.profile_path:"));
  }
}

TEST(PredictionScope, AProfileMeasuredHereOrThisMachinesCpuPreset) {
  std::string here_device = "cpu: " + cost::local_cpu_model() + " (1 thread)";
  Plan p = small_plan();
  cost::Profile mine = profile(here_device), theirs = profile("cpu: Some Other CPU 9000 (1 thread)");
  record_costs(p, cost::load_cluster("cpu", 2), &mine, "");
  PredictionScope s = prediction_scope(p, "p.json");
  EXPECT_TRUE(s.here) << s.why;
  EXPECT_THAT(s.why, HasSubstr("made with a profile measured on this machine's CPU"));

  record_costs(p, cost::load_cluster("cpu", 2), &theirs, "");
  s = prediction_scope(p, "p.json");
  EXPECT_FALSE(s.here) << s.why;
  EXPECT_THAT(s.why, HasSubstr("Some Other CPU 9000"));

  record_costs(p, cost::load_cluster("cpu", 2), nullptr, "");
  s = prediction_scope(p, "p.json");
  EXPECT_TRUE(s.here) << s.why;
  EXPECT_THAT(s.why, HasSubstr("this machine's cpu preset"));

  cost::Cluster elsewhere = cost::load_cluster("cpu", 2);
  elsewhere.device.name = "cpu core (1000 cores)";
  record_costs(p, elsewhere, nullptr, "");
  s = prediction_scope(p, "p.json");
  EXPECT_FALSE(s.here) << s.why;
  EXPECT_THAT(s.why, HasSubstr("the cpu preset of another machine"));

  record_costs(p, cost::load_cluster("summit", 2), nullptr, "");
  s = prediction_scope(p, "p.json");
  EXPECT_FALSE(s.here) << s.why;
  EXPECT_EQ(s.why, "made for cluster summit: 2 x V100-16GB");

  Plan old = small_plan();  // no costs: the cluster spec decides, as before
  EXPECT_FALSE(prediction_scope(old, "p.json").here);
  old.cluster_spec = "cpu";
  EXPECT_TRUE(prediction_scope(old, "p.json").here);
}

}  // namespace
}  // namespace gp::plan
