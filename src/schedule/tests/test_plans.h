// Hand-built plans for schedule and simulator tests (stages listed in a topological order), and
// check_schedule's message as a string.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "schedule/schedule.h"
#include "support/error.h"

namespace gp::testing {

struct StageSpec {
  int micro_batch_size = 1;
  int devices = 1;              // data-parallel degree
  std::vector<int> outputs_to;  // successor stage ids (all greater than this stage's id)
  int in_flight = 0;            // 0: the in-flight rule, counted in samples
};

/// A plan with consecutive device ids, inputs_from derived from outputs_to, and in-flight counts
/// from the rule 1 + ceil(max over successors of in_flight x micro-batch / own micro-batch).
inline plan::Plan make_plan(int mini_batch, const std::vector<StageSpec>& specs) {
  plan::Plan p;
  p.planner = "manual";
  p.model_name = "test";
  p.mini_batch_size = mini_batch;
  int dev = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    plan::Stage st;
    st.id = static_cast<int>(i);
    st.ops = {"op" + std::to_string(i)};
    for (int d = 0; d < specs[i].devices; ++d) st.devices.push_back(dev++);
    st.micro_batch_size = specs[i].micro_batch_size;
    st.outputs_to = specs[i].outputs_to;
    std::sort(st.outputs_to.begin(), st.outputs_to.end());
    p.stages.push_back(st);
  }
  for (auto& st : p.stages)
    for (int v : st.outputs_to) p.stages[v].inputs_from.push_back(st.id);
  for (int i = static_cast<int>(specs.size()) - 1; i >= 0; --i) {
    auto& st = p.stages[i];
    int succ_samples = 0;
    for (int v : st.outputs_to)
      succ_samples = std::max(succ_samples, p.stages[v].in_flight * p.stages[v].micro_batch_size);
    int m = st.micro_batch_size;
    st.in_flight = specs[i].in_flight > 0 ? specs[i].in_flight : 1 + (succ_samples + m - 1) / m;
  }
  p.num_devices = dev;
  p.num_ops = static_cast<int>(specs.size());
  return p;
}

/// A chain of `n` stages with one micro-batch size and one device each.
inline plan::Plan make_chain(int n, int mini_batch, int mbs) {
  std::vector<StageSpec> specs(n);
  for (int i = 0; i < n; ++i) {
    specs[i].micro_batch_size = mbs;
    if (i + 1 < n) specs[i].outputs_to = {i + 1};
  }
  return make_plan(mini_batch, specs);
}

/// check_schedule's error message for `s` against `p`, or "(no error)".
inline std::string check_error(const schedule::Schedule& s, const plan::Plan& p) {
  try {
    schedule::check_schedule(s, p);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace gp::testing
