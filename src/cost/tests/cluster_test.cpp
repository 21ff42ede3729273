// Cluster presets, taking the first N devices, and graphpipe.cluster/1 files with strict errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "cost/cost_model.h"
#include "cost/tests/test_util.h"

using namespace gp;
using namespace gp::cost;
using namespace gp::cost::testing;
using ::testing::HasSubstr;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string parse_error(const Json& j) {
  return error_of([&] { cluster_from_json(j, "c.json"); });
}

}  // namespace

TEST(Cluster, PresetsUseDatasheetFigures) {
  Cluster s = load_cluster("summit");
  EXPECT_EQ(s.num_devices(), 4);  // one node by default
  EXPECT_EQ(s.device.name, "V100-16GB");
  EXPECT_EQ(s.device.peak_flops_f32, 15.7e12);
  EXPECT_EQ(s.device.peak_flops_f16, 125e12);
  EXPECT_EQ(s.device.mem_bandwidth_Bps, 900e9);
  EXPECT_EQ(s.intra.bandwidth_Bps, 50e9);
  EXPECT_EQ(s.node_injection_Bps, 25e9);
  EXPECT_FALSE(s.mixed_precision);

  Cluster a = load_cluster("dgx-a100");
  EXPECT_EQ(a.num_devices(), 8);
  EXPECT_EQ(a.device.peak_flops_f16, 312e12);
  EXPECT_EQ(a.device.mem_bandwidth_Bps, 2039e9);
  EXPECT_EQ(a.intra.bandwidth_Bps, 300e9);
  Cluster h = load_cluster("dgx-h100", 16);
  EXPECT_EQ(h.num_nodes, 2);
  EXPECT_EQ(h.device.peak_flops_f32, 67e12);
  EXPECT_EQ(h.device.peak_flops_f16, 989e12);
  EXPECT_EQ(h.inter.bandwidth_Bps, 50e9);
  Cluster h2 = load_cluster("h200");
  EXPECT_EQ(h2.num_devices(), 8);
  EXPECT_EQ(h2.device.memory_bytes, 141e9);
  EXPECT_EQ(h2.device.mem_bandwidth_Bps, 4800e9);
  EXPECT_EQ(h2.device.peak_flops_f32, 67e12);
  EXPECT_EQ(h2.device.peak_flops_f16, 989e12);
  EXPECT_EQ(h2.intra.bandwidth_Bps, 450e9);
  EXPECT_EQ(h2.inter.bandwidth_Bps, 50e9);
  EXPECT_EQ(h2.node_injection_Bps, 400e9);
  EXPECT_EQ(load_cluster("h200", 16).num_nodes, 2);
  EXPECT_EQ(cluster_preset_names().size(), 5u);
}

TEST(Cluster, FirstNDevicesFillWholeNodesFirst) {
  Cluster s = load_cluster("summit", 6);
  EXPECT_EQ(s.num_nodes, 2);
  EXPECT_EQ(s.num_devices(), 6);
  EXPECT_EQ(s.devices_on_node(0), 4);
  EXPECT_EQ(s.devices_on_node(1), 2);
  EXPECT_TRUE(s.same_node(0, 3));
  EXPECT_FALSE(s.same_node(3, 4));
  EXPECT_TRUE(s.same_node(4, 5));

  Cluster big = load_cluster("summit", 512);  // presets grow to any request
  EXPECT_EQ(big.num_nodes, 128);
  EXPECT_EQ(big.num_devices(), 512);

  Cluster two = load_cluster("dgx-a100", 2);
  EXPECT_EQ(two.num_nodes, 1);
  EXPECT_EQ(two.num_devices(), 2);
  EXPECT_EQ(two.devices_on_node(0), 2);
}

TEST(Cluster, CpuPresetIsThisMachine) {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Cluster c = load_cluster("cpu");
  EXPECT_EQ(c.num_nodes, 1);
  EXPECT_EQ(c.num_devices(), cores);
  EXPECT_GT(c.device.memory_bytes, 0);
  // More workers than cores share them: each gets a fraction of a core.
  Cluster over = load_cluster("cpu", 4 * cores);
  EXPECT_EQ(over.num_devices(), 4 * cores);
  EXPECT_DOUBLE_EQ(over.device.peak_flops_f32, c.device.peak_flops_f32 / 4);
  EXPECT_DOUBLE_EQ(over.device.memory_bytes, c.device.memory_bytes / 4);
  // The runtime's all-reduce on CPUs is Gloo's, and the cluster says so (GPU presets: NCCL's).
  EXPECT_TRUE(c.gloo_collectives);
  EXPECT_EQ(cluster_to_json(c)["collectives"], "gloo");
  EXPECT_FALSE(load_cluster("summit").gloo_collectives);
  EXPECT_FALSE(cluster_to_json(load_cluster("summit")).contains("collectives"));
}

TEST(Cluster, UnknownSpecsAndBadDeviceCountsAreUserErrors) {
  EXPECT_THAT(error_of([] { load_cluster("sumit"); }),
              HasSubstr("unknown cluster \"sumit\": expected one of summit, dgx-a100, dgx-h100, h200, cpu"));
  EXPECT_THAT(error_of([] { load_cluster("summit", -1); }), HasSubstr("--devices must be positive, got -1"));
  EXPECT_THAT(error_of([] { load_cluster("/nonexistent/c.json"); }),
              HasSubstr("/nonexistent/c.json: cannot open file"));
}

TEST(Cluster, JsonRoundTripAndFileDeviceSelection) {
  Cluster c = made_up_cluster();
  c.mixed_precision = true;
  c.device.memory_reserve_bytes = 1.5e8;
  std::string path = write_temp("gp_cluster_rt.json", cluster_to_json(c).dump(1));
  Cluster back = load_cluster(path);
  EXPECT_EQ(cluster_to_json(back), cluster_to_json(c));
  EXPECT_EQ(back.num_devices(), 8);

  Cluster five = load_cluster(path, 5);
  EXPECT_EQ(five.num_nodes, 2);
  EXPECT_EQ(five.num_devices(), 5);
  Json j5 = cluster_to_json(five);
  EXPECT_EQ(j5["num_devices"], 5);
  EXPECT_EQ(cluster_to_json(cluster_from_json(j5, "five.json")), j5);  // partial node survives

  EXPECT_THAT(error_of([&] { load_cluster(path, 9); }),
              HasSubstr(path + ": --devices 9 exceeds the cluster's 8 devices"));
  c.gloo_collectives = true;
  Json gloo = cluster_to_json(c);
  EXPECT_TRUE(cluster_from_json(gloo, "gloo.json").gloo_collectives);
  gloo["collectives"] = "mpi";
  EXPECT_THAT(error_of([&] { cluster_from_json(gloo, "gloo.json"); }),
              HasSubstr("gloo.json: collectives: expected \"nccl\" or \"gloo\", found \"mpi\""));
  std::remove(path.c_str());

  // Presets serialise too (with their partial last node).
  Json s6 = cluster_to_json(load_cluster("summit", 6));
  EXPECT_EQ(s6["format"], "graphpipe.cluster/1");
  EXPECT_EQ(s6["num_devices"], 6);
  EXPECT_EQ(s6["num_nodes"], 2);
}

TEST(Cluster, MalformedFilesNameTheFieldAndValue) {
  const Json good = cluster_to_json(made_up_cluster());
  EXPECT_EQ(parse_error(good), "");
  Json j = good;
  j["format"] = "graphpipe.model/1";
  EXPECT_THAT(parse_error(j), HasSubstr("c.json: format: format is \"graphpipe.model/1\", expected "
                                        "\"graphpipe.cluster/1\""));
  j = good;
  j["device"]["memory_bytes"] = -1;
  EXPECT_THAT(parse_error(j), HasSubstr("c.json: device.memory_bytes: must be a positive number, found -1"));
  j = good;
  j["device"].erase("peak_flops_f32");
  EXPECT_THAT(parse_error(j), HasSubstr("c.json: device: missing required field \"peak_flops_f32\""));
  j = good;
  j["device"]["memory_reserve_bytes"] = 2e9;  // the device has 1e9
  EXPECT_THAT(parse_error(j), HasSubstr("c.json: device.memory_reserve_bytes: must be below memory_bytes (1000000000), "
                                        "found 2000000000"));
  j = good;
  j["device"]["memory_reserve_bytes"] = -1;
  EXPECT_THAT(parse_error(j),
              HasSubstr("c.json: device.memory_reserve_bytes: must be a non-negative number, found -1"));
  j = good;
  j["num_nodes"] = 0;
  EXPECT_THAT(parse_error(j), HasSubstr("c.json: num_nodes: must be an integer in [1, 1000000], found 0"));
  j = good;
  j["devices_per_node"] = 2.5;
  EXPECT_THAT(parse_error(j), HasSubstr("devices_per_node: expected an integer, found 2.5"));
  j = good;
  j["num_devices"] = 3;
  EXPECT_THAT(parse_error(j), HasSubstr("num_devices: 3 devices do not fit 2 nodes of 4 (expected 5..8)"));
  j = good;
  j["inter"]["latency_s"] = "1us";
  EXPECT_THAT(parse_error(j), HasSubstr("c.json: inter.latency_s: expected a number, found \"1us\""));
  j = good;
  j.erase("inter");
  EXPECT_THAT(parse_error(j), HasSubstr("c.json: (top): missing required field \"inter\""));
  j = good;
  j["mixed_precision"] = "yes";
  EXPECT_THAT(parse_error(j), HasSubstr("mixed_precision: expected true or false, found \"yes\""));

  // One node may omit the inter-node link and the optional device fields.
  Json one = {{"format", "graphpipe.cluster/1"},
              {"name", "box"},
              {"num_nodes", 1},
              {"devices_per_node", 2},
              {"device", {{"name", "d"}, {"memory_bytes", 1e9}, {"peak_flops_f32", 1e12}, {"mem_bandwidth_Bps", 1e11}}},
              {"intra", {{"bandwidth_Bps", 1e10}, {"latency_s", 0}}}};
  Cluster box = cluster_from_json(one, "one.json");
  EXPECT_EQ(box.num_devices(), 2);
  EXPECT_EQ(box.device.peak_flops_f16, 1e12);
  EXPECT_EQ(box.inter.bandwidth_Bps, 1e10);
}
