// Internal: assemble() for a given schedule (engine.h's assemble() is this for "1f1b").
#pragma once
#include <string>
#include <vector>

#include "planner/engine.h"

namespace gp::planner::detail {

/// assemble() for plans that run under `schedule` (1f1b | gpipe | zb): the plan records it, its
/// prediction times that schedule's passes (timeline.h), its memory holds what the schedule keeps
/// in flight (GPipe: every micro-batch), and for zb every stage records its pass times (fwd_s,
/// bwd_input_s, bwd_weight_s: one replica, one micro-batch) from which its schedule is built.
plan::Plan assemble_for(const cost::CostModel& cm, const std::vector<StageChoice>& choices, int mbs, int mini_batch,
                        double memory_limit, Order order, const std::string& schedule,
                        std::vector<std::string>* explain);

}  // namespace gp::planner::detail
