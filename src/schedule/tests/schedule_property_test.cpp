// Property tests on random stage DAGs: built schedules pass the checker, hold no more micro-batches
// than the plan's in-flight counts, round-trip through JSON; mutated schedules fail cleanly.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "schedule/schedule.h"
#include "schedule/tests/random_plans.h"

namespace gp::schedule {
namespace {

RC_GTEST_PROP(ScheduleProperty, BuiltSchedulesPassAndRespectInFlight, ()) {
  plan::Plan p = gp::testing::random_plan();
  Schedule s = build_schedule(p, "1f1b");  // runs check_schedule; throws on failure
  std::vector<int> peak = peak_in_flight(s);
  for (size_t i = 0; i < p.stages.size(); ++i) {
    int n = p.mini_batch_size / p.stages[i].micro_batch_size;
    RC_ASSERT(peak[i] <= p.stages[i].in_flight);
    RC_ASSERT(peak[i] == std::min(p.stages[i].in_flight, n));
  }
  Schedule g = build_schedule(p, "gpipe");
  std::vector<int> gpeak = peak_in_flight(g);
  for (size_t i = 0; i < p.stages.size(); ++i) RC_ASSERT(gpeak[i] == p.mini_batch_size / p.stages[i].micro_batch_size);
  RC_ASSERT(schedule_from_json(schedule_to_json(s), "s.json") == s);
}

RC_GTEST_PROP(ScheduleProperty, SwappedActionsPassOrFailWithAMessage, ()) {
  plan::Plan p = gp::testing::random_plan();
  Schedule s = build_schedule(p, *rc::gen::element(std::string("1f1b"), std::string("gpipe")));
  int st = *rc::gen::inRange(0, static_cast<int>(s.stages.size()));
  auto& a = s.stages[st].actions;
  size_t i = *rc::gen::inRange<size_t>(0, a.size());
  size_t j = *rc::gen::inRange<size_t>(0, a.size());
  std::swap(a[i], a[j]);
  try {
    check_schedule(s, p);
  } catch (const UserError& e) {
    RC_ASSERT(std::string(e.what()).rfind("schedule: ", 0) == 0);
  }
}

}  // namespace
}  // namespace gp::schedule
