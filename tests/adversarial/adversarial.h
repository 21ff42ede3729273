// Generators for the adversarial tests: valid plans from the real planner over small random
// builtin models (multi-branch and sequential), optionally re-cut into smaller micro-batches.
#pragma once
#include <rapidcheck.h>

#include <memory>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "models/zoo.h"
#include "plan/plan.h"
#include "planner/planner.h"

namespace gp::adversarial {

/// Small models: multi-branch (mmt, candle-uno, dlrm, inception) and sequential (gpt).
inline const std::vector<std::string>& model_specs() {
  static const std::vector<std::string> specs = {
      "mmt:branches=2,layers=1,seq=8,hidden=16,heads=2,ffn=32",
      "mmt:branches=3,layers=2,seq=8,hidden=16,heads=2,ffn=32",
      "candle-uno:branches=3,layers=2,hidden=16",
      "dlrm:dense_branches=2,embedding_branches=2,layers=2,hidden=16,rows=64,dim=8,bag=4",
      "inception:blocks=2,channels=4,image=16,classes=10",
      "gpt:layers=3,seq=8,hidden=16,heads=2,ffn=32,vocab=64"};
  return specs;
}

struct Planned {
  std::shared_ptr<const ir::Graph> graph;
  plan::Plan plan;
};

/// Plans from run_planner (graphpipe and pipedream) for every model on 2, 3, 4, 6 and 8 summit
/// devices at mini-batch 48 or 64: computed once, shared by all properties (planning is the slow part).
inline const std::vector<Planned>& plan_pool() {
  static const std::vector<Planned> pool = [] {
    std::vector<Planned> out;
    for (const std::string& spec : model_specs()) {
      auto g = std::make_shared<const ir::Graph>(ir::Graph::build(models::build_builtin(spec)));
      for (int devices : {2, 3, 4, 6, 8})
        for (const char* name : {"graphpipe", "pipedream"}) {
          cost::CostModel cm(*g, cost::load_cluster("summit", devices));
          planner::PlannerOptions o;
          o.mini_batch = devices % 3 == 0 ? 48 : 64;
          o.planner = name;
          out.push_back({g, planner::run_planner(cm, o)});
        }
    }
    return out;
  }();
  return pool;
}

/// A plan the validator accepts: one of plan_pool(); with probability 1/2 every stage then takes a
/// random smaller micro-batch size (dividing the mini-batch, divisible by its replicas) and the
/// minimal in-flight counts.
inline Planned random_valid_plan() {
  Planned pl = *rc::gen::elementOf(plan_pool());
  plan::Plan& p = pl.plan;
  if (*rc::gen::arbitrary<bool>()) {
    for (plan::Stage& st : p.stages) {
      std::vector<int> ok;
      int d = static_cast<int>(st.devices.size());
      for (int m = d; m <= st.micro_batch_size; m += d)
        if (p.mini_batch_size % m == 0) ok.push_back(m);
      if (!ok.empty()) st.micro_batch_size = *rc::gen::elementOf(ok);
    }
    plan::assign_min_in_flight(p);
  }
  plan::validate_plan(p, *pl.graph, "generated");  // a generator bug fails the property here
  return pl;
}

}  // namespace gp::adversarial
