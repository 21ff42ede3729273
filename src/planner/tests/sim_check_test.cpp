// The planner's iteration-time estimate ((M - 1) x slowest stage + critical path, used to pick the
// micro-batch size) against the discrete-event simulator on the planners' own plans.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "cost/cost_model.h"
#include "importers/resolve.h"
#include "planner/planner.h"
#include "schedule/schedule.h"
#include "sim/sim.h"

namespace gp::planner {
namespace {

struct Case {
  const char* spec;
  int devices;
};

// Tolerance: the simulated iteration lies within [0.95, 1.05] x the prediction (measured
// 1.000-1.003 on the presets, up to 1.022 at weak scaling). The estimate runs the simulator's 1F1B
// schedule as a per-stage recurrence (timeline.h); what it leaves out is the contention of
// transfers for a node's network interface. (With the analytic estimate before it: 0.80-1.02.)
constexpr double kLo = 0.95, kHi = 1.05;

double simulated_s(const plan::Plan& p, const cost::CostModel& cm) {
  return sim::simulate(p, schedule::build_schedule(p), cm).iteration_time_s;
}

TEST(SimCheck, PredictedIterationTimeMatchesTheSimulator) {
  for (Case c : {Case{"mmt:branches=2,layers=2,seq=32,hidden=128,heads=4,ffn=256", 4},
                 Case{"mmt:branches=4,layers=2,seq=64,hidden=256,heads=4,ffn=512", 8},
                 Case{"dlrm:dense_branches=2,embedding_branches=4,layers=2,hidden=256,rows=1000", 8},
                 Case{"candle-uno:branches=3,layers=2,hidden=256", 4}}) {
    ir::Graph g = importers::load_graph(c.spec);
    cost::CostModel cm(g, cost::load_cluster("summit", c.devices));
    for (std::string name : planner_names()) {
      PlannerOptions o;
      o.mini_batch = 64;
      o.planner = name;
      o.time_limit_s = 20;
      plan::Plan p = run_planner(cm, o);
      double simulated = simulated_s(p, cm);
      double ratio = simulated / p.predicted.iteration_time_s;
      EXPECT_GE(ratio, kLo) << c.spec << " " << name << " on " << c.devices;
      EXPECT_LE(ratio, kHi) << c.spec << " " << name << " on " << c.devices;
      RecordProperty(std::string(c.spec).substr(0, 4) + "_" + name + "_" + std::to_string(c.devices),
                     std::to_string(ratio));
      std::printf("%-70s %-9s %2d devices: predicted %.3f ms, simulated %.3f ms (x%.3f)\n", c.spec, name.c_str(),
                  c.devices, p.predicted.iteration_time_s * 1e3, simulated * 1e3, ratio);
    }
  }
}

// With messages that hold the cores at both ends (LinkSpec::cpu: the calibrated
// cpu preset with a worker on every core), the estimate charges them as the simulator does.
TEST(SimCheck, MessageCpuTimesAgreeWithTheSimulator) {
  ir::Graph g = importers::load_graph("mmt:branches=4,layers=1,seq=16,hidden=64,heads=4,ffn=128");
  cost::Cluster cl = cost::load_cluster("cpu", 2);  // the fixed figures here (no calibration)
  cl.intra.cpu.send_s = 50e-6;
  cl.intra.cpu.send_s_per_byte = 0.1e-9;
  cl.intra.cpu.recv_s = 80e-6;
  cl.intra.cpu.recv_s_per_byte = 0.3e-9;
  cost::CostModel cm(g, cl), free_cm(g, cost::load_cluster("cpu", 2));
  for (std::string name : {"graphpipe", "pipedream"}) {
    PlannerOptions o;
    o.mini_batch = 32;
    o.micro_batch = 2;  // small messages, many of them: a 2-stage pipeline
    o.planner = name;
    o.time_limit_s = 20;
    plan::Plan p = run_planner(cm, o);
    ASSERT_GT(p.stages.size(), 1u) << name;
    const double simulated = simulated_s(p, cm), ratio = simulated / p.predicted.iteration_time_s;
    EXPECT_GE(ratio, kLo) << name;
    EXPECT_LE(ratio, kHi) << name;
    // And they cost the plan time: the same plan simulated without them is faster.
    EXPECT_LT(simulated_s(p, free_cm), simulated) << name;
  }
}

// With a fixed time per stage pass (DeviceSpec::pass_fwd_s: the calibrated cpu preset), every
// planner's estimate charges it per stage and micro-batch as the simulator does, and a plan pays it
// once per micro-batch of its bottleneck stage at least.
TEST(SimCheck, StagePassTimesAgreeWithTheSimulator) {
  ir::Graph g = importers::load_graph("mmt:branches=4,layers=1,seq=16,hidden=64,heads=4,ffn=128");
  cost::Cluster cl = cost::load_cluster("cpu", 2);
  cl.device.pass_fwd_s = 120e-6;
  cl.device.pass_bwd_s = 180e-6;
  cost::CostModel cm(g, cl), free_cm(g, cost::load_cluster("cpu", 2));
  for (std::string name : {"graphpipe", "pipedream", "piper"}) {
    for (int mb : {2, 8}) {
      PlannerOptions o;
      o.mini_batch = 32;
      o.micro_batch = mb;
      o.planner = name;
      o.time_limit_s = 20;
      const plan::Plan p = run_planner(cm, o);
      const double simulated = simulated_s(p, cm), ratio = simulated / p.predicted.iteration_time_s;
      EXPECT_GE(ratio, kLo) << name << " mb " << mb;
      EXPECT_LE(ratio, kHi) << name << " mb " << mb;
      // Each stage pays the passes of each of its micro-batches: at least the bottleneck's 32 / mb.
      EXPECT_GE(simulated - simulated_s(p, free_cm), 32 / mb * 300e-6 * (1 - 1e-9)) << name << " mb " << mb;
    }
  }
}

// The paper's models at their preset sizes (summit, mini-batch 128, 4-32 devices): the simulated
// iteration is within [kLo, kHi] x the prediction for GraphPipe's and PipeDream's plans (and
// Piper's at a short time limit), and for GraphPipe's best plan of each kind (sp, chain), which
// the planner ranks by the estimate. Before the estimate included the optimizer step, dlrm on 8
// devices was predicted at 15.2 ms and simulated at 28.7 ms; before it ran the 1F1B recurrence
// (timeline.h), dlrm's chain candidate on 8 devices simulated at 0.800 of its prediction.
void expect_agrees(const plan::Plan& p, const cost::CostModel& cm, const std::string& what) {
  const double ratio = simulated_s(p, cm) / p.predicted.iteration_time_s;
  EXPECT_GE(ratio, kLo) << what;
  EXPECT_LE(ratio, kHi) << what;
  std::printf("%-34s predicted %9.3f ms, simulated x%.3f\n", what.c_str(), p.predicted.iteration_time_s * 1e3, ratio);
}

void expect_preset_agrees(const char* model, const std::vector<std::string>& planners) {
  ir::Graph g = importers::load_graph(model);
  for (int n : {4, 8, 16, 32}) {
    cost::CostModel cm(g, cost::load_cluster("summit", n));
    for (const std::string& name : planners) {
      PlannerOptions o;
      o.mini_batch = 128;
      o.planner = name;
      o.time_limit_s = 2;
      const PlanReport rep = run_planner_report(cm, o);
      const std::string what = fmt::format("{} {} {} devices", model, name, n);
      expect_agrees(rep.plan, cm, what);
      ASSERT_EQ(rep.candidate_plans.size(), rep.plan.search.candidates.size());
      for (size_t c = 0; c < rep.candidate_plans.size(); ++c)
        expect_agrees(rep.candidate_plans[c], cm, what + " " + rep.plan.search.candidates[c].name);
    }
  }
}

// The ranking the planner prints is the simulator's: on the paper presets (8 and 32 summit devices,
// mmt at 8 only, mini-batch 128) each candidate's recorded simulated iteration is sim::simulate's for that plan,
// the returned plan is the winner's, and the winner simulates no slower than the other kind's best
// (SP wins ties within the search's 0.1% tolerance). Before, the planner ranked by the estimate
// alone: dlrm on 32 devices returned a per-stage-size plan predicted 0.8% faster than the one-size
// plan that simulated 4.4% faster (docs/results-history.md, "Per-stage micro-batch sizes").
TEST(SimCheck, PrintedRankingIsTheSimulators) {
  for (const char* model : {"dlrm", "candle-uno", "mmt"}) {
    ir::Graph g = importers::load_graph(model);
    for (int n : {8, 32}) {
      if (std::string(model) == "mmt" && n == 32) continue;  // 2 s of search; the same code path as at 8
      cost::CostModel cm(g, cost::load_cluster("summit", n));
      PlannerOptions o;
      o.mini_batch = 128;
      const PlanReport rep = run_planner_report(cm, o);
      const auto& cands = rep.plan.search.candidates;
      ASSERT_EQ(rep.candidate_plans.size(), cands.size());
      double winner = 0, other = 1e300;
      for (size_t c = 0; c < cands.size(); ++c) {
        const double sim = simulated_s(rep.candidate_plans[c], cm);
        EXPECT_NEAR(cands[c].simulated_iteration_time_s, sim, 1e-9 * sim) << model << " " << n << " " << cands[c].name;
        (cands[c].name == rep.plan.search.winner ? winner : other) = sim;
      }
      EXPECT_NEAR(simulated_s(rep.plan, cm), winner, 1e-9 * winner) << model << " " << n;
      EXPECT_LE(winner, other * (rep.plan.search.winner == "sp" ? 1.001 : 1.0)) << model << " " << n;
    }
  }
}

// Per-stage micro-batch sizes: on candle-uno at 8 summit devices (mini-batch 128) GraphPipe's plan
// mixes sizes (towers at 32, the head stage at 64); it validates, its 1F1B schedule passes the
// deadlock checker, the simulator agrees with its prediction within 10%, and it is simulated
// faster than the best plan with one size for every stage (--micro-batch 16, 32, 64, 128).
TEST(SimCheck, PerStageSizes) {
  ir::Graph g = importers::load_graph("candle-uno");
  cost::CostModel cm(g, cost::load_cluster("summit", 8));
  PlannerOptions o;
  o.mini_batch = 128;
  const plan::Plan p = run_planner(cm, o);
  plan::validate_plan(p, g, "per-stage sizes");
  std::set<int> sizes;
  for (const auto& s : p.stages) sizes.insert(s.micro_batch_size);
  EXPECT_GE(sizes.size(), 2u) << plan::plan_to_json(p).dump();
  const schedule::Schedule sched = schedule::build_schedule(p);
  EXPECT_NO_THROW(schedule::check_schedule(sched, p));
  const double mixed = simulated_s(p, cm);
  EXPECT_NEAR(mixed / p.predicted.iteration_time_s, 1.0, 0.1);
  double uniform = 1e300;
  for (int mb : {16, 32, 64, 128}) {
    o.micro_batch = mb;
    uniform = std::min(uniform, simulated_s(run_planner(cm, o), cm));
  }
  std::printf("candle-uno, 8 devices: per-stage sizes simulated %.3f ms, best one-size plan %.3f ms\n", mixed * 1e3,
              uniform * 1e3);
  EXPECT_LT(mixed, uniform);
}

// The simulated per-device peak memory is the planner's (cost::stage_memory at the held count), on
// pipelined plans and on candle-uno's data-parallel plan at the memory limit (8 devices, mini-batch
// 65,536, one stage of 8 replicas), whose all-reduce / optimizer temporaries are larger than a
// micro-batch's transient buffers: the simulator used to add them to the held activations although
// the step runs once they are freed (16.58 GB there, over the device's usable 15.25 GB, against the
// planner's 15.17 GB).
TEST(SimCheck, SimulatedPeakMemoryIsThePlannersPrediction) {
  struct MemCase {
    const char* model;
    int devices, mini_batch;
  };
  for (MemCase c : {MemCase{"candle-uno", 8, 65536}, MemCase{"mmt", 8, 128}, MemCase{"dlrm", 8, 128}}) {
    ir::Graph g = importers::load_graph(c.model);
    cost::CostModel cm(g, cost::load_cluster("summit", c.devices));
    PlannerOptions o;
    o.mini_batch = c.mini_batch;
    const plan::Plan p = run_planner(cm, o);
    const sim::SimCosts sc = sim::sim_costs(p, cm);
    const sim::SimResult r = sim::simulate(p, schedule::build_schedule(p), sc, {.events = false});
    bool step_dominates = false;
    for (const plan::Stage& st : p.stages) {
      const sim::StageTimes& t = sc.stages[st.id];
      step_dominates = step_dominates || t.step_bytes > t.other_bytes;
      for (int d : st.devices)
        EXPECT_NEAR(r.peak_memory_bytes[d], p.predicted.peak_memory_bytes[d], 1e-9 * p.predicted.peak_memory_bytes[d])
            << c.model << " B=" << c.mini_batch << " stage " << st.id;
    }
    if (c.mini_batch == 65536) {
      EXPECT_TRUE(step_dominates) << "the case no longer covers the step's temporaries";
    }
  }
}

TEST(SimCheck, PresetDlrmPredictionWithinFivePercent) {
  expect_preset_agrees("dlrm", {"graphpipe", "pipedream", "piper"});
}
TEST(SimCheck, PresetCandleUnoPredictionWithinFivePercent) {
  expect_preset_agrees("candle-uno", {"graphpipe", "pipedream", "piper"});
}
TEST(SimCheck, PresetMmtPredictionWithinFivePercent) { expect_preset_agrees("mmt", {"graphpipe", "pipedream"}); }

// Weak scaling at 32 devices (mini-batch 32 x devices, as `make paper` runs it): the simulated
// iteration of each planner's chosen plan, and of its plans at a fixed micro-batch of 256 and 512,
// is within [kLo, kHi] x the prediction. The estimate used to place a non-source stage's last
// backward at the sources' end minus the backwards between them: GraphPipe's dlrm plan here (7
// one-device sources, an 8-device sink at micro-batch 512) simulated at 0.825x its prediction, the
// fixed sizes at 0.855-0.868x (docs/results-history.md, issue 22); the 1F1B recurrence runs the schedule.
TEST(SimCheck, WeakScalingThirtyTwoDevicesPredictionWithinFivePercent) {
  for (const char* model : {"dlrm", "candle-uno"}) {
    ir::Graph g = importers::load_graph(model);
    cost::CostModel cm(g, cost::load_cluster("summit", 32));
    for (const std::string name : {"graphpipe", "pipedream"}) {
      for (int micro : {0, 256, 512}) {
        PlannerOptions o;
        o.mini_batch = 32 * 32;
        o.micro_batch = micro;
        o.planner = name;
        const plan::Plan p = run_planner(cm, o);
        expect_agrees(p, cm,
                      fmt::format("{} {} B=1024 micro-batch {}", model, name, p.stages.front().micro_batch_size));
      }
    }
  }
}

// Past 1,024 micro-batches the estimate extrapolates two shorter runs of the recurrence (1F1B's
// periodic steady state): at 2,048 micro-batches (mini-batch 8,192 at micro-batch 4, 8 devices)
// it still agrees with the simulator run in full.
TEST(SimCheck, LongPipelinesExtrapolatedWithinFivePercent) {
  for (const char* model : {"dlrm", "candle-uno"}) {
    ir::Graph g = importers::load_graph(model);
    cost::CostModel cm(g, cost::load_cluster("summit", 8));
    for (const std::string name : {"graphpipe", "pipedream"}) {
      PlannerOptions o;
      o.mini_batch = 8192;
      o.micro_batch = 4;
      o.planner = name;
      expect_agrees(run_planner(cm, o), cm, fmt::format("{} {} B=8192 micro-batch 4", model, name));
    }
  }
}

// The micro-batch size picked by predicted iteration time is (nearly) the simulator's best: its
// simulated iteration is within 10% of the fastest simulated plan over all sizes.
TEST(SimCheck, ChosenMicroBatchIsNearTheSimulatedBest) {
  for (const char* spec :
       {"mmt:branches=4,layers=2,seq=64,hidden=256,heads=4,ffn=512", "candle-uno:branches=3,layers=2,hidden=256"}) {
    ir::Graph g = importers::load_graph(spec);
    cost::CostModel cm(g, cost::load_cluster("summit", 8));
    for (std::string name : {"graphpipe", "pipedream"}) {
      PlannerOptions o;
      o.mini_batch = 64;
      o.planner = name;
      const double chosen = simulated_s(run_planner(cm, o), cm);
      double best = 1e300;
      int best_m = 0;
      for (int m = 1; m <= 64; m *= 2) {
        o.micro_batch = m;
        double t = simulated_s(run_planner(cm, o), cm);
        if (t < best) best = t, best_m = m;
      }
      EXPECT_LE(chosen, best * 1.10) << spec << " " << name << ": simulated best at micro-batch " << best_m;
    }
  }
}

}  // namespace
}  // namespace gp::planner
