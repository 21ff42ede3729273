// Hand-computed timelines: chains, a diamond, data parallelism, skip edges, regrouping, link
// times and node-interface contention; memory, bubbles, traces and the SVG timeline.
#include <gtest/gtest.h>

#include <limits>

#include "schedule/tests/test_plans.h"
#include "schedule/trace.h"
#include "sim/sim.h"
#include "sim/tests/sim_helpers.h"

namespace gp::sim {
namespace {

using gp::testing::make_chain;
using gp::testing::make_plan;
using schedule::build_schedule;

TEST(Simulate, TwoStageChainTimeline) {
  // f = 1, b = 2 per micro-batch, free links, 4 micro-batches:
  // s0: F0[0,1] F1[1,2] B0[4,6] F2[6,7] B1[7,9] F3[9,10] B2[10,12] B3[13,15]
  // s1: F0[1,2] B0[2,4] F1[4,5] B1[5,7] F2[7,8] B2[8,10] F3[10,11] B3[11,13]
  plan::Plan p = make_chain(2, 4, 1);
  SimResult r = simulate(p, build_schedule(p), uniform_costs(p, 1, 2));
  EXPECT_DOUBLE_EQ(r.iteration_time_s, 15);
  EXPECT_DOUBLE_EQ(r.throughput_samples_per_s, 4.0 / 15);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 6.0 / 30);
  EXPECT_EQ(compute_slices(r, 0),
            "F0[0,1] F1[1,2] B0[4,6] F2[6,7] B1[7,9] F3[9,10] B2[10,12] "
            "B3[13,15] opt[15,15]");
  EXPECT_EQ(compute_slices(r, 1),
            "F0[1,2] B0[2,4] F1[4,5] B1[5,7] F2[7,8] B2[8,10] F3[10,11] "
            "B3[11,13] opt[13,13]");
}

TEST(Simulate, FourStageChainMatchesTheOneFOneBFormula) {
  // Uniform stages: iteration = (M + S - 1)(f + b), bubble = (S - 1)/(M + S - 1).
  const int S = 4, M = 8;
  plan::Plan p = make_chain(S, 8 * M, 8);
  for (const char* kind : {"1f1b", "gpipe"}) {
    SimResult r = simulate(p, build_schedule(p, kind), uniform_costs(p, 1, 2));
    EXPECT_DOUBLE_EQ(r.iteration_time_s, (M + S - 1) * 3.0) << kind;
    EXPECT_NEAR(r.bubble_fraction, (S - 1.0) / (M + S - 1), 1e-12) << kind;
  }
  SimResult r = simulate(p, build_schedule(p), uniform_costs(p, 1, 2, 100, 10));
  EXPECT_EQ(r.peak_in_flight, (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(r.peak_memory_bytes, (std::vector<double>{140, 130, 120, 110}));
  SimResult g = simulate(p, build_schedule(p, "gpipe"), uniform_costs(p, 1, 2, 100, 10));
  EXPECT_EQ(g.peak_memory_bytes, (std::vector<double>{180, 180, 180, 180}));
}

TEST(Simulate, DiamondIsFasterAndShallowerThanTheChain) {
  // 0 -> {1, 2} -> 3: the branches run concurrently, so the pipeline is 3 deep instead of 4.
  const int M = 8;
  plan::Plan diamond = make_plan(2 * M, {{2, 1, {1, 2}}, {2, 1, {3}}, {2, 1, {3}}, {2, 1, {}}});
  plan::Plan chain = make_chain(4, 2 * M, 2);
  SimResult d = simulate(diamond, build_schedule(diamond), uniform_costs(diamond, 1, 2));
  SimResult c = simulate(chain, build_schedule(chain), uniform_costs(chain, 1, 2));
  EXPECT_DOUBLE_EQ(d.iteration_time_s, (M + 3 - 1) * 3.0);
  EXPECT_DOUBLE_EQ(c.iteration_time_s, (M + 4 - 1) * 3.0);
  EXPECT_EQ(d.peak_in_flight, (std::vector<int>{3, 2, 2, 1}));
  EXPECT_EQ(c.peak_in_flight, (std::vector<int>{4, 3, 2, 1}));
}

TEST(Simulate, DataParallelStageAddsItsAllReduce) {
  // Stage 0 on devices 0 and 1 (each runs half of every micro-batch in f = 1, b = 2), stage 1
  // on device 2. Same pipeline as the 2-stage chain (15), then a 5 s all-reduce on stage 0.
  plan::Plan p = make_plan(8, {{2, 2, {1}}, {2, 1, {}}});
  SimCosts c = uniform_costs(p, 1, 2);
  c.stages[0].allreduce_s = 5;
  SimResult r = simulate(p, build_schedule(p), c);
  EXPECT_DOUBLE_EQ(r.iteration_time_s, 20);
  EXPECT_EQ(r.busy_s, (std::vector<double>{17, 17, 12}));
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 1 - 46.0 / 60);
  EXPECT_EQ(compute_slices(r, 1).substr(compute_slices(r, 1).rfind("B3")), "B3[13,15] allreduce[15,20] opt[20,20]");
}

TEST(Simulate, SkipEdgeBehavesLikeTheChainItSpans) {
  // 0 -> 1 -> 2 plus 0 -> 2: stage 2 waits for both inputs; uniform stages give the 3-chain time.
  plan::Plan p = make_plan(4, {{1, 1, {1, 2}}, {1, 1, {2}}, {1, 1, {}}});
  SimResult r = simulate(p, build_schedule(p), uniform_costs(p, 1, 2));
  EXPECT_DOUBLE_EQ(r.iteration_time_s, (4 + 3 - 1) * 3.0);
  EXPECT_EQ(r.peak_in_flight, (std::vector<int>{3, 2, 1}));
  // A slow skip link (3 s per transfer) delays stage 2's first forward to t = 1 + 3.
  SimCosts slow = uniform_costs(p, 1, 2);
  slow.stages[0].out_bytes_per_sample = {0, 3};  // edges 0->1 free, 0->2 3 bytes/sample at 1 B/s
  slow.cluster.intra.bandwidth_Bps = 1;
  SimResult s = simulate(p, build_schedule(p), slow);
  EXPECT_EQ(compute_slices(s, 2).substr(0, 7), "F0[4,5]");
}

TEST(Simulate, RegroupingAcrossMicroBatchSizes) {
  // Stage 0: micro-batches of 4 (f = 2, b = 4); stage 1: micro-batches of 2 (f = 1, b = 2).
  // s1 runs F0[2,3] B0[3,5] F1[5,6] B1[6,8] F2[8,9] B2[9,11] F3[11,12] B3[12,14]; s0's B0 needs
  // gradients of s1's mb0 and mb1 (ready at 8), B1 those of mb2 and mb3 (ready at 14).
  plan::Plan p = make_plan(8, {{4, 1, {1}}, {2, 1, {}}});
  SimCosts c = uniform_costs(p, 1, 2);
  c.stages[0].fwd_s = 2;
  c.stages[0].bwd_s = 4;
  SimResult r = simulate(p, build_schedule(p), c);
  EXPECT_EQ(compute_slices(r, 0), "F0[0,2] F1[2,4] B0[8,12] B1[14,18] opt[18,18]");
  EXPECT_EQ(compute_slices(r, 1),
            "F0[2,3] B0[3,5] F1[5,6] B1[6,8] F2[8,9] B2[9,11] F3[11,12] "
            "B3[12,14] opt[14,14]");
  EXPECT_DOUBLE_EQ(r.iteration_time_s, 18);
}

TEST(Simulate, TransfersTakeLinkTime) {
  // 1 byte/sample at 2 B/s: every transfer of one sample takes 0.5 s.
  plan::Plan p = make_chain(2, 2, 1);
  SimCosts c = uniform_costs(p, 1, 1);
  c.stages[0].out_bytes_per_sample = {1};
  c.cluster.intra.bandwidth_Bps = 2;
  SimResult r = simulate(p, build_schedule(p), c);
  EXPECT_EQ(compute_slices(r, 0), "F0[0,1] F1[1,2] B0[4,5] B1[6,7] opt[7,7]");
  EXPECT_EQ(compute_slices(r, 1), "F0[1.5,2.5] B0[2.5,3.5] F1[3.5,4.5] B1[4.5,5.5] opt[5.5,5.5]");
  EXPECT_EQ(send_slices(r, 0), "send_act ->s1 [0,1)[1,1.5] send_act ->s1 [1,2)[2,2.5]");
  EXPECT_DOUBLE_EQ(r.iteration_time_s, 7);
}

TEST(Simulate, MessagesHoldTheCoresAtBothEnds) {
  // As TransfersTakeLinkTime, and each message holds its sender 0.25 s (posting it) and its receiver
  // 0.125 s (taking it): s0 F0[0,1], posts act 0 [1,1.25] (on the link [1,1.5]), F1[1.25,2.25],
  // posts act 1 [2.25,2.5] (link [2.25,2.75]); s1 takes act 0 by 1.625, F0 B0 to 3.625, posts grad 0
  // [3.625,3.875] (link to 4.125), takes act 1 [3.875,4], F1 B1 to 6, posts grad 1 [6,6.25] (link
  // to 6.5); s0 takes grad 0 by 4.25, B0 to 5.25, takes grad 1 [6.5,6.625], B1 to 7.625.
  plan::Plan p = make_chain(2, 2, 1);
  SimCosts c = uniform_costs(p, 1, 1);
  c.stages[0].out_bytes_per_sample = {1};
  c.cluster.intra.bandwidth_Bps = 2;
  c.cluster.intra.cpu.send_s = 0.25;
  c.cluster.intra.cpu.recv_s = 0.125;
  SimResult r = simulate(p, build_schedule(p), c);
  EXPECT_EQ(compute_slices(r, 0), "F0[0,1] F1[1.25,2.25] B0[4.25,5.25] B1[6.625,7.625] opt[7.625,7.625]");
  EXPECT_EQ(compute_slices(r, 1), "F0[1.625,2.625] B0[2.625,3.625] F1[4,5] B1[5,6] opt[6.25,6.25]");
  EXPECT_EQ(send_slices(r, 0), "send_act ->s1 [0,1)[1,1.5] send_act ->s1 [1,2)[2.25,2.75]");
  EXPECT_DOUBLE_EQ(r.iteration_time_s, 7.625);
  // The holds are the devices' own work: s0 computes 4 s, posts 0.5 s and takes 0.25 s of 7.625.
  EXPECT_DOUBLE_EQ(r.busy_s[0], 4.75);
  // Per byte as well: 1 more second per message at each end, of 1 byte each.
  c.cluster.intra = {2, 0};
  c.cluster.intra.cpu.send_s_per_byte = 0.25;
  c.cluster.intra.cpu.recv_s_per_byte = 0.125;
  EXPECT_DOUBLE_EQ(simulate(p, build_schedule(p), c).iteration_time_s, 7.625);
}

TEST(Simulate, NodeInterfaceContention) {
  // Two independent 2-stage chains, sources on node 0 (devices 0, 1), sinks on node 1
  // (devices 2, 3). Inter-node links carry 1 B/s, a transfer is 1 byte. With a node interface
  // of 1 B/s both chains share it: the second activation lands at 3 instead of 2, and the
  // gradients leave node 1 one after the other.
  plan::Plan p = make_plan(1, {{1, 1, {2}}, {1, 1, {3}}, {1, 1, {}}, {1, 1, {}}});
  SimCosts c = uniform_costs(p, 1, 1);
  c.cluster.devices_per_node = 2;
  c.cluster.inter = {1, 0};
  c.stages[0].out_bytes_per_sample = {1};
  c.stages[1].out_bytes_per_sample = {1};
  SimResult free_nic = simulate(p, build_schedule(p), c);
  EXPECT_DOUBLE_EQ(free_nic.iteration_time_s, 6);
  c.cluster.node_injection_Bps = 1;
  SimResult shared = simulate(p, build_schedule(p), c);
  EXPECT_EQ(compute_slices(shared, 2), "F0[2,3] B0[3,4] opt[4,4]");
  EXPECT_EQ(compute_slices(shared, 3), "F0[3,4] B0[4,5] opt[5,5]");
  EXPECT_EQ(compute_slices(shared, 1), "F0[0,1] B0[6,7] opt[7,7]");
  EXPECT_DOUBLE_EQ(shared.iteration_time_s, 7);
  c.cluster.node_injection_Bps = 2;  // twice the link: no visible contention
  EXPECT_DOUBLE_EQ(simulate(p, build_schedule(p), c).iteration_time_s, 6);
}

TEST(Simulate, DataParallelReplicasExchangeTheirShares) {
  // Stage 0 on 2 devices sends each replica's half of a micro-batch (1 sample, 1 s at 1 B/s) to
  // the single device of stage 1, both at once; stage 1 sends each replica its half of the
  // gradient, one after the other from its port.
  plan::Plan p = make_plan(2, {{2, 2, {1}}, {2, 1, {}}});
  SimCosts c = uniform_costs(p, 1, 1);
  c.stages[0].out_bytes_per_sample = {1};
  c.cluster.intra.bandwidth_Bps = 1;
  SimResult r = simulate(p, build_schedule(p), c);
  EXPECT_EQ(send_slices(r, 0), "send_act ->s1 [0,2)[1,2]");
  EXPECT_EQ(send_slices(r, 1), "send_act ->s1 [0,2)[1,2]");
  EXPECT_EQ(send_slices(r, 2), "send_grad ->s0 [0,2)[4,6]");
  EXPECT_EQ(compute_slices(r, 2), "F0[2,3] B0[3,4] opt[4,4]");
  EXPECT_EQ(compute_slices(r, 0), "F0[0,1] B0[5,6] allreduce[7,7] opt[7,7]");
  EXPECT_EQ(compute_slices(r, 1), "F0[0,1] B0[6,7] allreduce[7,7] opt[7,7]");
  EXPECT_DOUBLE_EQ(r.iteration_time_s, 7);
}

TEST(Simulate, WithoutEventsTheFiguresAreTheSame) {
  // The planner ranks plans by iteration time only: recording no events changes no figure.
  plan::Plan p = make_plan(2, {{2, 2, {1}}, {2, 1, {}}});
  SimCosts c = uniform_costs(p, 1, 1);
  c.stages[0].out_bytes_per_sample = {1};
  c.cluster.intra.bandwidth_Bps = 1;
  const SimResult with = simulate(p, build_schedule(p), c);
  const SimResult without = simulate(p, build_schedule(p), c, {.events = false});
  EXPECT_FALSE(with.events.empty());
  EXPECT_TRUE(without.events.empty());
  EXPECT_EQ(without.iteration_time_s, with.iteration_time_s);
  EXPECT_EQ(without.busy_s, with.busy_s);
  EXPECT_EQ(without.peak_memory_bytes, with.peak_memory_bytes);
  EXPECT_EQ(without.peak_in_flight, with.peak_in_flight);
  EXPECT_EQ(without.bubble_fraction, with.bubble_fraction);
}

TEST(Simulate, RejectsBrokenSchedules) {
  plan::Plan p = make_chain(2, 4, 1);
  schedule::Schedule s = build_schedule(p);
  std::swap(s.stages[0].actions[0], s.stages[0].actions[2]);
  EXPECT_THROW(simulate(p, s, uniform_costs(p, 1, 2)), UserError);
}

TEST(Trace, OneSlicePerActionPerDevice) {
  plan::Plan p = make_plan(8, {{2, 2, {1, 2}}, {2, 1, {2}}, {2, 1, {}}});
  schedule::Schedule s = build_schedule(p);
  SimResult r = simulate(p, s, uniform_costs(p, 1, 2));
  Json t = Json::parse(chrome_trace(p, r).dump());  // valid JSON text
  size_t expected = 0;
  for (const plan::Stage& st : p.stages) expected += s.stages[st.id].actions.size() * st.devices.size();
  size_t slices = 0, names = 0;
  for (const Json& e : t["traceEvents"]) {
    if (e["ph"] == "X") {
      ++slices;
      EXPECT_GE(e["dur"].get<double>(), 0);
    }
    if (e["ph"] == "M" && e["name"] == "process_name") ++names;
  }
  EXPECT_EQ(slices, expected);
  EXPECT_EQ(names, 4u);
  bool found = false;
  for (const Json& e : t["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "s1 F mb3") found = e["pid"] == 2 && e["cat"] == "forward";
  EXPECT_TRUE(found);
}

// The one trace writer (schedule/trace.h): track names, sort index and format for every trace.
TEST(Trace, WriterNamesTracksAndFormat) {
  schedule::TraceWriter w;
  w.add_device(3, -1);
  w.add_slice(3, schedule::kSendTrack, "s0 send_act ->s1 [0,4)", "", 0.5, 0.75, {{"stage", 0}});
  w.add_counter(3, "tensor memory (MB)", 1.0, {{"live", 2.5}});
  Json t = std::move(w).finish({{"source", "test"}});
  EXPECT_EQ(t["otherData"], (Json{{"format", "graphpipe.trace/1"}, {"source", "test"}}));
  const Json& ev = t["traceEvents"];
  ASSERT_EQ(ev.size(), 6u);
  EXPECT_EQ(ev[0]["args"]["name"], "device 3");
  EXPECT_EQ(ev[1]["args"]["sort_index"], 3);
  EXPECT_EQ(ev[2]["args"]["name"], "compute");
  EXPECT_EQ(ev[3]["tid"], 1);
  EXPECT_EQ(ev[3]["args"]["name"], "send");
  EXPECT_EQ(ev[4], (Json{{"ph", "X"},
                         {"name", "s0 send_act ->s1 [0,4)"},
                         {"pid", 3},
                         {"tid", 1},
                         {"ts", 5e5},
                         {"dur", 2.5e5},
                         {"args", {{"stage", 0}}}}));  // no "cat"
  EXPECT_EQ(ev[5]["ph"], "C");
  EXPECT_EQ(ev[5]["ts"], 1e6);
  // The simulator's trace is written through it.
  plan::Plan p = make_chain(2, 4, 1);
  Json sim = chrome_trace(p, simulate(p, build_schedule(p), uniform_costs(p, 1, 2)));
  EXPECT_EQ(sim["otherData"]["format"], "graphpipe.trace/1");
  EXPECT_EQ(sim["otherData"]["source"], "simulator");
  EXPECT_EQ(sim["traceEvents"][3]["args"]["name"], "send");
}

TEST(Svg, DrawsEveryComputeSliceAndALegend) {
  plan::Plan p = make_chain(2, 4, 1);
  SimResult r = simulate(p, build_schedule(p), uniform_costs(p, 1, 2));
  std::string svg = svg_timeline(p, r, "test");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("s1 F / B"), std::string::npos);
  EXPECT_NE(svg.find("<title>s1 B mb3 [11, 13] s</title>"), std::string::npos);
  EXPECT_EQ(svg.find("@HEIGHT@"), std::string::npos);
}

TEST(SimJson, ContractFields) {
  plan::Plan p = make_chain(2, 4, 1);
  Json j = sim_result_to_json(simulate(p, build_schedule(p), uniform_costs(p, 1, 2)));
  EXPECT_EQ(j["format"], "graphpipe.sim/1");
  EXPECT_DOUBLE_EQ(j["iteration_time_s"].get<double>(), 15);
  EXPECT_DOUBLE_EQ(j["throughput_samples_per_s"].get<double>(), 4.0 / 15);
  EXPECT_EQ(j["peak_memory_bytes"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["bubble_fraction"].get<double>(), 0.2);
}

}  // namespace
}  // namespace gp::sim
