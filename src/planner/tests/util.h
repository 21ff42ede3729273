// Test helpers: a made-up cluster with round numbers and small hand-built / random models.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "ir/model.h"
#include "planner/engine.h"

namespace gp::planner::test {

/// n devices, per_node per node, 10 GB each, 1 TFLOP/s, 100 GB/s memory, 100 GB/s intra,
/// 10 GB/s inter, no latency or launch overhead.
inline cost::Cluster round_cluster(int n, int per_node, double mem_bytes = 10e9) {
  cost::Cluster c;
  c.name = "round";
  c.devices_per_node = per_node;
  c.num_nodes = (n + per_node - 1) / per_node;
  c.devices = n;
  c.device.name = "R";
  c.device.memory_bytes = mem_bytes;
  c.device.peak_flops_f32 = 1e12;
  c.device.peak_flops_f16 = 1e12;
  c.device.mem_bandwidth_Bps = 100e9;
  c.intra = {100e9, 0};
  c.inter = {10e9, 0};
  return c;
}

/// x -> linear chain of `layers` linear+relu pairs -> loss (mse against y).
inline ir::Graph chain_model(int layers, int hidden = 1024) {
  ir::ModelBuilder b("chain");
  auto x = b.input("x", {hidden});
  auto y = b.input("y", {hidden});
  std::string h = x;
  for (int i = 0; i < layers; ++i) h = b.linear("l" + std::to_string(i), h, hidden);
  b.output(b.op("loss", ir::OpKind::mse_loss, {h, y}));
  return ir::Graph::build(b.build(), "chain");
}

/// x -> `branches` parallel chains of `layers` linears (branch i has hidden*(i+1)/... equal) ->
/// add -> loss.
inline ir::Graph branches_model(int branches, int layers, int hidden = 1024) {
  ir::ModelBuilder b("branches");
  auto x = b.input("x", {hidden});
  auto y = b.input("y", {hidden});
  std::vector<std::string> outs;
  for (int k = 0; k < branches; ++k) {
    std::string h = x;
    for (int i = 0; i < layers; ++i) h = b.linear("b" + std::to_string(k) + ".l" + std::to_string(i), h, hidden);
    outs.push_back(h);
  }
  auto sum = b.op("join", ir::OpKind::add, outs);
  b.output(b.op("loss", ir::OpKind::mse_loss, {sum, y}));
  return ir::Graph::build(b.build(), "branches");
}

/// Two searches offered the same plans in the same order: per stage the same ops, data-parallel
/// degree, micro-batch size and time per sample.
inline void expect_same_plans(const std::vector<std::vector<detail::StageChoice>>& a,
                              const std::vector<std::vector<detail::StageChoice>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t x = 0; x < a.size(); ++x) {
    ASSERT_EQ(a[x].size(), b[x].size());
    for (size_t k = 0; k < a[x].size(); ++k) {
      EXPECT_EQ(a[x][k].ops, b[x][k].ops);
      EXPECT_EQ(a[x][k].dp, b[x][k].dp);
      EXPECT_EQ(a[x][k].mbs, b[x][k].mbs);
      EXPECT_EQ(a[x][k].tps_s, b[x][k].tps_s);
    }
  }
}

}  // namespace gp::planner::test
