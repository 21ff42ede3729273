// libFuzzer target: graphpipe.schedule/1 documents through schedule::schedule_from_json and
// check_schedule against a fixed 6-device plan with data parallelism and mixed micro-batch sizes
// (fuzz/data/plan_mixed.json); a schedule the checker accepts must simulate to completion.
// Anything else but a gp::UserError from the parser/checker is a bug.
#include "fuzz/fuzz_common.h"
#include "fuzz/fuzz_sim_costs.h"
#include "plan/plan.h"
#include "schedule/schedule.h"

namespace {
const gp::plan::Plan& fixed_plan() {
  static const gp::plan::Plan p = gp::plan::load_plan(gp::fuzz::data_file("plan_mixed.json"));
  return p;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto doc = gp::fuzz::parse(data, size);
  if (!doc) return 0;
  gp::schedule::Schedule s;
  try {
    s = gp::schedule::schedule_from_json(*doc, "fuzz.json");
    gp::schedule::Schedule again = gp::schedule::schedule_from_json(gp::schedule::schedule_to_json(s), "again.json");
    if (!(again == s)) __builtin_trap();
    gp::schedule::check_schedule(s, fixed_plan(), "fuzz.json");
  } catch (const gp::UserError&) {
    return 0;
  }
  (void)gp::schedule::peak_in_flight(s);
  gp::fuzz::simulate_or_trap(fixed_plan(), s);
  return 0;
}
