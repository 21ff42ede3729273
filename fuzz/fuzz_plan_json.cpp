// libFuzzer target: graphpipe.plan/1 documents through plan::plan_from_json and validate_plan
// against a fixed 21-op model (fuzz/data/model_mmt_small.json); a plan that validates must give
// a 1F1B schedule the checker accepts and the simulator finishes. Anything else but a
// gp::UserError from the parser/validator is a bug.
#include "fuzz/fuzz_common.h"
#include "fuzz/fuzz_sim_costs.h"
#include "importers/model_json.h"
#include "plan/plan.h"
#include "schedule/schedule.h"

namespace {
const gp::ir::Graph& model_graph() {
  static const gp::ir::Graph g = gp::ir::Graph::build(
      gp::importers::read_model_json(gp::fuzz::data_file("model_mmt_small.json")));
  return g;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto doc = gp::fuzz::parse(data, size);
  if (!doc) return 0;
  gp::plan::Plan p;
  try {
    p = gp::plan::plan_from_json(*doc, "fuzz.json");
    gp::plan::Plan again = gp::plan::plan_from_json(gp::plan::plan_to_json(p), "again.json");
    (void)again;
    gp::plan::validate_plan(p, model_graph(), "fuzz.json");
  } catch (const gp::UserError&) {
    return 0;
  }
  // Valid from here on: nothing below may throw.
  (void)gp::plan::stage_of_ops(p, model_graph());
  (void)gp::plan::stage_topo_order(p);
  if (gp::fuzz::total_micro_batches(p) > 2048) return 0;
  for (const char* kind : {"1f1b", "gpipe"}) {
    gp::schedule::Schedule s = gp::schedule::build_schedule(p, kind);
    gp::schedule::check_schedule(s, p, "built");
    gp::fuzz::simulate_or_trap(p, s);
  }
  return 0;
}
