// The pass order of the zero-bubble (ZB-H1) schedule on a stage DAG: a deterministic list
// scheduler over one simulated replica per stage (schedule.h, build_schedule). Internal to
// gp_schedule: build_schedule turns the order into action lists with their transfers.
#pragma once
#include <vector>

#include "schedule/schedule.h"

namespace gp::schedule {

/// Per stage (index = stage id), its passes (forward, backward_input, backward_weight) in the order it runs them. UserError when the times do
/// not fit the plan or a stage cannot finish (its in_flight is below what its successors need).
std::vector<std::vector<Pass>> zero_bubble_order(const plan::Plan& p, const PassTimes& times);

}  // namespace gp::schedule
