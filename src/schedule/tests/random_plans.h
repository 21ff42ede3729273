// Random stage DAGs for property tests (rapidcheck): skip edges, diamonds, mixed micro-batch sizes.
#pragma once
#include <rapidcheck.h>

#include "schedule/tests/test_plans.h"

namespace gp::testing {

/// A random plan: 1-7 stages in topological order, each edge i->j (i<j) present with prob. 1/3
/// plus a chain edge i->i+1 with prob. 2/3; micro-batch sizes in {1,2,4,8}; 1 or 2 devices.
inline plan::Plan random_plan() {
  int n = *rc::gen::inRange(1, 8);
  int mini_batch = *rc::gen::element(8, 16, 32);
  std::vector<StageSpec> specs(n);
  for (int i = 0; i < n; ++i) {
    specs[i].micro_batch_size = *rc::gen::element(1, 2, 4, 8);
    specs[i].devices = specs[i].micro_batch_size >= 2 ? *rc::gen::inRange(1, 3) : 1;
    for (int j = i + 1; j < n; ++j) {
      bool edge = j == i + 1 ? *rc::gen::inRange(0, 3) != 0 : *rc::gen::inRange(0, 3) == 0;
      if (edge) specs[i].outputs_to.push_back(j);
    }
  }
  return make_plan(mini_batch, specs);
}

}  // namespace gp::testing
