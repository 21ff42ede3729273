// The optimizer a plan is costed and trained with (a plan stores it; the cost model prices its state
// and step). Kept apart from cost_model.h so plan.h can name it without the whole cost model.
#pragma once
#include <string>

namespace gp::cost {

enum class Optimizer { sgd, adam };
/// "sgd" or "adam"; anything else is a UserError naming the value.
Optimizer optimizer_from_string(const std::string& s);
const char* to_string(Optimizer o);

}  // namespace gp::cost
