// graphpipe.sim/1 results and Chrome trace-event JSON (the format the runtime's traces share).
#include <set>

#include "sim/sim.h"

namespace gp::sim {

Json sim_result_to_json(const SimResult& r) {
  return {{"format", "graphpipe.sim/1"},
          {"iteration_time_s", r.iteration_time_s},
          {"throughput_samples_per_s", r.throughput_samples_per_s},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"bubble_fraction", r.bubble_fraction},
          {"busy_s", r.busy_s},
          {"peak_in_flight", r.peak_in_flight}};
}

namespace {
const char* category(schedule::ActionKind k) {
  using schedule::ActionKind;
  switch (k) {
    case ActionKind::forward: return "forward";
    case ActionKind::backward: return "backward";
    case ActionKind::send_act:
    case ActionKind::send_grad: return "send";
    case ActionKind::recv_act:
    case ActionKind::recv_grad: return "recv";
    case ActionKind::allreduce: return "allreduce";
    case ActionKind::optimizer_step: return "optimizer";
  }
  return "other";
}
}  // namespace

Json chrome_trace(const plan::Plan& p, const SimResult& r) {
  Json events = Json::array();
  std::set<int> used;
  for (const plan::Stage& st : p.stages) {
    for (int d : st.devices) {
      used.insert(d);
      events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", d}, {"tid", 0},
                        {"args", {{"name", fmt::format("device {}: stage {}", d, st.id)}}}});
      events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", d}, {"tid", 0},
                        {"args", {{"sort_index", d}}}});
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", d}, {"tid", 0},
                        {"args", {{"name", "compute"}}}});
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", d}, {"tid", 1},
                        {"args", {{"name", "send"}}}});
    }
  }
  for (const Event& e : r.events) {
    Json args = {{"stage", e.stage}, {"action", e.action}};
    if (e.micro_batch >= 0) args["micro_batch"] = e.micro_batch;
    events.push_back({{"ph", "X"},
                      {"name", e.name},
                      {"cat", category(e.kind)},
                      {"pid", e.device},
                      {"tid", e.track},
                      {"ts", e.start_s * 1e6},
                      {"dur", (e.end_s - e.start_s) * 1e6},
                      {"args", std::move(args)}});
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"format", "graphpipe.trace/1"},
            {"source", "simulator"},
            {"iteration_time_s", r.iteration_time_s},
            {"bubble_fraction", r.bubble_fraction}}}};
}

}  // namespace gp::sim
